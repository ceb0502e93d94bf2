"""The training configuration: strict, validated at load time, every key named in its errors."""

from __future__ import annotations

import difflib
from typing import Any, Literal

import pydantic
from pydantic import ConfigDict, Field

from agentrl.core.sections import section_defaults, under
from agentrl.core.strict import Strict
from agentrl.env.config import ENV_ARGS_DOC, ENV_DOC
from agentrl.generators.config import GeneratorConfig, SamplingConfig
from agentrl.learn.losses import LossConfig
from agentrl.rollout.config import GuidanceConfig, ModelConfig, RolloutConfig

# The loss section is the loss module's own config class: one place for each default and bound.
LossSettings = LossConfig



class CurriculumConfig(Strict):
    """``curriculum.*``: draw tasks by bucket, weighted by how often each bucket's groups still vary."""

    key: str | None = Field(None, description="task field whose values are the buckets, e.g. 'difficulty' (null: off, tasks in the run's shuffled order)")
    floor: float = Field(0.1, ge=0, le=1, description="smallest weight of a bucket, relative to a bucket whose every group varies")
    smoothing: float = Field(0.8, ge=0, lt=1, description="running rate: rate <- smoothing * rate + (1 - smoothing) * (this step's informative share)")


class DynamicSamplingConfig(Strict):
    """``dynamic_sampling.*``: keep only groups whose rewards vary, refilling from further tasks."""

    enabled: bool = Field(False, description="drop groups whose reward std is <= min_std and refill the batch from further tasks (DAPO)")
    max_rounds: int = Field(2, ge=0, description="extra rollout rounds per step to refill the batch; after them the step trains on what it kept")
    min_std: float = Field(0.0, ge=0, description="a group is kept when the std of its episodes' rewards exceeds this")
    max_draw_factor: float = Field(4.0, ge=1, description="a refill round rolls out at most this many tasks per missing group")


class AdapterConfig(Strict):
    """``peft.*``: a new LoRA adapter. Besides the four fields below, every ``peft.LoraConfig`` field is
    taken (``peft.use_rslora=true``, ``peft.modules_to_save=[lm_head]``, ``peft.use_dora=true``...), and
    from Python a ``LoraConfig`` object is taken whole (agentrl/compute/adapters.py); config.json
    records them as plain data."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    r: int = Field(16, ge=1, description="LoRA rank")
    lora_alpha: int = Field(32, description="LoRA scaling numerator (scale = lora_alpha / r)")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the LoRA input")
    target_modules: list[str] | str | None = Field("all-linear", description="module names to adapt, or 'all-linear' (null: peft's choice for the architecture)")
    load_in_4bit: bool = Field(False, description="QLoRA: the base model in 4-bit NF4 through bitsandbytes (CUDA only), computing in model.dtype (auto: bfloat16)")

    @pydantic.model_validator(mode="before")
    @classmethod
    def _lora_config_object(cls, data: Any) -> Any:
        """A ``peft.LoraConfig`` object becomes its fields as plain data (every one the user set)."""
        if type(data).__module__.startswith("peft."):
            from agentrl.compute.adapters import lora_settings

            return lora_settings(data)
        return data

    @pydantic.model_validator(mode="after")
    def _lora_fields(self) -> AdapterConfig:
        extra = self.model_extra or {}
        if extra:
            from agentrl.compute.adapters import lora_field_names, plain

            known = lora_field_names()
            for name, value in extra.items():
                if name not in known:
                    close = difflib.get_close_matches(name, sorted(known | set(type(self).model_fields)), n=1)
                    hint = f" (did you mean peft.{close[0]}?)" if close else ""
                    raise ValueError(f"peft.{name}: unknown key{hint}; peft.* takes r, lora_alpha, lora_dropout, target_modules, load_in_4bit and any peft.LoraConfig field")
                plain(value, name)
        return self

    def lora_fields(self) -> dict[str, Any]:
        """The ``peft.LoraConfig`` keyword arguments of this section."""
        return {k: v for k, v in self.model_dump().items() if k != "load_in_4bit"}


class TrainModelConfig(ModelConfig):
    """``model.*`` of a training run: the generation settings, plus how the policy's base is loaded."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="the policy's base weights (auto: float32 for full fine-tuning, the master weights; under LoRA bfloat16 on CUDA, float32 on CPU); full fine-tuning in bfloat16 updates bf16 weights directly"
    )
    base: str | None = Field(None, description="with an adapter folder as model.path: where its base model is now (default: the one its checkpoint recorded)")


