"""Online difficulty-weighted task sampling: draw more tasks from the buckets that still teach something.

Why: GRPO learns only from groups whose rewards vary. Tasks the policy always solves or never
solves give zero advantage, and which tasks those are changes as it learns. The trainer already
sees every group's rewards, so each bucket of tasks (the values of one task field, for example the
calculator's ``difficulty``) keeps a running rate of *informative* groups (rewards that vary), and
tasks are drawn from the buckets in proportion to that rate, with a floor so that no bucket is
ever starved and a bucket that becomes learnable is noticed. Unseen buckets start at rate 1.

Within a bucket, tasks come in a seeded shuffled order, reshuffled when the bucket is used up,
so a run is reproducible and its position is part of the checkpoint (``state_dict``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from agentrl.core.strict import ConfigError
from agentrl.train.config import CurriculumConfig


class Curriculum:
    """Draws task rows from ``data`` bucket by bucket; ``update`` learns the buckets' informative rates."""

    def __init__(self, data: Any, settings: CurriculumConfig, seed: int) -> None:
        key = settings.key
        if key is None:
            raise ValueError("Curriculum needs settings.key")
        columns = getattr(data, "column_names", None) or (list(data[0]) if len(data) else [])
        if key not in columns:
            raise ConfigError(f"curriculum.key: the tasks have no field {key!r} (they have {sorted(columns)})")
        values = data[key] if hasattr(data, "column_names") else [row[key] for row in data]
        self.data, self.settings = data, settings
        self.buckets: dict[str, list[int]] = {}
        for index, value in enumerate(values):
            self.buckets.setdefault(_name(value), []).append(index)
        self.names = sorted(self.buckets, key=_sort_key)
        self.rng = random.Random(seed)
        self.pos = {b: 0 for b in self.names}
        self.epoch = {b: 0 for b in self.names}
        self.rate = {b: 1.0 for b in self.names}
        self.seen = {b: 0 for b in self.names}
        for b in self.names:
            random.Random(f"{seed}:{b}:0").shuffle(self.buckets[b])

    def weights(self) -> dict[str, float]:
        """Each bucket's drawing probability."""
        raw = {b: max(self.settings.floor, self.rate[b]) for b in self.names}
        total = sum(raw.values())
        return {b: w / total for b, w in raw.items()}

    def next_tasks(self, n: int) -> list[dict[str, Any]]:
        """``n`` task rows: a bucket drawn by weight, then that bucket's next task."""
        weights = self.weights()
        out = []
        for bucket in self.rng.choices(self.names, weights=[weights[b] for b in self.names], k=n):
            order = self.buckets[bucket]
            if self.pos[bucket] >= len(order):
                self.pos[bucket] = 0
                self.epoch[bucket] += 1
                random.Random(f"{self.rng.random()}:{bucket}:{self.epoch[bucket]}").shuffle(order)
            out.append(dict(self.data[order[self.pos[bucket]]]))
            self.pos[bucket] += 1
        return out

    def update(self, groups: Sequence[Any], informative: Any) -> None:
        """Fold one step's groups into the buckets' rates; ``informative(group) -> bool``."""
        self.update_flags(self.flags(groups, informative))

    def flags(self, groups: Sequence[Any], informative: Any) -> dict[str, list[int]]:
        """Per bucket, whether each of these groups was informative (1) or not (0): what ``update_flags`` folds in."""
        counts: dict[str, list[int]] = {}
        for group in groups:
            bucket = _name(group.task.get(self.settings.key))
            if bucket in self.rate:
                counts.setdefault(bucket, []).append(int(bool(informative(group))))
        return counts

    def update_flags(self, counts: dict[str, list[int]]) -> None:
        """Fold one generation batch's flags (``flags``) into the buckets' running rates."""
        s = self.settings.smoothing
        for bucket, flags in counts.items():
            share = sum(flags) / len(flags)
            self.rate[bucket] = share if self.seen[bucket] == 0 else s * self.rate[bucket] + (1 - s) * share
            self.seen[bucket] += len(flags)

    def metrics(self) -> dict[str, float]:
        weights = self.weights()
        out: dict[str, float] = {}
        for b in self.names:
            out[f"curriculum/{self.settings.key}={b}/weight"] = weights[b]
            out[f"curriculum/{self.settings.key}={b}/informative_rate"] = self.rate[b]
        return out

    def clone(self) -> Curriculum:
        """An independent copy at the same position (sharing the read-only task data)."""
        twin = Curriculum(self.data, self.settings, 0)
        twin.load_state_dict(self.state_dict())
        return twin

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold to continue drawing the same tasks."""
        return {"pos": dict(self.pos), "epoch": dict(self.epoch), "rate": dict(self.rate), "seen": dict(self.seen),
                "orders": {b: list(o) for b, o in self.buckets.items()}, "rng": _jsonable_state(self.rng.getstate())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if sorted(state["orders"]) != sorted(self.buckets):
            raise ValueError(f"curriculum: the checkpoint's buckets {sorted(state['orders'])} are not this dataset's {sorted(self.buckets)}")
        self.pos, self.epoch, self.rate, self.seen = dict(state["pos"]), dict(state["epoch"]), dict(state["rate"]), dict(state["seen"])
        self.buckets = {b: list(o) for b, o in state["orders"].items()}
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


def _name(value: Any) -> str:
    return str(value)


def _sort_key(name: str) -> tuple[int, float | str]:
    try:
        return (0, float(name))
    except ValueError:
        return (1, name)


def _jsonable_state(state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]
