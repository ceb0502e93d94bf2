"""``GRPOConfig``: TRL's argument names, mapped to agentrl's keys or refused with the reason.

A TRL script ports by changing its import; every ``GRPOConfig`` name it sets either has an agentrl
key (``TRL_NAMES`` says which, docs/from_trl.md shows the table) or fails at once with one line
that names the agentrl key to use or says why none exists. Names agentrl does not know get a
did-you-mean over TRL's names and agentrl's own keys, which are accepted too.

Defaults: the names that shape what is learned (learning rate, optimizer betas, schedule, batch
shape, epochs, completion length, sampling, loss) default to TRL 1.16's values, so a script that
relies on them trains the same recipe; the rest (logging, checkpoints, precision, memory) keep
agentrl's defaults, which docs/from_trl.md lists beside TRL's.
"""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass
from typing import Any

from agentrl.core.errors import ConfigError

# TRL 1.16's defaults for the names that shape the recipe (tests/test_trl_port.py checks them against TRL).
TRL_DEFAULTS: dict[str, Any] = {
    "learning_rate": 1e-6, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "weight_decay": 0.0,
    "lr_scheduler_type": "linear", "warmup_steps": 0, "max_grad_norm": 1.0, "num_train_epochs": 3.0, "max_steps": -1,
    "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "num_generations": 8, "steps_per_generation": None,
    "generation_batch_size": None, "num_iterations": 1, "max_completion_length": 512, "temperature": 1.0, "top_p": 1.0,
    "top_k": 0, "min_p": None, "beta": 0.0, "epsilon": 0.2, "epsilon_high": None, "delta": None, "loss_type": "dapo",
    "scale_rewards": "group", "importance_sampling_level": "token", "mask_truncated_completions": False, "seed": 42,
}  # fmt: skip


@dataclass(frozen=True)
class Name:
    """One TRL name: the agentrl key it sets (None: no equivalent) and what to know about it."""

    agentrl: str | None
    note: str


