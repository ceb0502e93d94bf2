"""Checkpoints that resume exactly: weights (or adapter), optimizer, scheduler, RNG, data position.

A checkpoint is written to a temporary folder and renamed into place, so a crash mid-write never
leaves a half checkpoint that ``resume=latest`` would pick up.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trainer_state.pt"
META_FILE = "trainer_state.json"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:06d}"


def latest_checkpoint(run_dir: Path) -> Path | None:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return None
    done = sorted(p for p in root.iterdir() if p.name.startswith("step-") and (p / META_FILE).is_file())
    return done[-1] if done else None


def resolve_resume(resume: str, run_dir: Path) -> Path:
    """``latest`` → newest complete checkpoint of ``run_dir``; a run folder → its newest; else a checkpoint folder."""
    if resume == "latest":
        found = latest_checkpoint(run_dir)
        if found is None:
            raise FileNotFoundError(f"resume=latest: no checkpoint under {run_dir / 'checkpoints'}")
        return found
    path = Path(resume)
    if (path / META_FILE).is_file():
        return path
    found = latest_checkpoint(path)
    if found is None:
        raise FileNotFoundError(f"resume={resume}: not a checkpoint folder and holds no checkpoints")
    return found


def save_checkpoint(
    path: Path,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: dict[str, Any],
) -> Path:
    """Write everything needed to continue; ``state`` holds step, data position and history."""
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
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
    blob = torch.load(path / STATE_FILE, weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    set_rng_state(blob["rng"])
    return blob["state"]


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
