"""This step's groups: which tasks are rolled out, and which of their groups the step trains on.

Why its own module: the trainer's loop asks one question per generation batch ("the groups to
train on"), whichever task policy answers it: the run's shuffled order, the difficulty
curriculum (agentrl/curriculum.py), dynamic sampling's refill rounds (agentrl/group_selection.py)
or rollouts made ahead in the background (agentrl/rollout_ahead.py). The glue between them lives
here, so the loop reads the same with each on or off.

Seeded runs stay reproducible: the rollout seed of a batch is a function of the run's seed and
step (``train_seed``), refill round ``r`` adds ``100_003 * r`` to it, and tasks are drawn in the
same order every time; the curriculum's position is in ``TrainState.curriculum`` for resuming.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.curriculum import Curriculum
from agentrl.group_selection import GroupSelector, informative
from agentrl.rollout_ahead import RolloutAhead
from agentrl.train_config import TrainConfig
from agentrl.train_state import TrainState
from agentrl.trajectory import TrajectoryGroup

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


class GroupDraw:
    """Draws each generation batch's tasks, rolls them out through ``rollout``, keeps its groups.

    ``ahead``: rollouts already made in the background (then no dynamic sampling or curriculum,
    which the config refuses). A curriculum is built when ``curriculum.key`` is set and continues
    from ``state.curriculum`` when the run was resumed.
    """

    def __init__(self, cfg: TrainConfig, train_data: Any, state: TrainState, rollout: Rollout, ahead: RolloutAhead | None = None) -> None:
        self.cfg, self.train_data, self.state, self.rollout, self.ahead = cfg, train_data, state, rollout, ahead
        self.curriculum = Curriculum(train_data, cfg.curriculum, cfg.seed) if cfg.curriculum.key else None
        if self.curriculum is not None and state.curriculum is not None:
            self.curriculum.load_state_dict(state.curriculum)

    def next(self) -> StepGroups:
        """The groups of the generation batch that starts at the state's current step. Without
        dynamic sampling every drawn group is kept; with it, groups whose rewards do not vary are
        dropped and further tasks rolled out, ``max_rounds`` times at most."""
        cfg, state = self.cfg, self.state
        target = cfg.prompts_per_step * cfg.steps_per_generation
        seed = train_seed(cfg.seed, state.step)
        if self.ahead is not None:
            groups, seconds = self.ahead.take(state, state.next_tasks(self.train_data, target), seed)
            return StepGroups(groups, groups, seconds)
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
