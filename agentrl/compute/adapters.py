"""LoRA as users bring it: ``peft.LoraConfig`` objects as plain data, QLoRA, and adapter folders whose base can move.

Why here: a run's config.json must describe the adapter completely (every ``LoraConfig`` field a
user set, not only agentrl's four), in JSON, so ``resume=`` and a reader see what was trained; and
an adapter folder written by agentrl must still find its base model after the run folder (or the
base folder) moved. ``adapter_config.json`` keeps peft's own absolute ``base_model_name_or_path``
(what transformers, peft and vLLM read); ``base_model.json`` beside it records the base as the user
gave it: ``default``, a hub id, or a path relative to the adapter folder where the base was given as
a relative path or lies inside the run folder. ``adapter_base`` reads both, checks the folder exists
and otherwise fails with one line naming the missing base and the key (``model.base``) that points
at its new location.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
from pathlib import Path
from typing import Any

from agentrl.core.errors import ConfigError

BASE_FILE = "base_model.json"
ADAPTER_CONFIG = "adapter_config.json"
BASE_KEY = "model.base"

# LoraConfig fields that peft fills in itself or that agentrl sets: never user settings of a run
NOT_SETTINGS = frozenset({"task_type", "peft_type", "auto_mapping", "peft_version", "base_model_name_or_path", "revision", "inference_mode", "runtime_config"})
ALWAYS = ("r", "lora_alpha", "lora_dropout", "target_modules")  # recorded even at peft's defaults: agentrl's defaults differ


def lora_field_names() -> frozenset[str]:
    """The ``peft.LoraConfig`` fields a run may set (``peft.<field>`` on the command line)."""
    from peft import LoraConfig

    return frozenset(f.name for f in dataclasses.fields(LoraConfig)) - NOT_SETTINGS


def plain(value: Any, name: str) -> Any:
    """``value`` as JSON data (sets as sorted lists, enums as their value), or a ConfigError naming the field."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(plain(v, name) for v in value)
    if isinstance(value, (list, tuple)):
        return [plain(v, name) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v, name) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value), name)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ConfigError(f"peft.{name}: {type(value).__name__} is not plain data (numbers, strings, lists, dicts); a run's config.json could not record it")


def lora_settings(config: Any) -> dict[str, Any]:
    """A ``peft.LoraConfig`` as the ``peft`` section's plain data: every field that differs from
    peft's default, and always ``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules`` (so the
    object's values win over agentrl's own defaults for them)."""
    from peft import LoraConfig, PeftConfig

    if not isinstance(config, LoraConfig):
        kind = type(config).__name__ if isinstance(config, PeftConfig) else f"a {type(config).__name__}"
        raise ConfigError(f"peft: {kind} is not supported; give a peft.LoraConfig, a dict of its fields, or peft.* keys")
    task = getattr(config.task_type, "value", config.task_type)
    if task not in (None, "CAUSAL_LM"):
        raise ConfigError(f"peft: LoraConfig(task_type={task!r}); agentrl trains causal LMs: use task_type='CAUSAL_LM' (or leave it unset)")
    default = LoraConfig()
    out: dict[str, Any] = {}
    for name in sorted(lora_field_names()):
        value = getattr(config, name)
        if name in ALWAYS or plain(value, name) != plain(getattr(default, name), name):
            out[name] = plain(value, name)
    return out


def lora_config(settings: dict[str, Any]) -> Any:
    """The ``peft.LoraConfig`` of a ``peft`` section's fields (agentrl's own ``load_in_4bit`` left out)."""
    from peft import LoraConfig

    fields = {k: v for k, v in settings.items() if k != "load_in_4bit"}
    return LoraConfig(task_type="CAUSAL_LM", **fields)


def check_quantization() -> None:
    """QLoRA's 4-bit base needs CUDA and a working bitsandbytes: say so before any model loads."""
    import torch

    why = ""
    if not torch.cuda.is_available():
        why = "no CUDA device here"
    else:
        try:
            import bitsandbytes  # noqa: F401
        except Exception as exc:  # an ImportError, or a broken native library
            why = f"bitsandbytes does not load ({type(exc).__name__}: {exc})"
    if why:
        raise ConfigError(f"peft.load_in_4bit=true (QLoRA) needs CUDA and bitsandbytes: {why}; drop load_in_4bit for a bf16 base")


