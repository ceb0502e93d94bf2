"""The rollout sections of train and eval configs (episode limits, the model and its chat format,
guidance) and ``agentrl eval``'s config. Plain pydantic: importing this loads no model."""

from __future__ import annotations

import difflib
from typing import Any, Literal

import pydantic
from pydantic import Field

from agentrl.core.strict import Strict
from agentrl.env.config import ENV_ARGS_DOC, ENV_DOC
from agentrl.generators.config import GeneratorConfig, SamplingConfig


class RolloutConfig(Strict):
    """Per-episode limits: the ``rollout`` section of train and eval configs.

    ``max_completion_tokens`` counts sampled plus environment tokens after the prompt;
    ``max_context`` is prompt + completion. The prompt must leave room for at least one token.
    """

    max_turns: int | None = Field(None, ge=1, description="assistant turns (None: the environment's own max_turns)")
    max_tokens_per_turn: int = Field(256, ge=1, description="sampled tokens per assistant turn")
    max_completion_tokens: int = Field(1024, ge=1, description="sampled + environment tokens after the prompt")
    max_context: int = Field(2048, ge=16, description="prompt + completion tokens")
    max_concurrent_episodes: int = Field(256, ge=1, description="episodes in flight at once")
    reward_errors: Literal["raise", "drop"] = Field(
        "raise", description="a reward function that raises: raise stops the run naming the reward; drop leaves that episode out and counts it (rollout/episodes/reward_errors, on the step line)"
    )


class ModelConfig(Strict):
    path: str = Field("default", description="'default' (bundled), a local folder or a hub id")
    chat_format: str | None = Field(None, description="override detection: a name from agentrl.chat.available_formats() (hermes, qwen3, llama3, mistral, gpt_oss, ...; docs/chat_formats.md lists them all)")
    device: str | None = Field(None, description="cpu, cuda, cuda:1 ... (None: cuda when available)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="weights dtype for generation (auto: float32 on CPU, bfloat16 on CUDA)")

    @pydantic.field_validator("chat_format")
    @classmethod
    def _known_format(cls, name: str | None) -> str | None:
        from agentrl.chat import available_formats

        if name is not None and name not in available_formats():
            close = difflib.get_close_matches(name, available_formats(), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(f"unknown chat format {name!r}{hint}; known: {', '.join(available_formats())}")
        return name


class GuidanceConfig(Strict):
    """``guidance.*``: one demonstrated episode per group, kept where it beats every sample."""

    enabled: bool = Field(False, description="play one demonstrated episode per group (the environment's demonstrate()) and train on it where its reward is above every sample's")
    keep: Literal["above_all", "above_mean"] = Field(
        "above_all", description="keep a demonstration whose reward is above every sample's (above_all) or above the group's mean (above_mean: most groups, solved ones too)"
    )
    weight: float = Field(1.0, gt=0, description="multiplies a kept demonstration's advantages (after the group normalisation): how much of each step's update imitates")


class EvalConfig(Strict):
    """``agentrl eval``: pass@k of a model on an environment's split."""

    env: str = Field("calculator", description=ENV_DOC)
    env_args: dict[str, Any] = Field(default_factory=dict, description=ENV_ARGS_DOC)
    model: ModelConfig = Field(default_factory=ModelConfig)
    split: str = Field("test", description="the environment's dataset split")
    n: int | None = Field(None, ge=1, description="tasks to evaluate (None: the whole split)")
    k: int = Field(1, ge=1, description="samples per task")
    seed: int = Field(0, description="environment seed of the first task (task i uses seed + i)")
    pass_threshold: float = Field(1.0, description="an episode passes when its reward >= this")
    output: str | None = Field(None, description="output folder (default outputs/eval-<env>-<time>)")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    generator: GeneratorConfig = Field(default_factory=GeneratorConfig)

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> EvalConfig:
        if self.k > 1 and self.sampling.temperature == 0:
            raise ValueError("k > 1 with sampling.temperature=0 draws the same sample k times; raise the temperature or set k=1")
        return self
