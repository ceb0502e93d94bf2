"""Dynamic sampling (DAPO): drop GRPO groups whose rewards do not vary and refill the batch from further tasks.

Why: a group whose episodes all got the same reward has zero group-relative advantage, so its
tokens add nothing to the policy gradient but still dilute the token-normalised loss and cost a
forward and backward pass. With a weak policy most groups fail together (and with a strong one,
succeed together); replacing them keeps every optimizer step full of signal. The refill is bounded
(``max_rounds`` extra rollouts per step), so a policy that solves nothing still takes steps.

``GroupSelector`` is the pure bookkeeping (which groups to keep, how many tasks to draw next, what
to log); the trainer does the rollouts. Every rank sees the same gathered groups, so every rank
makes the same choices.
"""

from __future__ import annotations

import math
import statistics

from agentrl.core.trajectory import TrajectoryGroup
from agentrl.train.config import DynamicSamplingConfig


def informative(group: TrajectoryGroup, min_std: float = 0.0) -> bool:
    """True when the group's rewards vary (at least two finished episodes, std above ``min_std``)."""
    rewards = group.rewards
    return len(rewards) >= 2 and statistics.pstdev(rewards) > min_std


class GroupSelector:
    """Collects the groups of one step's rollout rounds; keeps the informative ones up to ``target``."""

    def __init__(self, target: int, settings: DynamicSamplingConfig) -> None:
        self.target, self.settings = target, settings
        self.drawn: list[TrajectoryGroup] = []
        self.kept: list[TrajectoryGroup] = []
        self.rounds = 0
        self.dropped = 0  # groups whose rewards did not vary
        self.surplus = 0  # informative groups beyond the target (the last round overshot)

    def add(self, groups: list[TrajectoryGroup]) -> None:
        """One round's groups, in task order."""
        self.rounds += 1
        self.drawn.extend(groups)
        for group in groups:
            if not informative(group, self.settings.min_std):
                self.dropped += 1
            elif len(self.kept) < self.target:
                self.kept.append(group)
            else:
                self.surplus += 1

    def next_draw(self) -> int:
        """Tasks to roll out in the next round (0: done). Sized by the keep rate seen so far, so one
        round usually fills the batch, capped at ``max_draw_factor`` per missing group."""
        missing = self.target - len(self.kept)
        if missing <= 0 or self.rounds > self.settings.max_rounds:
            return 0
        rate = len(self.kept) / max(1, len(self.drawn))
        per_group = min(self.settings.max_draw_factor, 1 / rate if rate > 0 else self.settings.max_draw_factor)
        return max(1, math.ceil(missing * per_group))

    def selected(self) -> list[TrajectoryGroup]:
        """The groups to train on: the kept ones; if none varied at all, the first ``target`` drawn
        (their advantages are zero: the step moves only through the KL term, and is logged as such)."""
        return self.kept if self.kept else self.drawn[: self.target]

    def metrics(self) -> dict[str, float]:
        return {
            "sampling/groups_drawn": float(len(self.drawn)),
            "sampling/groups_kept": float(len(self.kept)),
            "sampling/groups_dropped": float(self.dropped),
            "sampling/groups_surplus": float(self.surplus),
            "sampling/rounds": float(self.rounds),
        }