class ExtraRewardConfig(Strict):
    """A reward function added to the environment's: ``fn="module:function"`` or ``"file.py:function"``."""

    fn: str = Field(description="'module:function' or 'file.py:function'")
    weight: float = Field(1.0, description="multiplies the function's value in the total reward")
    name: str | None = Field(None, description="metric name (default: the function's name)")


class DistributedConfig(Strict):
    """How several processes (torchrun / accelerate launch) share the model (docs/distributed.md)."""

    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp", description="ddp: every rank holds the whole model and optimizer; fsdp: FSDP2 shards weights, gradients and AdamW state over the ranks (full fine-tuning of models that do not fit one card)"
    )
    generator_ranks: int = Field(
        0, ge=0, description="disaggregated: this many ranks (the last ones) only generate, with their own generator, and stream trajectory groups to the other ranks, which only train (ddp or fsdp); weights are broadcast to them after every optimizer step (0: every rank generates and trains; docs/distributed.md)"
    )


class WarmStartConfig(Strict):
    """``warm_start.*``: supervised steps on the environment's demonstrations before RL (off by default; agentrl/train/warm_start.py)."""

    steps: int = Field(0, ge=0, description="supervised optimizer steps on demonstrated episodes before the first RL step (0: off; needs an environment with demonstrate())")
    batch_size: int = Field(16, ge=1, description="demonstrated episodes (train tasks) per warm-start step")
    learning_rate: float | None = Field(None, gt=0, description="AdamW learning rate of the warm start, constant (null: learning_rate)")


