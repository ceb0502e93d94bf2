"""``resume=`` knows its run: the saved config.json is loaded, and only keys that may change are applied.

Before issue 41, resuming without ``env=`` trained the default environment from another
environment's checkpoint (and overwrote that run's config.json), and resuming a LoRA run without
``peft=`` failed deep in loading. Now a resumed run starts from the configuration it was saved
with; a given key that may change (how long to run, how often to save, log or evaluate, trackers)
is applied on top, and a given key that would change what is trained (environment, model, adapter,
batch shape, loss, ...) is refused with one line naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.core.strict import ConfigError

MAY_CHANGE = frozenset({
    "resume", "output_dir", "max_steps", "time_limit_min", "save_every", "save_final", "keep_checkpoints", "log_every",
    "samples_per_log", "report_to", "eval_every", "eval_tasks", "eval_temperature", "distributed_timeout_s",
})  # fmt: skip


def saved_config(resume: str, output_dir: str | None) -> tuple[Path, dict[str, Any]]:
    """The run folder of the checkpoint ``resume`` names and the config.json saved there."""
    from agentrl.train.checkpoint import resolve_resume
    from agentrl.train.preflight import check_resume

    check_resume(resume, output_dir)  # the same one-line errors as before the config was loaded
    try:
        checkpoint = resolve_resume(resume, Path(output_dir or "."))
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None
    run_dir = checkpoint.parent.parent  # <run>/checkpoints/step-N
    path = run_dir / "config.json"
    if not path.is_file():
        raise ConfigError(f"resume={resume}: {run_dir} has no config.json, so the run's configuration is unknown")
    try:
        return run_dir, json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"resume={resume}: {path} is not valid JSON ({exc.msg})") from None


def resume_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """The keys a resumed run is built from: its saved config (minus values equal to the command's
    defaults, so mode-dependent keys stay unset) with the given keys that may change."""
    from agentrl.core.overrides import build
    from agentrl.train.config import TrainConfig

    resume = overrides.get("resume")
    if not resume:
        return overrides
    run_dir, saved = saved_config(str(resume), overrides.get("output_dir"))
    defaults = json.loads(
        json.dumps(build(TrainConfig, {"env": saved.get("env", "calculator")}).model_dump(), default=str)
    )
    moved: dict[str, Any] = {}
    for key, value in _leaves(overrides):
        top = key.split(".")[0]
        if top in MAY_CHANGE:
            continue
        before = _get(saved, key)
        if key in RELOCATABLE and before != value and (key == "model.base" or not _is_here(before)):
            moved[key] = value  # the same model at a new place: its saved folder is gone from this machine
            continue
        if before != value and json.dumps(before, default=str) != json.dumps(value, default=str):
            raise ConfigError(
                f"resume={resume}: {key}={json.dumps(value, default=str)} differs from the run's {key}={json.dumps(before, default=str)}; "
                f"a resumed run keeps what it trains (only {', '.join(sorted(MAY_CHANGE - {'resume'}))} may change); "
                "start a new run to change it"
            )
    out = _prune(saved, defaults)
    out.update({k: saved[k] for k in ("env", "env_args") if k in saved})  # the defaults were built for this env
    out.update({k: v for k, v in overrides.items() if k in MAY_CHANGE})
    for key, value in moved.items():
        out.setdefault("model", {})[key.split(".", 1)[1]] = value
        print(f"resume: {key} was {_get(saved, key)!r} (not found here), now {value!r}", flush=True)
    out.setdefault("output_dir", str(run_dir))
    return out


# A model's location may change on resume when its saved folder no longer exists here (a moved
# base of a LoRA run; model.base always: it only says where an adapter's base is now).
RELOCATABLE = frozenset({"model.path", "model.base"})


def _is_here(path: Any) -> bool:
    from agentrl.compute.models import DEFAULT_MODEL

    # a name that is not a path (the bundled model, a hub id) has no folder to lose
    return not isinstance(path, str) or path == DEFAULT_MODEL or Path(path).exists() or not path.startswith(("/", "./", "../"))


def _leaves(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for k, v in data.items():
        if isinstance(v, dict) and v and k != "env_args":
            out += _leaves(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", v))
    return out


def _get(data: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def _prune(saved: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``saved`` without the values equal to ``defaults`` (nested sections pruned key by key)."""
    out: dict[str, Any] = {}
    for k, v in saved.items():
        d = defaults.get(k, object())
        if isinstance(v, dict) and isinstance(d, dict) and k != "env_args":
            sub = _prune(v, d)
            if sub:
                out[k] = sub
        elif v != d:
            out[k] = v
    return out
