"""Which model a run trains and how its weights load: a folder, hub id or pre-loaded object, in which dtype.

Why apart from the loop: every decision about the policy's weights is made here, from the config
and the objects given, before any run folder or weights exist, so a wrong combination is one line
at once. ``take_model_objects`` turns ``Trainer(model=<PreTrainedModel>, tokenizer=...)`` into its
``name_or_path`` for config.json (never its repr); ``plan_model`` settles the kind (full, new LoRA,
adapter folder), the base weights' dtype and an adapter's base location; ``load_planned`` loads it.

The dtype rule (``model.dtype``): ``auto`` keeps float32 master weights for full fine-tuning, and
under LoRA loads the frozen base in bfloat16 on CUDA (float32 on CPU), the adapter's own weights
staying float32. An explicit dtype is used as asked, except float16 for full fine-tuning (float16
weights need loss scaling, which agentrl does not do). A pre-loaded model trains in its own dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from agentrl.core.strict import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def take_model_objects(keys: dict[str, Any]) -> tuple[dict[str, Any], Any, Any]:
    """``Trainer`` keys with a model object and a tokenizer object taken out: (keys, module, tokenizer).

    The module's ``name_or_path`` becomes ``model.path`` (``default`` for the bundled model); a PEFT
    model's adapter settings become the ``peft`` section, so config.json describes the run."""
    keys = dict(keys)
    tokenizer = keys.pop("tokenizer", None)
    module = keys.get("model")
    if not isinstance(module, torch.nn.Module):
        return keys, None, tokenizer
    del keys["model"]
    if any(k == "model.path" or (k == "model" and isinstance(v, dict) and "path" in v) for k, v in keys.items()):
        raise ConfigError("model: a model object and model.path both given; give one")
    peft_config = getattr(module, "peft_config", None)
    if peft_config:
        if "peft" in keys or any(k.startswith("peft.") for k in keys):
            raise ConfigError("peft: the model given is already a PEFT model with its adapter; drop the peft settings (or give its base model)")
        from agentrl.compute.adapters import lora_settings

        active = getattr(module, "active_adapter", "default")
        keys["peft"] = lora_settings(peft_config[active if isinstance(active, str) else active[0]])
        base = module.get_base_model()
    else:
        base = module
    name = str(getattr(base, "name_or_path", "") or getattr(getattr(base, "config", None), "name_or_path", "") or "")
    if not name:
        raise ConfigError("model: the model object has no name_or_path (a folder or hub id it came from), which config.json and resume need; save it with save_pretrained() and pass that folder, or set model.config.name_or_path")
    keys["model.path"] = _bundled_as_default(name)
    return keys, module, tokenizer


def _bundled_as_default(name: str) -> str:
    from pathlib import Path

    from agentrl.compute.models import bundled_model_path

    try:
        return "default" if Path(name).resolve() == bundled_model_path().resolve() else name
    except (OSError, FileNotFoundError):
        return name


@dataclass
class ModelPlan:
    """What will be loaded: ``path`` (from_pretrained spec), ``kind`` (full, lora, adapter), the base
    weights' ``dtype``, an adapter folder's found ``base`` and the base ``given`` (recorded in
    adapter checkpoints, agentrl/compute/adapters.py), and a pre-loaded ``module``."""

    path: str
    kind: str
    dtype: torch.dtype
    base: str | None
    given_base: str
    module: Any = None


def plan_model(cfg: Any, module: Any = None) -> ModelPlan:
    """Every check on the model settings that needs no weights; ``cfg``: a ``TrainConfig``."""
    from agentrl.compute.adapters import adapter_base, check_quantization
    from agentrl.compute.models import bundled_model_path, resolve_model
    from agentrl.compute.reference import is_adapter_folder

    path = resolve_model(cfg.model.path)
    four_bit = cfg.peft is not None and cfg.peft.load_in_4bit
    if module is not None:
        if four_bit:
            raise ConfigError("peft.load_in_4bit: the model given is already loaded; load it quantized yourself (quantization_config) or pass its folder as model")
        if cfg.model.base:
            raise ConfigError("model.base: only for an adapter folder given as model.path")
        kind = "lora" if cfg.peft is not None or getattr(module, "peft_config", None) else "full"
        return ModelPlan(path, kind, _module_dtype(cfg.model.dtype, module), None, cfg.model.path, module)
    adapter = is_adapter_folder(path)
    if cfg.model.base and not adapter:
        raise ConfigError(f"model.base: only for an adapter folder given as model.path ({cfg.model.path} is not one)")
    if four_bit:
        if adapter:
            raise ConfigError(f"peft.load_in_4bit: model.path={cfg.model.path} is an adapter folder; QLoRA starts a new adapter on a base model")
        check_quantization()
    kind = "adapter" if adapter else ("lora" if cfg.peft is not None else "full")
    dtype = policy_dtype(cfg.model.dtype, kind, cuda=torch.cuda.is_available())
    base, given = None, cfg.model.path
    if adapter:
        base = adapter_base(path, cfg.model.base)
        given = "default" if base == str(bundled_model_path()) else base
    return ModelPlan(path, kind, dtype, base, given)


def policy_dtype(requested: str, kind: str, *, cuda: bool) -> torch.dtype:
    """The base weights' dtype for ``model.dtype=requested`` and a policy of ``kind`` (module docstring)."""
    if requested == "auto":
        if kind == "full":
            return torch.float32
        return torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float32
    if requested == "float16" and kind == "full":
        raise ConfigError("model.dtype=float16 with full fine-tuning: float16 weights need loss scaling, which agentrl does not do; use bfloat16, float32 (the default), or a LoRA adapter (peft.*) over a float16 base")
    return DTYPES[requested]


def _module_dtype(requested: str, module: Any) -> torch.dtype:
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    if requested != "auto" and DTYPES[requested] != dtype:
        raise ConfigError(f"model.dtype={requested}: the model given is {str(dtype).removeprefix('torch.')}; load it in the dtype you want, or leave model.dtype unset")
    return dtype


def load_planned(plan: ModelPlan, cfg: Any, device: str) -> tuple[Any, str]:
    """The policy of ``plan`` on ``device`` and its kind (agentrl.compute.reference.load_policy)."""
    from agentrl.compute.reference import load_policy

    lora = cfg.peft.model_dump() if cfg.peft is not None and not getattr(plan.module, "peft_config", None) else None
    return load_policy(plan.path, plan.dtype, device, lora, base=plan.base, module=plan.module)