class TrainConfig(Strict):
    """``agentrl train``: GRPO on an environment (docs/training.md)."""

    env: str = Field("calculator", description=ENV_DOC)
    env_args: dict[str, Any] = Field(default_factory=dict, description=ENV_ARGS_DOC)
    model: TrainModelConfig = Field(default_factory=TrainModelConfig)
    output_dir: str | None = Field(None, description="run folder (default runs/<env>-<time>)")
    seed: int = Field(0, description="seeds torch, task order and sampling (sampling.seed defaults to it)")
    resume: str | None = Field(None, description="'latest' (in output_dir), a run folder or a checkpoint folder")

    # batch shape
    max_steps: int = Field(60, ge=1, description="optimizer steps")
    time_limit_min: float | None = Field(
        None, gt=0, description="stop after the first step that ends past this many minutes of the run's wall time (warm start and evals included), with a checkpoint; resume=latest continues (null: max_steps alone)"
    )
    prompts_per_step: int = Field(16, ge=1, description="tasks per optimizer step")
    num_generations: int = Field(8, ge=2, description="episodes per task (the GRPO group)")
    steps_per_generation: int = Field(1, ge=1, description="optimizer steps per generation batch")
    num_iterations: int = Field(1, ge=1, description="passes over each generation batch")
    micro_batch_size: int = Field(16, ge=1, description="sequences per forward/backward on the padded path (pack_sequences=false, or a model that cannot be packed)")
    pack_sequences: bool = Field(
        True, description="packed micro-batches: sequences back to back up to micro_batch_tokens, no padding between them, an attention that cannot cross them (docs/performance.md, packed micro-batches)"
    )
    share_prompt: bool = Field(True, description="with pack_sequences: the samples that share a prompt (a GRPO group) run it once, each completion attending to it")
    micro_batch_tokens: int = Field(4096, ge=1, description="with pack_sequences: the most tokens one forward/backward computes (a longer sequence runs alone)")

    # optimisation
    learning_rate: float = Field(1e-4, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    adam_betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW (beta1, beta2)")
    adam_eps: float = Field(
        1e-8, gt=0, description="AdamW epsilon; parameters whose gradient is far below it move in proportion to it (SGD-like) instead of by ~learning_rate each (docs/environments.md, Sokoban)"
    )
    optimizer: Literal["auto", "adamw", "adamw_8bit"] = Field(
        "auto", description="adamw: float32 moments; adamw_8bit: bitsandbytes' block-wise 8-bit moments, embeddings at 32 bits (-6 bytes/parameter); auto: adamw_8bit for full fine-tuning on CUDA when bitsandbytes is installed, else adamw (docs/performance.md)"
    )
    optimizer_offload: bool = Field(
        False, description="keep AdamW's two moments in host memory, streamed through the GPU at each step (-8 bytes/parameter of GPU memory, ~16 bytes/parameter of PCIe traffic per step)"
    )
    max_grad_norm: float | None = Field(1.0, gt=0, description="clip the gradient norm to this (null: no clipping)")
    lr_scheduler: Literal["constant", "constant_with_warmup", "linear", "cosine"] = Field("constant", description="learning-rate schedule over max_steps")
    warmup_steps: int = Field(0, ge=0, description="linear warmup steps of the schedule")
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass (less memory, ~30% slower)")
    compile_learner: bool | None = Field(
        None, description="torch.compile the decoder layers and the output head's tiles for the training forward and backward (null: on for full fine-tuning on CUDA, off on CPU, for PEFT and under FSDP2)"
    )
    precision: Literal["auto", "fp32", "bf16"] = Field("auto", description="auto: bf16 on CUDA with bf16, else fp32")
    logprob_chunk_size: int = Field(1024, ge=1, description="tokens per chunk when computing log-probs (bounds the logits' memory)")

    # the objective
    loss: LossConfig = Field(default_factory=LossConfig)
    advantage_scale: Literal["group", "batch", "none"] = Field("group", description="divide advantages by the group's or the batch's reward std, or not")
    advantage: Literal["episode", "turn"] = Field(
        "episode", description="episode: every token gets its episode's group-relative advantage (GRPO); turn: each turn's tokens get an unbiased per-turn advantage (docs/training.md, per-turn credit)"
    )
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig)
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    guidance: GuidanceConfig = Field(default_factory=GuidanceConfig)
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    mask_truncated_completions: bool = Field(False, description="truncated episodes get no gradient")
    extra_rewards: list[ExtraRewardConfig] = Field(default_factory=list, description="reward functions added to the environment's: [{fn: 'mod:f', weight: 1.0}]")
    peft: AdapterConfig | None = Field(None, description="LoRA training (off unless a peft.* key is set)")
    ref_mix_alpha: float | None = Field(None, gt=0, le=1, description="TR-DPO: ref <- a*policy + (1-a)*ref")
    ref_mix_every: int = Field(0, ge=0, description="TR-DPO: mix the reference every N steps (0: off)")

    # generation
    sampling: SamplingConfig = Field(default_factory=lambda: SamplingConfig(temperature=0.7))
    rollout: RolloutConfig = Field(default_factory=lambda: RolloutConfig(max_tokens_per_turn=64, max_completion_tokens=256, max_context=1024))
    generator: GeneratorConfig = Field(default_factory=GeneratorConfig)

    # observability and checkpoints
    log_every: int = Field(1, ge=1, description="write metrics every N steps")
    samples_per_log: int = Field(2, ge=0, description="trajectories written to samples.jsonl per log step")
    report_to: list[Literal["tensorboard", "wandb", "trackio"]] = Field(default_factory=list, description="experiment trackers, e.g. [tensorboard]")
    eval_every: int = Field(0, ge=0, description="evaluate on the test split every N steps (0: off)")
    eval_tasks: int = Field(64, ge=1, description="test tasks per periodic eval")
    eval_temperature: float = Field(0.0, ge=0, description="sampling temperature of the periodic eval (0: greedy)")
    eval_seed: int = Field(10_000_019, description="environment seed of the periodic eval's first test task (task i uses eval_seed + i)")
    save_every: int = Field(0, ge=0, description="checkpoint every N steps")
    save_final: bool = Field(True, description="checkpoint after the last step")
    keep_checkpoints: int | None = Field(2, ge=1, description="newest checkpoints kept (null: all)")

    # several processes (torchrun / accelerate launch; docs/distributed.md)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    max_staleness: int = Field(
        0, ge=0, description="asynchronous rollouts: generate the next steps' episodes while this one trains, from weights at most this many optimizer steps old (0: synchronous; docs/distributed.md)"
    )
    rollout_device: str | None = Field(None, description="with max_staleness > 0: the device of the rollout copy of the policy (default: the training device; e.g. cuda:1)")
    distributed_timeout_s: float = Field(
        1800.0, gt=0, description="a collective waiting longer than this on a dead or stalled rank fails with an error instead of hanging; it must cover the slowest rank's rollout of one step"
    )

    @classmethod
    def layered_defaults(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Under the user's keys: the environment's recommended settings (``Environment.train_defaults``;
        its ``bundled_train_defaults`` too, but only for the bundled model, ``model.path`` "default": a
        pretrained model keeps the global defaults there, docs/training.md), and under those, this
        command's section defaults (a key set in a section keeps the others)."""
        from agentrl.env.registry import train_defaults

        env = data.get("env", "calculator")
        defaults = train_defaults(env)
        if model_path(data) == "default":
            defaults = under(defaults, train_defaults(env, "bundled_train_defaults"))
        return under(section_defaults(cls), defaults)

    @pydantic.field_validator("report_to", mode="before")
    @classmethod
    def _one_tracker(cls, value: Any) -> Any:
        """``report_to="tensorboard"`` (TRL's spelling of one tracker) is ``[tensorboard]``; "none" is none."""
        if isinstance(value, str):
            return [] if value in ("none", "") else [value]
        return value

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.sampling.temperature == 0:
            raise ValueError("sampling.temperature: training needs temperature > 0 (greedy groups have no variance)")
        if (self.ref_mix_alpha is None) != (self.ref_mix_every == 0):
            raise ValueError("ref_mix_alpha and ref_mix_every go together (both set, or neither)")
        if self.ref_mix_alpha is not None and (self.loss.beta == 0 or self.peft is not None):
            raise ValueError("ref_mix_alpha mixes a full-model reference: it needs loss.beta > 0 and no peft")
        if not self.pack_sequences and self.model_fields_set & {"share_prompt", "micro_batch_tokens"}:
            raise ValueError("share_prompt/micro_batch_tokens have no effect with pack_sequences=false (micro_batch_size sets the padded micro-batches)")
        if self.eval_every == 0 and self.model_fields_set & {"eval_tasks", "eval_temperature", "eval_seed"}:
            raise ValueError("eval_tasks/eval_temperature/eval_seed have no effect without eval_every > 0")
        if self.peft is not None and self.peft.load_in_4bit:
            if not self.generator.decodes_the_policy:
                raise ValueError(f"peft.load_in_4bit=true (QLoRA): generator.backend={self.generator.backend} cannot take a 4-bit base's weights; use generator.backend=transformers")
            if self.max_staleness > 0:
                raise ValueError("peft.load_in_4bit=true (QLoRA) with max_staleness > 0: the rollouts-ahead copy of a 4-bit model is not supported; use max_staleness=0")
        if self.distributed.strategy == "fsdp":
            if self.model.dtype not in ("auto", "float32"):
                raise ValueError(f"distributed.strategy=fsdp with model.dtype={self.model.dtype}: FSDP2 shards float32 master weights and computes in bf16 (precision); leave model.dtype=auto")
            if self.peft is not None:
                raise ValueError("distributed.strategy=fsdp shards full fine-tuning; LoRA trains a few parameters: use ddp (the default)")
            if self.loss.beta > 0:
                raise ValueError("distributed.strategy=fsdp: loss.beta > 0 needs a reference model, which is not sharded yet; use loss.beta=0")
            if self.optimizer == "adamw_8bit":
                raise ValueError("distributed.strategy=fsdp: optimizer=adamw_8bit does not take sharded parameters (FSDP already divides AdamW's state by the number of ranks); use optimizer=auto or adamw")
            if self.optimizer_offload:
                raise ValueError("distributed.strategy=fsdp: optimizer_offload is not supported with sharded parameters (FSDP already divides AdamW's state by the number of ranks)")
            if not self.generator.decodes_the_policy:
                raise ValueError("distributed.strategy=fsdp: only generator.backend=transformers decodes from the gathered copy so far")
        if self.warm_start.steps and self.max_staleness > 0:
            raise ValueError("warm_start.steps with max_staleness > 0: the background rollouts would start from the weights before the warm start; run them separately (resume=... max_staleness=N)")
        if self.warm_start.steps and self.distributed.strategy == "fsdp":
            raise ValueError("warm_start.steps with distributed.strategy=fsdp: the warm start's optimizer does not take sharded parameters yet; use ddp")
        if self.optimizer_offload and self.optimizer == "adamw_8bit":
            raise ValueError("optimizer_offload=true streams AdamW's float32 moments from the host; optimizer=adamw_8bit keeps 8-bit moments on the GPU: choose one")
        if self.max_staleness == 0 and self.rollout_device is not None:
            raise ValueError("rollout_device has no effect without max_staleness > 0 (asynchronous rollouts)")
        if self.max_staleness > 0:
            if self.loss.sampler_is_mode is None:
                raise ValueError("max_staleness > 0 trains on episodes of older weights: it needs the sampler importance-sampling correction (loss.sampler_is_mode=truncate or mask)")
            if not self.generator.decodes_the_policy and not self.distributed.generator_ranks:
                raise ValueError("max_staleness > 0: only generator.backend=transformers runs the background rollouts so far")
            if self.distributed.strategy == "fsdp" and not self.distributed.generator_ranks:
                raise ValueError("max_staleness > 0 runs in one process; distributed.strategy=fsdp needs several (or distributed.generator_ranks > 0)")
            if self.dynamic_sampling.enabled:
                raise ValueError("max_staleness > 0 draws its tasks in the background: dynamic_sampling (refill rounds within a step) does not combine with it yet")
        if self.distributed.generator_ranks:
            if self.rollout_device is not None:
                raise ValueError("rollout_device: with distributed.generator_ranks each generator rank decodes on its own device; leave rollout_device unset")
            if self.dynamic_sampling.enabled:
                raise ValueError("distributed.generator_ranks: dynamic_sampling (refill rounds decided by the step's own groups) does not combine with generation on other ranks yet")
            if self.curriculum.key:
                raise ValueError("distributed.generator_ranks: the curriculum draws from the groups it has seen, which stay on the trainer ranks; it does not combine with generation on other ranks yet")
        if self.sampling.seed is None:
            self.sampling.seed = self.seed
        return self


def model_path(data: dict[str, Any]) -> str:
    """``model.path`` of raw config data ("default" when unset)."""
    model = data.get("model")
    if isinstance(model, dict):
        return str(model.get("path", "default"))
    return str(model.path) if isinstance(model, ModelConfig) else "default"


def skipped_bundled_defaults(cfg: TrainConfig) -> dict[str, Any]:
    """The environment's ``bundled_train_defaults`` this run does not use because its model is not
    the bundled one (top-level keys, with the values they would have had), so the trainer can say so."""
    from agentrl.env.registry import train_defaults

    if cfg.model.path == "default":
        return {}
    return {k: v for k, v in train_defaults(cfg.env, "bundled_train_defaults").items() if k not in cfg.model_fields_set}


def _under(defaults: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with ``defaults`` filled in where it sets nothing (nested dicts merged key by key)."""
    out = dict(data)
    for key, value in defaults.items():
        if key not in out:
            out[key] = value
        elif isinstance(value, dict) and isinstance(out[key], dict):
            out[key] = _under(value, out[key])
    return out
