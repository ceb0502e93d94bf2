"""Building what a training run needs, in the order that fails cheapest first.

The config from the Python API's keyword keys; the environment, its datasets and the extra
rewards, built and checked before any model loads (a typo in an environment must not cost a model
load); the accelerator and the run folder; then the optimizer and what the policy needs. Every
user mistake becomes one ``ConfigError`` line naming the problem. The trainer calls these in
that order and keeps only its loop.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.util
import json
from pathlib import Path
from typing import Any

import anyio
import torch

from agentrl.compute.parallel.distributed import accelerator_handlers
from agentrl.compute.parallel.strategy import Strategy
from agentrl.core.overrides import build, parse_overrides
from agentrl.core.strict import ConfigError
from agentrl.env.batched import BatchedReward
from agentrl.env.environment import EnvError, Environment, Reward, as_reward
from agentrl.env.registry import UnknownEnvironment, load_object, make
from agentrl.env.reward_check import check_env_rewards
from agentrl.learn.config import LearnerConfig
from agentrl.observe.trackers import flat_hparams
from agentrl.rollout.config import GuidanceConfig
from agentrl.rollout.engine import RolloutEngine
from agentrl.rollout.guidance import GuidedRollouts, has_demonstrations
from agentrl.train.checkpoint import open_run
from agentrl.train.config import TrainConfig
from agentrl.train.resume_config import resume_overrides


def config_from(config: TrainConfig | None, env: str | Environment | None, keys: dict[str, Any]) -> TrainConfig:
    """``config`` with ``keys`` (CLI keys, dotted or nested) applied on top; an instance's class names the run.

    A ``peft.LoraConfig`` object becomes its fields as plain data; a ``torch.dtype`` its name; any other
    object that is not plain data (a path excepted) is refused with its key, never written as its repr."""
    overrides = parse_overrides([f"{k}={json.dumps(_plain_value(k, v), default=_path_only(k))}" for k, v in keys.items()])
    if isinstance(env, Environment):
        if "env_args" in overrides:
            raise ConfigError("env_args: only for an environment given by name; pass the arguments to your Environment instance")
        overrides["env"] = f"{type(env).__module__}:{type(env).__qualname__}"
    elif env is not None:
        overrides["env"] = env
    if config is None:
        return build(TrainConfig, resume_overrides(overrides))
    if not overrides:
        return config
    base = config.model_dump(exclude_unset=True)
    return build(TrainConfig, _merge(base, overrides))


def _plain_value(key: str, value: Any) -> Any:
    if type(value).__module__.startswith("peft."):
        from agentrl.compute.adapters import lora_settings

        return lora_settings(value)
    return value


def _path_only(key: str) -> Any:
    def default(value: Any) -> str:
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, torch.dtype):  # model.dtype=torch.bfloat16
            return str(value).removeprefix("torch.")
        raise ConfigError(f"{key}: a {type(value).__name__} object is not a config value (numbers, strings, lists, dicts, paths)")

    return default


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def start_run(cfg: TrainConfig) -> tuple[Any, Path, bool]:
    """The accelerator, the run folder and whether to compute in bf16 (``precision=auto``: where the
    GPU has it). Rank 0 claims the folder (refusing another run's; on resume, cutting the logs back)
    and writes ``config.json``; trackers start with the config."""
    from accelerate import Accelerator

    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(cfg.output_dir or f"runs/{cfg.env.replace('/', '_').replace(':', '_')}-{stamp}")
    cuda = torch.cuda.is_available()
    bf16 = compute_bf16(cfg)
    _forget_other_precision("bf16" if bf16 else "no")
    # cpu=True without CUDA: under torchrun/accelerate launch that is gloo data parallel (else one process)
    accelerator = Accelerator(
        cpu=not cuda, mixed_precision="bf16" if bf16 else "no", log_with=list(cfg.report_to) or None, project_dir=str(run_dir),
        kwargs_handlers=accelerator_handlers(cfg.distributed_timeout_s),
    )
    if accelerator.is_main_process:  # rank 0 alone writes logs, samples, checkpoints, the curve
        if bf16 and not cuda and not cpu_has_native_bf16():
            print(
                "warning: precision=bf16 on a CPU without native bf16 (no AVX512-BF16 or AMX): torch emulates it, and a matrix "
                "product ran ~36x slower than in fp32 on such a CPU (docs/training.md); precision=auto computes in fp32 here",
                flush=True,
            )
        open_run(run_dir, cfg.resume)
        (run_dir / "config.json").write_text(json.dumps(cfg.model_dump(), indent=2) + "\n")
    if cfg.report_to:
        accelerator.init_trackers("agentrl", config=flat_hparams(json.loads(json.dumps(cfg.model_dump(), default=str))))
    return accelerator, run_dir, bf16


def compute_bf16(cfg: TrainConfig) -> bool:
    """The run's precision rule, one place for the trainer and the generator ranks: ``bf16`` as set;
    ``auto`` is bf16 on a GPU that has it and fp32 on a CPU (bf16 there is a win only where the CPU
    computes it natively, and a different result on every other machine)."""
    cuda = torch.cuda.is_available()
    return cfg.precision == "bf16" or (cfg.precision == "auto" and cuda and torch.cuda.is_bf16_supported())


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN computes bf16 natively on this CPU (AVX512-BF16 or AMX); without it torch emulates
    bf16 matrix products, far slower than fp32."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch without the probe: assume nothing
        return False


def _forget_other_precision(mixed_precision: str) -> None:
    """Let a second run in the same process (a notebook, a test session, a sweep) use another
    precision than the first. accelerate keeps its mixed-precision setting in process-wide state
    and refuses to change it ("AcceleratorState has already been initialized"); that state is
    cleared here, keeping the process group (``PartialState``), so a run under torchrun is untouched."""
    from accelerate.state import AcceleratorState

    shared = AcceleratorState._shared_state
    if shared and str(shared.get("_mixed_precision", mixed_precision)) != mixed_precision:
        AcceleratorState._reset_state(reset_partial_state=False)


def take_reward_objects(keys: dict[str, Any]) -> tuple[dict[str, Any], list[Reward | BatchedReward]]:
    """``Trainer`` keys with the Python objects of ``extra_rewards`` taken out: a ``Reward`` (e.g.
    ``RewardModel(...).as_reward()``), a ``BatchedReward`` or a plain function. They cannot be written
    to config.json, so they stay out of it (give them again on resume); specs (``{fn: "mod:f"}``) stay."""
    specs = keys.get("extra_rewards")
    if not isinstance(specs, list | tuple):
        return keys, []
    objects: list[Reward | BatchedReward] = []
    kept = []
    for spec in specs:
        if isinstance(spec, Reward | BatchedReward):
            objects.append(spec)
        elif callable(spec):
            objects.append(as_reward(spec))
        else:
            kept.append(spec)
    return {**keys, "extra_rewards": kept}, objects


def load_environment(cfg: TrainConfig, env: Environment | None, extra: list[Reward | BatchedReward] = ()) -> tuple[Environment, Any]:  # type: ignore[assignment]
    """The environment (with ``extra_rewards`` and the reward objects ``extra`` added) and its non-empty train split."""
    name = cfg.env
    if env is None:
        try:
            env = make(name, **cfg.env_args)
        except (UnknownEnvironment, ConfigError):
            raise
        except Exception as exc:  # the environment's own constructor failed
            raise ConfigError(f"env={name}: building the environment failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(env, Environment):
        raise ConfigError(f"env={name}: expected an agentrl Environment, got {type(env).__name__}")
    try:
        env = env.with_rewards([*(_load_reward(r) for r in cfg.extra_rewards), *extra])
    except EnvError as exc:
        raise ConfigError(f"extra_rewards: {exc}") from None
    if cfg.guidance.enabled and not has_demonstrations(env):
        raise ConfigError(f"guidance.enabled: env={name} ({type(env).__name__}) has no demonstrations; it must implement demonstrate() (agentrl/rollout/guidance.py)")
    if cfg.warm_start.steps and not has_demonstrations(env):
        raise ConfigError(f"warm_start.steps: env={name} ({type(env).__name__}) has no demonstrations; it must implement demonstrate() (agentrl/train/warm_start.py)")
    train = _split(env, name, "train")
    anyio.run(check_env_rewards, env, dict(train[0]))  # a reward's wrong argument costs seconds, not a model load
    if cfg.eval_every:
        _split(env, name, "test")
    return env, train


def _split(env: Environment, name: str, split: str) -> Any:
    """``env.dataset(split)``, which must exist and hold at least one task."""
    try:
        data = env.dataset(split)
        size = len(data)
    except Exception as exc:  # noqa: BLE001 - any failure to load it is the environment's problem
        raise ConfigError(f"env={name}: cannot load the {split!r} split: {type(exc).__name__}: {exc}") from None
    if size == 0:
        raise ConfigError(f"env={name}: the {split!r} split is empty; training needs at least one task")
    return data


def _load_reward(spec: Any) -> Reward:
    try:
        fn = load_object(spec.fn)
        if isinstance(fn, Reward | BatchedReward):  # e.g. RewardModel(...).as_reward() or JudgeReward(...).as_reward() in a file
            weight = spec.weight if "weight" in spec.model_fields_set else fn.weight
            return dataclasses.replace(fn, weight=weight, name=spec.name or fn.name)
        return dataclasses.replace(as_reward((fn, spec.weight)), name=spec.name or getattr(fn, "__name__", spec.fn))  # TRL's batched signature: once per group
    except (UnknownEnvironment, TypeError, ValueError) as exc:
        raise ConfigError(f"extra_rewards: {spec.fn}: {exc}") from None


def check_trackers(names: list[str]) -> None:
    """Asked-for trackers must be installed: fail at start-up, not after the first step."""
    modules = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",), "trackio": ("trackio",)}
    for name in names:
        if not any(importlib.util.find_spec(m) for m in modules[name]):
            raise ConfigError(f"report_to: {name} is not installed (pip install {modules[name][0]})")


def build_optimizer(
    cfg: TrainConfig, policy: Any, cuda: bool, strategy: Strategy | None = None, *, full_finetune: bool = True
) -> tuple[torch.optim.Optimizer, Any, str]:
    """AdamW over the trainable parameters (8-bit moments, host-offloaded moments or plain), the LR
    schedule, and one line saying which AdamW ``optimizer=auto`` chose ('' when nothing to say)."""
    from transformers import get_scheduler

    from agentrl.compute.optim.eight_bit import adamw_8bit, choose_optimizer

    params = [p for p in policy.parameters() if p.requires_grad]
    hyper = {"lr": cfg.learning_rate, "weight_decay": cfg.weight_decay, "betas": cfg.adam_betas, "eps": cfg.adam_eps}
    takes_8bit = strategy is None or strategy.takes_8bit_moments
    name, line = choose_optimizer(cfg.optimizer, offload=cfg.optimizer_offload, cuda=cuda, full_finetune=full_finetune, takes_8bit=takes_8bit)
    optimizer: torch.optim.Optimizer | None = None
    if cfg.optimizer_offload:  # the moments on the host: same AdamW arithmetic (agentrl/compute/optim/offload.py)
        from agentrl.compute.optim.offload import OffloadedAdamW

        optimizer = OffloadedAdamW(params, **hyper)
    elif name == "adamw_8bit":  # 2 bytes of moments per parameter instead of 8 (agentrl/compute/optim/eight_bit.py)
        try:
            optimizer = adamw_8bit(policy, params, **hyper)
        except ImportError as exc:
            if cfg.optimizer == "adamw_8bit":
                raise ConfigError(str(exc)) from None
            line = f"optimizer: AdamW with float32 moments; bitsandbytes did not load ({exc})"
    if optimizer is None:  # fused: one kernel for the whole update on CUDA (same math as the default implementation)
        optimizer = torch.optim.AdamW(params, **hyper, fused=cuda or None)
    scheduler = get_scheduler(cfg.lr_scheduler, optimizer, num_warmup_steps=cfg.warmup_steps, num_training_steps=cfg.max_steps)
    return optimizer, scheduler, line


def enable_gradient_checkpointing(policy: Any) -> None:
    # Saving/restoring the CUDA RNG state around every layer syncs the device each time
    # (H200, 0.5B model, 64 x ~300 tokens: train phase 2.0 s with it, 0.79 s without);
    # it only matters when the recomputed forward draws dropout masks.
    kwargs = {"use_reentrant": False, "preserve_rng_state": _uses_dropout(policy)}
    if hasattr(policy, "activation_checkpointing_enable"):  # transformers >= 5.24; the old name warns there, removed in v6
        policy.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if hasattr(policy, "enable_input_require_grads"):
        policy.enable_input_require_grads()


def _uses_dropout(model: torch.nn.Module) -> bool:
    """Whether any dropout is active in training (a module with p > 0, or a config dropout > 0)."""
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    values = vars(config).items() if config is not None else ()
    return any("dropout" in k and isinstance(v, (int, float)) and v > 0 for k, v in values)


def generation_base(path: str, kind: str, base: str | None = None) -> str:
    """The checkpoint a separate generator loads: the policy's, or an adapter's base model
    (``base``: where it was found; default: its recorded location, agentrl/compute/adapters.py)."""
    if kind != "adapter":
        return path
    from agentrl.compute.adapters import adapter_base

    return base or adapter_base(path)


def peak_memory_gib() -> float | None:
    """Peak CUDA memory allocated since the last call (then reset), so each phase reports its own."""
    if not torch.cuda.is_available():
        return None
    peak = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    return peak


def learner_config(cfg: TrainConfig) -> LearnerConfig:
    """The learner's section, from the top-level keys of ``agentrl train`` that set it."""
    return LearnerConfig(
        micro_batch_size=cfg.micro_batch_size, num_iterations=cfg.num_iterations, steps_per_generation=cfg.steps_per_generation,
        temperature=cfg.sampling.temperature, logprob_chunk_size=cfg.logprob_chunk_size, max_grad_norm=cfg.max_grad_norm,
        mask_truncated_completions=cfg.mask_truncated_completions, ref_mix_alpha=cfg.ref_mix_alpha, ref_mix_every=cfg.ref_mix_every,
        max_completion_tokens=cfg.rollout.max_completion_tokens, pack_sequences=cfg.pack_sequences, share_prompt=cfg.share_prompt,
        micro_batch_tokens=cfg.micro_batch_tokens,
    )


def with_guidance(engine: RolloutEngine, guidance: GuidanceConfig) -> RolloutEngine | GuidedRollouts:
    """The training rollouts: ``engine`` itself, or with guidance's demonstrated episode in every group."""
    return GuidedRollouts(engine, guidance.keep) if guidance.enabled else engine

