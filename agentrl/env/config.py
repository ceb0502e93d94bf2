"""The ``agentrl check`` config and the environment keys every command shares."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from agentrl.core.strict import Strict

ENV_DOC = "a registered name (agentrl envs), 'package.module:Class' or 'path/to/file.py:Class'"
ENV_ARGS_DOC = "keyword arguments for the environment's constructor (env_args.name=value)"


class CheckConfig(Strict):
    """``agentrl check``: run check_env on one environment."""

    env: str = Field("calculator", description=ENV_DOC)
    env_args: dict[str, Any] = Field(default_factory=dict, description=ENV_ARGS_DOC)