def quantization_config(compute_dtype: Any) -> Any:
    """QLoRA's base: NF4 weights, double quantization, computing in ``compute_dtype``."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute_dtype)


# -- where an adapter's base model is ------------------------------------------------------------


def record_base(folder: Path, given: str, run_dir: Path | None = None) -> None:
    """Write ``base_model.json`` into adapter folder ``folder`` and point ``adapter_config.json`` at
    the base's absolute location (what other tools read).

    ``given``: the base as the user gave it. A local folder given as a relative path, or inside
    ``run_dir``, is recorded relative to ``folder`` (it moves with the run); an absolute path
    outside the run stays absolute; ``default`` and hub ids are kept as they are.
    """
    from agentrl.compute.models import resolve_model

    folder = Path(folder)
    record: dict[str, Any] = {"given": given}
    location = resolve_model(given)
    local = Path(location)
    if given != "default" and (local / "config.json").is_file():
        local = local.resolve()
        inside = run_dir is not None and local.is_relative_to(Path(run_dir).resolve())
        if inside or not Path(given).is_absolute():
            record["relative_path"] = os.path.relpath(local, folder.resolve())
        else:
            record["path"] = str(local)
        location = str(local)
    elif given != "default":
        record["hub_id"] = given
    (folder / BASE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    config_file = folder / ADAPTER_CONFIG
    if config_file.is_file():
        config = json.loads(config_file.read_text())
        config["base_model_name_or_path"] = location
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def recorded_base(folder: Path) -> str:
    """The base of adapter folder ``folder`` as first given (``base_model.json``; else peft's own record)."""
    try:
        return str(json.loads((Path(folder) / BASE_FILE).read_text())["given"])
    except (OSError, ValueError, KeyError, TypeError):
        return str(json.loads((Path(folder) / ADAPTER_CONFIG).read_text())["base_model_name_or_path"])


def adapter_base(folder: str | Path, override: str | None = None) -> str:
    """Where adapter folder ``folder``'s base model is now: ``override`` (``model.base``) if given,
    else the recorded location that exists, else one line naming the missing base and the key."""
    from agentrl.compute.models import resolve_model

    folder = Path(folder)
    if override:
        where = resolve_model(override)
        if _looks_local(override) and not (Path(where) / "config.json").is_file():
            raise ConfigError(f"{BASE_KEY}={override}: no model folder there (no config.json)")
        return where
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    peft_base = config.get("base_model_name_or_path")
    try:
        record = json.loads((folder / BASE_FILE).read_text())
    except (OSError, ValueError):
        record = None
    if isinstance(record, dict):
        if record.get("given") == "default":
            return resolve_model("default")
        if "hub_id" in record:
            return str(record["hub_id"])
        candidates = [folder / record["relative_path"] if "relative_path" in record else Path(str(record.get("path")))]
        given = str(record.get("given"))
    else:  # an adapter from elsewhere: only peft's record; a hub id cannot be checked offline
        if not peft_base or not _looks_local(peft_base):
            return resolve_model(peft_base) if peft_base else _missing(folder, "(none recorded)", [])
        candidates, given = [], str(peft_base)
    if peft_base and _looks_local(peft_base):
        candidates.append(Path(peft_base))
    for candidate in candidates:
        if (candidate / "config.json").is_file():
            return str(candidate.resolve())
    return _missing(folder, given, candidates)


def _missing(folder: Path, given: str, looked: list[Path]) -> str:
    at = f" (looked at {', '.join(str(p.resolve()) for p in dict.fromkeys(looked))})" if looked else ""
    raise ConfigError(f"adapter folder {folder}: its base model {given} is not found{at}; pass {BASE_KEY}=<its folder or hub id> to point at where it is now")


def _looks_local(spec: str) -> bool:
    """A path rather than a hub id: absolute, ./ or ../, or more than one slash."""
    return spec.startswith(("/", "./", "../", "~")) or spec.count("/") > 1 or Path(spec).exists()


def merged_model(model: Any) -> Any:
    """A plain transformers model: a copy of PEFT ``model``'s base with its active adapter folded in,
    on the CPU, in the base's dtype (the training module is untouched). A 4-bit base (QLoRA) is
    reloaded in bfloat16 from its recorded location first: merging into NF4 weights would round."""
    import torch

    from agentrl.compute.generation_copy import generation_copy

    if getattr(model, "is_loaded_in_4bit", False) or getattr(model.get_base_model(), "is_loaded_in_4bit", False):
        from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
        from transformers import AutoModelForCausalLM

        from agentrl.compute.models import resolve_model

        config = model.peft_config[model.active_adapter]
        base = AutoModelForCausalLM.from_pretrained(resolve_model(config.base_model_name_or_path), dtype=torch.bfloat16)
        plain_model = get_peft_model(base, config)
        set_peft_model_state_dict(plain_model, {k: v.to("cpu") for k, v in get_peft_model_state_dict(model).items()})
        return plain_model.merge_and_unload().eval()
    return generation_copy(model, device="cpu", merge_adapters=True)


def fold_adapters(model: Any) -> int:
    """Merge every LoRA layer of ``model`` into its base weights in place and put the plain base layer
    back where the LoRA wrapper was; the number of layers folded (0 for a model without adapters).

    Why: ``agentrl eval model=<adapter checkpoint>`` only decodes, and an unmerged adapter costs two
    extra small matrix products and a Python wrapper per linear layer per token (on SmolLM2-135M, 210
    of them; benchmarks/RESULTS.md, issue 47). Merged in the loaded dtype, the logits are the
    adapter's up to float rounding. Only for a model nothing trains afterwards.
    """
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:  # no peft: no adapter can be loaded
        return 0
    wrapped = [(name, m) for name, m in model.named_modules() if isinstance(m, BaseTunerLayer)]
    for name, layer in wrapped:
        layer.merge()
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, layer.get_base_layer())
    if wrapped and hasattr(model, "_hf_peft_config_loaded"):
        model._hf_peft_config_loaded = False  # transformers' adapter methods would look for the wrappers
    return len(wrapped)
