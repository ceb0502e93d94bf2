"""Where a run stands (step, data order and position, history) and its checkpoint/resume glue.

Why together: everything here is exactly what a checkpoint must carry for ``resume=`` to continue
the same run - the task order is reshuffled per epoch from the seed, so the position in it and
the epoch are enough to draw the same tasks again. ``checkpoint.py`` does the atomic writing.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentrl.train.checkpoint import checkpoint_dir, load_checkpoint, prune_checkpoints, resolve_resume, save_checkpoint


@dataclass
class TrainState:
    """Progress of one run. ``history``: one small record per step (reward, accuracy, eval) for the curve."""

    seed: int
    order: list[int]
    step: int = 0
    data_pos: int = 0
    epoch: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    curriculum: dict[str, Any] | None = None  # the curriculum's draw state (agentrl.train.curriculum), when one is on

    @classmethod
    def start(cls, num_tasks: int, seed: int) -> TrainState:
        order = list(range(num_tasks))
        random.Random(seed).shuffle(order)
        return cls(seed=seed, order=order)

    def next_tasks(self, data: Any, n: int) -> list[dict[str, Any]]:
        """The next ``n`` task rows of ``data`` in this run's order; a new epoch reshuffles, reproducibly."""
        out = []
        for _ in range(n):
            if self.data_pos >= len(self.order):
                self.data_pos = 0
                self.epoch += 1
                random.Random(self.seed + self.epoch).shuffle(self.order)
            out.append(dict(data[self.order[self.data_pos]]))
            self.data_pos += 1
        return out

    def to_dict(self, policy_kind: str, world_size: int = 1) -> dict[str, Any]:
        state = asdict(self)
        state.pop("seed")
        return {**state, "policy_kind": policy_kind, "world_size": world_size}


def save_run(
    run_dir: Path, state: TrainState, policy_kind: str, model: Any, tokenizer: Any, optimizer: Any, scheduler: Any, keep: int | None, world_size: int = 1,
    base_model: str | None = None,
) -> Path:
    """Checkpoint the run at its current step, keeping the newest ``keep`` checkpoints (``base_model``:
    an adapter's base as given, recorded in the checkpoint)."""
    path = checkpoint_dir(run_dir, state.step)
    save_checkpoint(path, model, tokenizer, optimizer, scheduler, state.to_dict(policy_kind, world_size), base_model=base_model)
    prune_checkpoints(run_dir, keep)  # this run's own checkpoints, by step number (never another run's)
    return path


def resume_run(resume: str, run_dir: Path, state: TrainState, model: Any, optimizer: Any, scheduler: Any) -> tuple[Path, int]:
    """Load the checkpoint ``resume`` names into the model, optimizer, scheduler, RNG and ``state``;
    returns its folder and the number of processes that wrote it.

    Any world size may resume any checkpoint: the generation batch, the data order and the
    optimizer state are global (every rank holds the same), so the run continues as it would have
    at the old size, up to float noise in the rollouts (docs/distributed.md)."""
    path = resolve_resume(resume, run_dir)
    saved = load_checkpoint(path, model, optimizer, scheduler)
    state.step, state.data_pos, state.epoch = saved["step"], saved["data_pos"], saved["epoch"]
    state.order, state.history = saved["order"], saved["history"]
    state.curriculum = saved.get("curriculum")
    return path, int(saved.get("world_size", 1))