_SAMPLER = "a sampling change the trainer's log-probs do not see would bias the update"
TRL_NAMES: dict[str, Name] = {
    # the run
    "output_dir": Name("output_dir", "same"),
    "seed": Name("seed", "same; also seeds the task order and sampling"),
    "max_steps": Name("max_steps", "same; -1 (TRL's default): from num_train_epochs"),
    "num_train_epochs": Name("max_steps", "ceil(epochs x tasks / prompts_per_step) optimizer steps (agentrl counts steps only)"),
    "logging_steps": Name("log_every", "same (agentrl's default: every step)"),
    "save_steps": Name("save_every", "same (agentrl's default: 0, only the final model)"),
    "save_strategy": Name("save_every", "'steps' uses save_steps; 'no' saves only the final model; 'epoch' is refused"),
    "save_total_limit": Name("keep_checkpoints", "same"),
    "report_to": Name("report_to", "'tensorboard', 'wandb', 'trackio', a list of them, 'none' or 'all' (the three)"),
    "eval_strategy": Name("eval_every", "'steps' uses eval_steps; 'no' is off"),
    "eval_steps": Name("eval_every", "optimizer steps between evaluations on the eval split"),
    "gradient_checkpointing": Name("gradient_checkpointing", "same (TRL's default is on, agentrl's off)"),
    "bf16": Name("precision", "True: precision=bf16; False: fp32; None: auto (bf16 where the GPU has it)"),
    "remove_unused_columns": Name(None, "accepted as False only: agentrl always passes every column to the rewards"),
    # optimizer and schedule
    "learning_rate": Name("learning_rate", "same (TRL's default 1e-6; agentrl's own 1e-4 is for its bundled 3M model)"),
    "weight_decay": Name("weight_decay", "same"),
    "adam_beta1": Name("adam_betas", "the first of adam_betas"),
    "adam_beta2": Name("adam_betas", "the second of adam_betas (TRL's 0.999; agentrl's own 0.99)"),
    "adam_epsilon": Name("adam_eps", "same"),
    "max_grad_norm": Name("max_grad_norm", "same"),
    "lr_scheduler_type": Name("lr_scheduler", "linear, cosine, constant, constant_with_warmup (TRL's default linear; agentrl's constant)"),
    "warmup_steps": Name("warmup_steps", "a value below 1 is a share of max_steps, as in transformers"),
    "warmup_ratio": Name("warmup_steps", "round(ratio x max_steps) warmup steps"),
    "optim": Name("optimizer", "adamw_torch / adamw_torch_fused: adamw; adamw_8bit / paged_adamw_8bit: adamw_8bit"),
    # the batch
    "per_device_train_batch_size": Name("prompts_per_step", "completions per device and micro-step: prompts_per_step = size x accumulation x processes / num_generations"),
    "gradient_accumulation_steps": Name("prompts_per_step", "see per_device_train_batch_size; agentrl splits micro-batches by tokens (micro_batch_tokens)"),
    "num_generations": Name("num_generations", "same (the GRPO group)"),
    "steps_per_generation": Name("steps_per_generation", "TRL counts micro-steps: agentrl's steps_per_generation = this / gradient_accumulation_steps"),
    "generation_batch_size": Name("steps_per_generation", "completions per generation: steps_per_generation = this / (completions per optimizer step)"),
    "num_iterations": Name("num_iterations", "same"),
    "shuffle_dataset": Name(None, "accepted as True only: agentrl always draws tasks in a seeded shuffled order"),
    # generation
    "max_completion_length": Name("rollout.max_completion_tokens", "also the per-turn cap (rollout.max_tokens_per_turn)"),
    "max_prompt_length": Name(None, "prompts are never truncated (a cut prompt is not the one the model answers); rollout.max_context bounds prompt + completion"),
    "temperature": Name("sampling.temperature", "same (TRL's default 1.0; agentrl's own 0.7)"),
    "top_p": Name("sampling.top_p", "same"),
    "top_k": Name("sampling.top_k", "same (0 or None: off)"),
    "min_p": Name("sampling.min_p", "same (None: off)"),
    "repetition_penalty": Name(None, f"accepted as 1.0 only: {_SAMPLER}"),
    "generation_kwargs": Name("sampling", "keys of the sampling section only (temperature, top_p, top_k, min_p, min_tokens, seed)"),
    "chat_template_kwargs": Name(None, "agentrl renders with its chat format (model.chat_format picks one); template arguments are not passed"),
    "max_tool_calling_iterations": Name("rollout.max_turns", "assistant turns per episode"),
    "use_vllm": Name("generator.backend", "True: vllm (vllm_mode='colocate') or vllm-server (vllm_mode='server')"),
    "vllm_mode": Name("generator.backend", "colocate: vllm; server: vllm-server"),
    "vllm_gpu_memory_utilization": Name("generator.gpu_memory_utilization", "same"),
    "vllm_enable_sleep_mode": Name("generator.enable_sleep_mode", "same"),
    "vllm_max_model_length": Name("generator.max_model_len", "same"),
    "vllm_server_base_url": Name("generator.url", "same"),
    "vllm_server_host": Name("generator.url", "with vllm_server_port: http://HOST:PORT"),
    "vllm_server_port": Name("generator.url", "with vllm_server_host"),
    "vllm_server_timeout": Name("generator.timeout_s", "same"),
    "use_transformers_continuous_batching": Name("generator.continuous_batching", "agentrl's own continuous batching on the transformers backend"),
    # the loss
    "loss_type": Name("loss.loss_type", "grpo, bnpo, dr_grpo, dapo, cispo, sapo (agentrl's registry; TRL's default dapo)"),
    "beta": Name("loss.beta", "same (k3 KL to the reference model)"),
    "epsilon": Name("loss.epsilon", "same"),
    "epsilon_high": Name("loss.epsilon_high", "same"),
    "delta": Name("loss.delta", "same"),
    "importance_sampling_level": Name("loss.importance_sampling_level", "same (token, or GSPO's sequence)"),
    "sapo_temperature_pos": Name("loss.sapo_temperature_pos", "same"),
    "sapo_temperature_neg": Name("loss.sapo_temperature_neg", "same"),
    "use_bias_correction_kl": Name("loss.kl_ratio_weighted", "same"),
    "scale_rewards": Name("advantage_scale", "'group'/True: group; 'batch': batch; 'none'/False: none"),
    "mask_truncated_completions": Name("mask_truncated_completions", "same"),
    "reward_weights": Name(None, "the weights of reward_funcs, in order (GRPOTrainer applies them)"),
    "multi_objective_aggregation": Name(None, "accepted as 'sum_then_normalize' only: agentrl sums the weighted rewards, then normalises per group"),
    "sync_ref_model": Name("ref_mix_every", "True: ref_mix_every=ref_model_sync_steps, ref_mix_alpha=ref_model_mixup_alpha (TR-DPO)"),
    "ref_model_mixup_alpha": Name("ref_mix_alpha", "with sync_ref_model"),
    "ref_model_sync_steps": Name("ref_mix_every", "with sync_ref_model"),
    "vllm_importance_sampling_correction": Name("loss.sampler_is_mode", "False: null (off); agentrl corrects for every backend, not only vLLM"),
    "vllm_importance_sampling_mode": Name("loss.sampler_is_mode", "token_truncate, token_mask, sequence_truncate, sequence_mask: loss.sampler_is_level and loss.sampler_is_mode"),
    "vllm_importance_sampling_cap": Name("loss.sampler_is_cap", "same"),
    "vllm_importance_sampling_clip_max": Name("loss.sampler_is_cap", "same"),
    "vllm_importance_sampling_clip_min": Name("loss.sampler_is_min", "same"),
    "log_completions": Name("samples_per_log", "False: 0 samples on the step line; True: agentrl's default (every sample is in the run folder anyway)"),
    "num_completions_to_print": Name("samples_per_log", "same"),
    "model_init_kwargs": Name("model.dtype", "{'dtype': ...} (or torch_dtype) only"),
    # no equivalent
    "push_to_hub": Name(None, "agentrl does not upload: push the final folder with huggingface_hub.upload_folder"),
    "hub_model_id": Name(None, "see push_to_hub"),
    "fp16": Name(None, "float16 training is not supported (bf16 or fp32); precision=bf16"),
    "top_entropy_quantile": Name(None, "accepted as 1.0 only: agentrl trains every sampled token"),
    "entropy_coef": Name(None, "accepted as 0.0 only: no entropy bonus (the loss registry takes a custom loss: docs/losses.md)"),
    "cast_lm_head_to_fp32": Name(None, "the output head's log-probs are computed in float32 always (logprob_chunk_size bounds their memory)"),
    "disable_dropout": Name(None, "accepted as False only: agentrl trains the model as loaded"),
    "num_generations_eval": Name(None, "evaluation samples one episode per task (eval_tasks, eval_temperature)"),
}

