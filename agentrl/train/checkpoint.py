"""Checkpoints that resume exactly: weights (or adapter), optimizer, scheduler, RNG, data position.

A checkpoint is written to a temporary folder and renamed into place, so a crash mid-write never
leaves a half checkpoint that ``resume=latest`` would pick up. Loading never unpickles code: the
weights are safetensors and the trainer state is read with ``torch.load(weights_only=True)``
(tensors and plain Python data only), so a crafted checkpoint folder cannot run anything.

A run folder belongs to one run. ``open_run`` claims it before anything is written: it refuses a
folder that holds another run's outputs unless ``resume=`` continues that run, and on resume it
cuts the logs back to the resumed step and sets aside checkpoints written after it. Every
checkpoint records its run's id, so ``resume=latest`` and pruning only ever see this run's own.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pickle
import random
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch

from agentrl.core.errors import AgentrlError

STATE_FILE = "trainer_state.pt"
META_FILE = "trainer_state.json"
RUN_FILE = "run.json"  # {"run_id": ...}: which run this folder belongs to
LOG_FILES = ("metrics.jsonl", "samples.jsonl")
_STEP_NAME = re.compile(r"step-(\d+)")


class CheckpointError(AgentrlError, RuntimeError):
    """A checkpoint or run folder that cannot be used as asked; the message says why and what to do."""


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:06d}"


def run_id_of(run_dir: Path) -> str | None:
    """The id of the run that owns ``run_dir`` (None for a fresh folder or one from before run ids)."""
    try:
        data = json.loads((Path(run_dir) / RUN_FILE).read_text())
    except (OSError, ValueError):
        return None
    value = data.get("run_id") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def checkpoint_meta(path: Path) -> dict[str, Any]:
    """A checkpoint's ``trainer_state.json`` (step, run id, data position); {} when unreadable."""
    try:
        data = json.loads((Path(path) / META_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def run_checkpoints(run_dir: Path, run_id: str | None = None) -> list[tuple[int, Path]]:
    """Complete checkpoints of ``run_dir`` as (step, path), oldest first, by step number.

    With ``run_id`` (default: the folder's own), only that run's checkpoints; a folder without a
    run id (written before run ids existed) lists every complete checkpoint.
    """
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    run_id = run_id if run_id is not None else run_id_of(run_dir)
    found = []
    for p in root.iterdir():
        m = _STEP_NAME.fullmatch(p.name)
        if not m or not (p / META_FILE).is_file():
            continue
        if run_id is not None and checkpoint_meta(p).get("run_id") != run_id:
            continue  # another run's checkpoint: never loaded, never pruned by this run
        found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> Path | None:
    done = run_checkpoints(run_dir)
    return done[-1][1] if done else None


def resolve_resume(resume: str, run_dir: Path) -> Path:
    """``latest`` → newest complete checkpoint of ``run_dir``'s run; a run folder → its newest; else a checkpoint folder."""
    if resume == "latest":
        found = latest_checkpoint(run_dir)
        if found is None:
            raise FileNotFoundError(f"resume=latest: no checkpoint of this run under {run_dir / 'checkpoints'}")
        return found
    path = Path(resume)
    if (path / META_FILE).is_file():
        return path
    found = latest_checkpoint(path)
    if found is None:
        raise FileNotFoundError(f"resume={resume}: not a checkpoint folder and holds no checkpoints")
    return found


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run's outputs (logs or checkpoints), not just a config."""
    run_dir = Path(run_dir)
    if any((run_dir / name).is_file() and (run_dir / name).stat().st_size > 0 for name in LOG_FILES):
        return True
    root = run_dir / "checkpoints"
    return root.is_dir() and any(_STEP_NAME.fullmatch(p.name) for p in root.iterdir())


def open_run(run_dir: Path, resume: str | None) -> str:
    """Claim ``run_dir`` for this run before anything is written to it; returns the run id.

    Without ``resume``: the folder must be new, empty, or hold no run outputs (a run that failed
    before its first step), else a ``CheckpointError`` says how to continue or start afresh. With
    ``resume``: the checkpoint must belong to the run in ``run_dir`` (or ``run_dir`` must be new);
    ``metrics.jsonl``/``samples.jsonl`` are cut back to the resumed step, so the steps after it are
    not logged twice, and this run's later checkpoints are renamed ``step-N.superseded-K`` (kept,
    but no longer seen by ``resume=latest`` or pruning).
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise CheckpointError(f"output_dir {run_dir} is a file, not a folder")
    owner = run_id_of(run_dir)
    if resume is None:
        if holds_run(run_dir):
            raise CheckpointError(
                f"output_dir {run_dir} already holds a run (its logs or checkpoints); continue it with "
                f"resume=latest, or give a new output_dir (or delete that folder to start over)"
            )
        return _claim(run_dir, uuid.uuid4().hex[:16], resumed_from=None)
    path = resolve_resume(resume, run_dir)
    meta = checkpoint_meta(path)
    step = meta.get("step")
    if not isinstance(step, int) or step < 0:
        raise CheckpointError(f"checkpoint {path}: {META_FILE} has no valid step")
    ckpt_run = meta.get("run_id") if isinstance(meta.get("run_id"), str) else None
    inside = path.resolve().parent == (run_dir / "checkpoints").resolve()
    if not inside and holds_run(run_dir) and (owner is None or owner != ckpt_run):
        raise CheckpointError(
            f"output_dir {run_dir} holds another run than the checkpoint {path}; resume into that "
            f"checkpoint's own run folder or a new output_dir"
        )
    run_id = owner or ckpt_run or uuid.uuid4().hex[:16]
    for later_step, later in run_checkpoints(run_dir, run_id if owner else None):
        if later_step > step and later.resolve() != path.resolve():
            _set_aside(later)
    truncate_logs(run_dir, step)
    return _claim(run_dir, run_id, resumed_from=str(path))


def truncate_logs(run_dir: Path, step: int, names: tuple[str, ...] = LOG_FILES) -> None:
    """Cut ``metrics.jsonl`` and ``samples.jsonl`` back to the records of steps up to ``step``.

    Called on resume: the steps after the resumed checkpoint are run (and logged) again, so their
    first records must go, or every one of them would appear twice. A line that does not parse (a
    crash mid-write) goes too. Streams line by line and replaces each file atomically.
    """
    for name in names:
        path = Path(run_dir) / name
        if not path.is_file():
            continue
        tmp = path.with_name(name + ".tmp")
        with open(path, encoding="utf-8", errors="replace") as src, open(tmp, "w", encoding="utf-8") as dst:
            for line in src:
                try:
                    record_step = json.loads(line).get("step")
                except (ValueError, AttributeError, RecursionError):
                    continue
                if isinstance(record_step, int) and record_step <= step:
                    dst.write(line if line.endswith("\n") else line + "\n")
        os.replace(tmp, path)


def _claim(run_dir: Path, run_id: str, resumed_from: str | None) -> str:
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"run_id": run_id, "opened": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    if resumed_from:
        record["resumed_from"] = resumed_from
    tmp = run_dir / (RUN_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, run_dir / RUN_FILE)
    return run_id


def _set_aside(path: Path) -> None:
    k = 1
    while path.with_name(f"{path.name}.superseded-{k}").exists():
        k += 1
    target = path.with_name(f"{path.name}.superseded-{k}")
    os.replace(path, target)
    print(f"resume: {path.name} was written after the resumed step; kept as {target.name}", flush=True)


def prune_checkpoints(run_dir: Path, keep: int | None) -> list[Path]:
    """Delete this run's checkpoints beyond the newest ``keep`` (by step); never another run's."""
    if not keep:
        return []
    done = run_checkpoints(run_dir)
    removed = [p for _, p in done[:-keep]]
    for p in removed:
        shutil.rmtree(p)
    return removed


def save_checkpoint(
    path: Path,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: dict[str, Any],
    base_model: str | None = None,
) -> Path:
    """Write everything needed to continue; ``state`` holds step, data position and history.

    The run id of the run folder (``open_run``) is recorded with it. An adapter checkpoint records
    its ``base_model`` as given (``base_model.json``: relative to the checkpoint where the base was
    a relative path or inside the run, so it keeps working when the folders move together)."""
    run_id = run_id_of(path.parent.parent)
    if run_id is not None:
        state = {**state, "run_id": run_id}
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    if base_model is not None and (tmp / "adapter_config.json").is_file():
        from agentrl.compute.adapters import record_base

        record_base(tmp, base_model, run_dir=path.parent.parent)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    torch.save(
        {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": rng_state(),
            "state": state,
        },
        tmp / STATE_FILE,
    )
    (tmp / META_FILE).write_text(json.dumps({k: v for k, v in state.items() if k != "history"}, indent=2, default=str) + "\n")
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: Path, model: Any, optimizer: torch.optim.Optimizer, scheduler: Any) -> dict[str, Any]:
    """Restore weights, optimizer, scheduler and RNG in place; return the saved trainer state."""
    from safetensors.torch import load_file

    weights = path / "adapter_model.safetensors"
    if weights.is_file():
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(weights))
    else:
        missing, unexpected = model.load_state_dict(load_file(path / "model.safetensors"), strict=False)
        real_missing = [m for m in missing if not _is_tied(model, m)]
        if real_missing or unexpected:
            raise RuntimeError(f"checkpoint {path} does not match the model: missing {real_missing[:5]}, unexpected {unexpected[:5]}")
    blob = load_state_file(path)
    _check_optimizer_kind(path, blob["optimizer"], optimizer)
    optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    set_rng_state(blob["rng"])
    return blob["state"]


def _check_optimizer_kind(path: Path, saved: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
    """Float32 and 8-bit AdamW moments do not convert into each other: say so instead of failing
    at the first step after the resume with a missing state key."""
    from agentrl.compute.optim.eight_bit import optimizer_kind

    was = optimizer_kind(saved)
    now = getattr(getattr(optimizer, "optimizer", optimizer), "kind", "adamw")  # accelerate wraps it
    if was is not None and was != now:
        where = " (one process or data parallel: distributed.strategy=fsdp keeps float32 moments)" if was == "adamw_8bit" else ""
        raise CheckpointError(f"checkpoint {path}: its optimizer state is {was}'s, and this run builds {now}; resume with optimizer={was}{where}")


def load_state_file(path: Path) -> dict[str, Any]:
    """The trainer-state blob of checkpoint ``path``, read as tensors and plain data only.

    ``weights_only=True``: torch's restricted unpickler, which refuses any class or function it does
    not know to be data, so a crafted file cannot run code on ``resume=``.
    """
    file = Path(path) / STATE_FILE
    if not file.is_file():
        raise CheckpointError(f"checkpoint {path} has no {STATE_FILE}")
    try:
        blob = torch.load(file, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"checkpoint {path}: {STATE_FILE} holds objects other than tensors and plain data, so it is not "
            f"loaded (unpickling it could run code). Only load checkpoints you trust. Detail: {first}"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path}: {STATE_FILE} is unreadable ({type(exc).__name__}: {exc})") from None
    if not isinstance(blob, dict) or not {"optimizer", "scheduler", "rng", "state"} <= set(blob):
        raise CheckpointError(f"checkpoint {path}: {STATE_FILE} is not a trainer state (expected optimizer, scheduler, rng, state)")
    return blob


def _is_tied(model: Any, name: str) -> bool:
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return name in tied or name.endswith("lm_head.weight")


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
