"""The training configuration: strict, validated at load time, every key named in its errors."""

from __future__ import annotations

from typing import Any, Literal

import pydantic
from pydantic import Field

from agentrl.config import GeneratorSettings, ModelSettings, RolloutSettings, SamplingConfig, Strict
from agentrl.losses import LossConfig


# The loss section is the loss module's own config class: one place for each default and bound.
LossSettings = LossConfig


class LoraSettings(Strict):
    r: int = Field(16, ge=1)
    lora_alpha: int = 32
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | str = "all-linear"


class ExtraReward(Strict):
    """A reward function added to the environment's: ``fn="module:function"`` or ``"file.py:function"``."""

    fn: str
    weight: float = 1.0
    name: str | None = None


class TrainConfig(Strict):
    env: str = "calculator"
    env_args: dict[str, Any] = Field(default_factory=dict)
    model: ModelSettings = Field(default_factory=ModelSettings)
    output_dir: str | None = Field(None, description="run folder (default runs/<env>-<time>)")
    seed: int = 0
    resume: str | None = Field(None, description="'latest' (in output_dir), a run folder or a checkpoint folder")

    # batch shape
    max_steps: int = Field(60, ge=1, description="optimizer steps")
    prompts_per_step: int = Field(16, ge=1, description="tasks per optimizer step")
    num_generations: int = Field(8, ge=2, description="episodes per task (the GRPO group)")
    steps_per_generation: int = Field(1, ge=1, description="optimizer steps per generation batch")
    num_iterations: int = Field(1, ge=1, description="passes over each generation batch")
    micro_batch_size: int = Field(16, ge=1, description="sequences per forward/backward")

    # optimisation
    learning_rate: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    adam_betas: tuple[float, float] = (0.9, 0.99)
    optimizer_offload: bool = Field(
        False, description="keep AdamW's two moments in host memory, streamed through the GPU at each step (-8 bytes/parameter of GPU memory, ~16 bytes/parameter of PCIe traffic per step)"
    )
    max_grad_norm: float | None = Field(1.0, gt=0)
    lr_scheduler: Literal["constant", "constant_with_warmup", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    gradient_checkpointing: bool = False
    precision: Literal["auto", "fp32", "bf16"] = Field("auto", description="auto: bf16 on CUDA with bf16, else fp32")
    logprob_chunk_size: int = Field(1024, ge=1)

    # the objective
    loss: LossConfig = Field(default_factory=LossConfig)
    advantage_scale: Literal["group", "batch", "none"] = "group"
    advantage: Literal["episode", "turn"] = Field(
        "episode", description="episode: every token gets its episode's group-relative advantage (GRPO); turn: each turn's tokens get an unbiased per-turn advantage (docs/training.md, per-turn credit)"
    )
    mask_truncated_completions: bool = False
    extra_rewards: list[ExtraReward] = Field(default_factory=list)
    peft: LoraSettings | None = None
    ref_mix_alpha: float | None = Field(None, gt=0, le=1, description="TR-DPO: ref <- a*policy + (1-a)*ref")
    ref_mix_every: int = Field(0, ge=0)

    # generation
    sampling: SamplingConfig = Field(default_factory=lambda: SamplingConfig(temperature=0.7))
    rollout: RolloutSettings = Field(default_factory=lambda: RolloutSettings(max_tokens_per_turn=64, max_completion_tokens=256, max_context=1024))
    generator: GeneratorSettings = Field(default_factory=GeneratorSettings)

    # observability and checkpoints
    log_every: int = Field(1, ge=1)
    samples_per_log: int = Field(2, ge=0, description="trajectories written to samples.jsonl per log step")
    report_to: list[Literal["tensorboard", "wandb", "trackio"]] = Field(default_factory=list)
    eval_every: int = Field(0, ge=0, description="evaluate on the test split every N steps (0: off)")
    eval_tasks: int = Field(64, ge=1)
    eval_temperature: float = Field(0.0, ge=0, description="sampling temperature of the periodic eval (0: greedy)")
    save_every: int = Field(0, ge=0, description="checkpoint every N steps")
    save_final: bool = Field(True, description="checkpoint after the last step")
    keep_checkpoints: int | None = Field(2, ge=1)

    # several processes (torchrun / accelerate launch; docs/distributed.md)
    distributed_timeout_s: float = Field(
        1800.0, gt=0, description="a collective waiting longer than this on a dead or stalled rank fails with an error instead of hanging; it must cover the slowest rank's rollout of one step"
    )

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.sampling.temperature == 0:
            raise ValueError("sampling.temperature: training needs temperature > 0 (greedy groups have no variance)")
        if (self.ref_mix_alpha is None) != (self.ref_mix_every == 0):
            raise ValueError("ref_mix_alpha and ref_mix_every go together (both set, or neither)")
        if self.ref_mix_alpha is not None and (self.loss.beta == 0 or self.peft is not None):
            raise ValueError("ref_mix_alpha mixes a full-model reference: it needs loss.beta > 0 and no peft")
        if self.eval_every == 0 and self.model_fields_set & {"eval_tasks", "eval_temperature"}:
            raise ValueError("eval_tasks/eval_temperature have no effect without eval_every > 0")
        if self.sampling.seed is None:
            self.sampling.seed = self.seed
        return self

