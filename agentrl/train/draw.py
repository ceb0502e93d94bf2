"""This step's groups: which tasks are rolled out, and which of their groups the step trains on.

Why its own module: the trainer's loop asks one question per generation batch ("the groups to
train on"), whichever task policy answers it: the run's shuffled order, the difficulty
curriculum (agentrl/train/curriculum.py), dynamic sampling's refill rounds (agentrl/train/selection.py)
or rollouts made ahead in the background (agentrl/rollout/ahead.py). The glue between them lives
here, so the loop reads the same with each on or off.

Seeded runs stay reproducible: the rollout seed of a batch is a function of the run's seed and
step (``train_seed``), refill round ``r`` adds ``100_003 * r`` to it, and tasks are drawn in the
same order every time; the curriculum's position is in ``TrainState.curriculum`` for resuming.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.core.trajectory import TrajectoryGroup
from agentrl.rollout.ahead import RolloutAhead
from agentrl.train.config import TrainConfig
from agentrl.train.curriculum import Curriculum
from agentrl.train.selection import GroupSelector, informative
from agentrl.train.state import TrainState

Rollout = Callable[[list[dict[str, Any]], int], tuple[list[TrajectoryGroup], float]]
"""``rollout(tasks, seed) -> (groups in task order, seconds)``: the trainer's rollout on every rank."""


@dataclass
class StepGroups:
    """One generation batch. ``drawn`` is every group rolled out for it; ``train`` the ones kept
    (the same list without dynamic sampling)."""

    train: list[TrajectoryGroup]
    drawn: list[TrajectoryGroup]
    seconds: float  # rollout wall time, every round included
    metrics: dict[str, float] = field(default_factory=dict)  # the selection's and the curriculum's


def train_seed(seed: int, step: int) -> int:
    """The rollout seed of the generation batch drawn at ``step`` of a run seeded ``seed``."""
    return seed * 1_000_003 + step * 7919


class AheadTasks:
    """The task order of a run whose batches are drawn ahead of training (``max_staleness > 0``).

    The background thread draws a batch's tasks before the batches in front of it have come back,
    and the trainer must draw the very same tasks when it reaches that step (it checks). Without a
    curriculum that is the run's shuffled order. With one, the draw for the batch of step ``T``
    may use only the groups of batches before step ``T - lag`` (``lag = max(max_staleness,
    steps_per_generation)``, the batches already back whenever ``T`` can be drawn): each side
    queues the groups it sees (``observe``) and folds in, in step order, the ones old enough just
    before each draw, so both compute the same weights. The curriculum's statistics are then as
    stale as the weights that generated the batch.
    """

    def __init__(self, state: TrainState, data: Any, curriculum: Curriculum | None, lag: int, min_std: float) -> None:
        self.state, self.data, self.curriculum, self.lag, self.min_std = state, data, curriculum, lag, min_std
        self.pending: list[tuple[int, dict[str, list[int]]]] = []  # (step, per-bucket flags) not yet folded in
        if curriculum is not None and state.curriculum is not None:
            self.pending = [(int(t), dict(f)) for t, f in state.curriculum.get("pending", [])]

    def next_tasks(self, target: int, n: int) -> list[dict[str, Any]]:
        """The ``n`` tasks of the batch the trainer uses at step ``target``."""
        if self.curriculum is None:
            return self.state.next_tasks(self.data, n)
        ready = [f for t, f in self.pending if t < target - self.lag]
        self.pending = [(t, f) for t, f in self.pending if t >= target - self.lag]
        for flags in ready:
            self.curriculum.update_flags(flags)
        return self.curriculum.next_tasks(n)

    def observe(self, target: int, groups: list[TrajectoryGroup]) -> dict[str, float]:
        """The groups of step ``target``'s batch came back: queue what the curriculum learns from them."""
        if self.curriculum is None:
            return {}
        self.pending.append((target, self.curriculum.flags(groups, lambda g: informative(g, self.min_std))))
        self.state.curriculum = {**self.curriculum.state_dict(), "pending": [[t, f] for t, f in self.pending]}
        return self.curriculum.metrics()

    def clone(self) -> AheadTasks:
        """An independent copy at the same position, for the background thread to draw ahead with."""
        twin = AheadTasks(copy.deepcopy(self.state), self.data, None if self.curriculum is None else self.curriculum.clone(), self.lag, self.min_std)
        twin.pending = [(t, dict(f)) for t, f in self.pending]
        return twin


class GroupDraw:
    """Draws each generation batch's tasks, rolls them out through ``rollout``, keeps its groups.

    ``ahead``: rollouts made in the background (then no dynamic sampling, which the config
    refuses; a curriculum draws through ``AheadTasks``). A curriculum is built when
    ``curriculum.key`` is set and continues from ``state.curriculum`` when the run was resumed.
    """

    def __init__(self, cfg: TrainConfig, train_data: Any, state: TrainState, rollout: Rollout, ahead: RolloutAhead | None = None) -> None:
        self.cfg, self.train_data, self.state, self.rollout, self.ahead = cfg, train_data, state, rollout, ahead
        self.curriculum = Curriculum(train_data, cfg.curriculum, cfg.seed) if cfg.curriculum.key else None
        if self.curriculum is not None and state.curriculum is not None:
            self.curriculum.load_state_dict(state.curriculum)
        lag = max(cfg.max_staleness, cfg.steps_per_generation)
        self.ahead_tasks = AheadTasks(state, train_data, self.curriculum, lag, cfg.dynamic_sampling.min_std) if ahead is not None else None

    def next(self) -> StepGroups:
        """The groups of the generation batch that starts at the state's current step. Without
        dynamic sampling every drawn group is kept; with it, groups whose rewards do not vary are
        dropped and further tasks rolled out, ``max_rounds`` times at most."""
        cfg, state = self.cfg, self.state
        target = cfg.prompts_per_step * cfg.steps_per_generation
        seed = train_seed(cfg.seed, state.step)
        if self.ahead is not None and self.ahead_tasks is not None:
            tasks = self.ahead_tasks.next_tasks(state.step, target)
            groups, seconds = self.ahead.take(state.step, self.ahead_tasks, tasks, seed)
            return StepGroups(groups, groups, seconds, self.ahead_tasks.observe(state.step, groups))
        groups, seconds = self.rollout(self._next_tasks(target), seed)
        if not cfg.dynamic_sampling.enabled:
            return StepGroups(groups, groups, seconds, self._update_curriculum(groups))
        selector = GroupSelector(target, cfg.dynamic_sampling)
        selector.add(groups)
        while n := selector.next_draw():
            more, extra_s = self.rollout(self._next_tasks(n), seed + 100_003 * selector.rounds)
            selector.add(more)
            seconds += extra_s
        return StepGroups(selector.selected(), selector.drawn, seconds, selector.metrics() | self._update_curriculum(selector.drawn))

    def _next_tasks(self, n: int) -> list[dict[str, Any]]:
        """The next ``n`` training tasks: the curriculum's draw, or the run's shuffled order."""
        if self.curriculum is not None:
            return self.curriculum.next_tasks(n)
        return self.state.next_tasks(self.train_data, n)

    def _update_curriculum(self, drawn: list[TrajectoryGroup]) -> dict[str, float]:
        """Teach the curriculum which buckets' groups varied; its weights and rates as metrics."""
        if self.curriculum is None:
            return {}
        self.curriculum.update(drawn, lambda g: informative(g, self.cfg.dynamic_sampling.min_std))
        self.state.curriculum = self.curriculum.state_dict()
        return self.curriculum.metrics()
