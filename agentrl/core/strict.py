"""The base of every config model, at the bottom of the import layers.

Lower layers (the generator protocol, the rollout engine) define their own user-facing settings
with it, so each concept has one class that both the command line and the code use.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from agentrl.core.errors import ConfigError

__all__ = ["ConfigError", "Strict"]


class Strict(BaseModel):
    """Unknown keys and wrong types are errors; assignments are validated too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