_NOT_DEFAULT_ONLY = {  # names accepted only at one value: (value, ...)
    "remove_unused_columns": (False, True), "shuffle_dataset": (True,), "repetition_penalty": (1.0,), "top_entropy_quantile": (1.0,),
    "entropy_coef": (0.0,), "multi_objective_aggregation": ("sum_then_normalize",), "disable_dropout": (False,),
    "cast_lm_head_to_fp32": (False, True), "push_to_hub": (False,), "hub_model_id": (None,), "fp16": (False,),
    "chat_template_kwargs": (None, {}), "max_prompt_length": (None,), "num_generations_eval": (None,),
}  # fmt: skip
_IS_MODES = {"token_truncate": ("truncate", "token"), "token_mask": ("mask", "token"), "sequence_truncate": ("truncate", "sequence"), "sequence_mask": ("mask", "sequence")}
_OPTIMIZERS = {"adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "adamw", "adamw_8bit": "adamw_8bit", "paged_adamw_8bit": "adamw_8bit", "adamw_bnb_8bit": "adamw_8bit"}
_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "min_tokens", "seed")


class GRPOConfig:
    """TRL's ``GRPOConfig`` names (and agentrl's own keys) for :class:`agentrl.trl.GRPOTrainer`.

    ``GRPOConfig(output_dir=..., learning_rate=..., per_device_train_batch_size=..., ...)`` as in
    TRL; agentrl keys are accepted too, dotted or not (``**{"rollout.max_context": 2048}``).
    """

    def __init__(self, **names: Any) -> None:
        from agentrl.train.config import TrainConfig

        own = set(TrainConfig.model_fields)
        for name, value in names.items():
            top = name.split(".")[0]
            if name in TRL_NAMES:
                allowed = _NOT_DEFAULT_ONLY.get(name)
                if TRL_NAMES[name].agentrl is None and allowed is not None and value not in allowed:
                    raise ConfigError(f"GRPOConfig: {name}={value!r} has no agentrl equivalent: {TRL_NAMES[name].note}")
            elif top not in own:
                close = difflib.get_close_matches(name, [*TRL_NAMES, *own], n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"GRPOConfig: unknown argument {name!r}{hint}; docs/from_trl.md lists every TRL name and its agentrl key")
        self.given = dict(names)

    def __getattr__(self, name: str) -> Any:
        given = self.__dict__.get("given", {})
        if name in given:
            return given[name]
        if name in TRL_DEFAULTS:
            return TRL_DEFAULTS[name]
        if name in TRL_NAMES:  # a TRL name the script did not set (``args.output_dir`` after training)
            return None
        raise AttributeError(f"GRPOConfig has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"GRPOConfig({', '.join(f'{k}={v!r}' for k, v in self.given.items())})"

    def get(self, name: str) -> Any:
        return self.given.get(name, TRL_DEFAULTS.get(name))

    def to_keys(self, num_tasks: int | None, world_size: int | None = None) -> dict[str, Any]:
        """The agentrl keys this config sets (dotted), for a train split of ``num_tasks`` tasks."""
        g, keys = self.get, {}
        world = world_size or int(os.environ.get("WORLD_SIZE", "1"))
        for name in ("learning_rate", "weight_decay", "max_grad_norm", "num_iterations", "num_generations", "mask_truncated_completions", "seed"):
            keys[name] = g(name)
        keys["adam_betas"] = (g("adam_beta1"), g("adam_beta2"))
        keys["adam_eps"] = g("adam_epsilon")
        keys["lr_scheduler"] = _one_of("lr_scheduler_type", g("lr_scheduler_type"), ("linear", "cosine", "constant", "constant_with_warmup"))
        # the batch: TRL counts completions per device and micro-step
        per_step = g("per_device_train_batch_size") * g("gradient_accumulation_steps") * world
        if per_step % g("num_generations"):
            raise ConfigError(
                f"GRPOConfig: per_device_train_batch_size x gradient_accumulation_steps x processes = {per_step} completions per step "
                f"is not a multiple of num_generations={g('num_generations')} (TRL requires the same)"
            )
        keys["prompts_per_step"] = per_step // g("num_generations")
        spg = g("steps_per_generation")
        if g("generation_batch_size") is not None:
            if g("generation_batch_size") % per_step:
                raise ConfigError(f"GRPOConfig: generation_batch_size={g('generation_batch_size')} is not a multiple of the {per_step} completions per optimizer step")
            keys["steps_per_generation"] = g("generation_batch_size") // per_step
        elif spg is not None:
            if spg % g("gradient_accumulation_steps"):
                raise ConfigError(f"GRPOConfig: steps_per_generation={spg} (micro-steps) is not a multiple of gradient_accumulation_steps={g('gradient_accumulation_steps')}")
            keys["steps_per_generation"] = spg // g("gradient_accumulation_steps")
        if g("max_steps") is not None and g("max_steps") > 0:
            keys["max_steps"] = int(g("max_steps"))
        elif num_tasks:
            keys["max_steps"] = max(1, math.ceil(g("num_train_epochs") * num_tasks / keys["prompts_per_step"]))
        else:
            raise ConfigError("GRPOConfig: max_steps must be set when the train dataset has no length (TRL requires the same)")
        warm = g("warmup_ratio") if "warmup_ratio" in self.given else g("warmup_steps")
        keys["warmup_steps"] = round(warm * keys["max_steps"]) if 0 < warm < 1 else int(warm)
        # generation
        keys["rollout.max_completion_tokens"] = keys["rollout.max_tokens_per_turn"] = int(g("max_completion_length"))
        keys["sampling.temperature"], keys["sampling.top_p"] = g("temperature"), g("top_p")
        keys["sampling.top_k"], keys["sampling.min_p"] = g("top_k") or 0, g("min_p") or 0.0
        for k, v in (g("generation_kwargs") or {}).items():
            if k not in _SAMPLING_KEYS:
                raise ConfigError(f"GRPOConfig: generation_kwargs[{k!r}] has no agentrl equivalent; only {', '.join(_SAMPLING_KEYS)} (the sampling section)")
            keys[f"sampling.{k}"] = v
        # the loss
        keys["loss.loss_type"] = g("loss_type")
        for name in ("beta", "epsilon", "epsilon_high", "delta", "importance_sampling_level"):
            keys[f"loss.{name}"] = g(name)
        scale = g("scale_rewards")
        keys["advantage_scale"] = {True: "group", False: "none", "group": "group", "batch": "batch", "none": "none"}.get(scale) or _refuse("scale_rewards", scale, "group, batch, none")
        self._optional(keys)
        return keys

    def _optional(self, keys: dict[str, Any]) -> None:
        """Names that set a key only when given (agentrl's default otherwise)."""
        given = self.given
        direct = {
            "output_dir": "output_dir", "logging_steps": "log_every", "save_total_limit": "keep_checkpoints",
            "gradient_checkpointing": "gradient_checkpointing", "max_tool_calling_iterations": "rollout.max_turns",
            "vllm_gpu_memory_utilization": "generator.gpu_memory_utilization", "vllm_enable_sleep_mode": "generator.enable_sleep_mode",
            "vllm_max_model_length": "generator.max_model_len", "vllm_server_base_url": "generator.url", "vllm_server_timeout": "generator.timeout_s",
            "use_transformers_continuous_batching": "generator.continuous_batching", "sapo_temperature_pos": "loss.sapo_temperature_pos",
            "sapo_temperature_neg": "loss.sapo_temperature_neg", "use_bias_correction_kl": "loss.kl_ratio_weighted",
            "vllm_importance_sampling_cap": "loss.sampler_is_cap", "vllm_importance_sampling_clip_max": "loss.sampler_is_cap",
            "vllm_importance_sampling_clip_min": "loss.sampler_is_min", "num_completions_to_print": "samples_per_log",
        }  # fmt: skip
        for name, key in direct.items():
            if name in given and given[name] is not None:
                keys[key] = given[name]
        if "save_strategy" in given or "save_steps" in given:
            strategy = given.get("save_strategy", "steps")
            _one_of("save_strategy", strategy, ("steps", "no"))
            keys["save_every"] = int(given.get("save_steps", 500)) if strategy == "steps" else 0
        if "eval_strategy" in given or "eval_steps" in given:
            strategy = given.get("eval_strategy", "steps")
            _one_of("eval_strategy", strategy, ("steps", "no"))
            keys["eval_every"] = int(given.get("eval_steps") or given.get("logging_steps", 10)) if strategy == "steps" else 0
        if "report_to" in given:
            keys["report_to"] = _trackers(given["report_to"])
        if "bf16" in given:
            keys["precision"] = {True: "bf16", False: "fp32", None: "auto"}[given["bf16"]]
        if "optim" in given:
            keys["optimizer"] = _OPTIMIZERS.get(given["optim"]) or _refuse("optim", given["optim"], ", ".join(_OPTIMIZERS))
        if given.get("use_vllm") or "vllm_mode" in given:
            mode = given.get("vllm_mode", "colocate")
            keys["generator.backend"] = {"colocate": "vllm", "server": "vllm-server"}.get(mode) or _refuse("vllm_mode", mode, "colocate, server")
        if "vllm_server_host" in given or "vllm_server_port" in given:
            keys["generator.url"] = f"http://{given.get('vllm_server_host', '127.0.0.1')}:{given.get('vllm_server_port', 8000)}"
        if given.get("vllm_importance_sampling_correction") is False:
            keys["loss.sampler_is_mode"] = None
        if "vllm_importance_sampling_mode" in given and given.get("vllm_importance_sampling_correction", True):
            mode = given["vllm_importance_sampling_mode"]
            keys["loss.sampler_is_mode"], keys["loss.sampler_is_level"] = _IS_MODES.get(mode) or _refuse("vllm_importance_sampling_mode", mode, ", ".join(_IS_MODES))
        if given.get("log_completions") is False:
            keys["samples_per_log"] = 0
        if given.get("sync_ref_model"):
            keys["ref_mix_every"] = int(given.get("ref_model_sync_steps", 512))
            keys["ref_mix_alpha"] = float(given.get("ref_model_mixup_alpha", 0.6))
        init = given.get("model_init_kwargs") or {}
        extra = sorted(set(init) - {"dtype", "torch_dtype"})
        if extra:
            raise ConfigError(f"GRPOConfig: model_init_kwargs {extra} have no agentrl equivalent; only dtype (model.dtype)")
        if init:
            keys["model.dtype"] = str(init.get("dtype", init.get("torch_dtype"))).removeprefix("torch.")
        for name, value in given.items():  # agentrl's own keys, as given
            if name not in TRL_NAMES:
                keys[name] = value


def _trackers(value: Any) -> list[str]:
    names = [value] if isinstance(value, str) else list(value or [])
    if names in (["none"], []):
        return []
    if names == ["all"]:
        return ["tensorboard", "wandb", "trackio"]
    for n in names:
        _one_of("report_to", n, ("tensorboard", "wandb", "trackio"))
    return names


def _one_of(name: str, value: Any, allowed: tuple[str, ...]) -> Any:
    if value not in allowed:
        _refuse(name, value, ", ".join(allowed))
    return value


def _refuse(name: str, value: Any, allowed: str) -> Any:
    raise ConfigError(f"GRPOConfig: {name}={value!r} is not supported here; one of: {allowed}")


def names_table() -> str:
    """The markdown table of every TRL name, its agentrl key and the note (docs/from_trl.md holds it)."""
    rows = ["| TRL `GRPOConfig` | agentrl | note |", "|---|---|---|"]
    for name, n in TRL_NAMES.items():
        default = f" (TRL default `{TRL_DEFAULTS[name]!r}`)" if name in TRL_DEFAULTS else ""
        rows.append(f"| `{name}` | {f'`{n.agentrl}`' if n.agentrl else 'none'} | {n.note}{default} |")
    return "\n".join(rows)
