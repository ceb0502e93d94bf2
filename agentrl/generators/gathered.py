"""A generator over an unsharded copy of a sharded policy (FSDP2): the copy's weights are gathered
once per policy version, at the first rollout after an update, and freed after each rollout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from agentrl.compute.generation_copy import empty_weights
from agentrl.compute.parallel.fsdp import gather_into
from agentrl.generators.protocol import Generation, SamplingParams, T
from agentrl.generators.weights import WeightUpdate


class GatheredGenerator:
    """A ``Generator`` over an unsharded copy of a sharded policy.

    ``inner`` is any generator whose weights come from ``copy``: the transformers backend built on
    ``copy`` itself (then handing it ``copy``'s update is free), or one that takes a pushed
    ``WeightUpdate``. ``load_weights`` only notes the new version; the next ``begin_rollout``
    (called by every rank at the same point of the loop) gathers it. ``keep_between_rollouts``:
    keep the copy's weights after ``end_rollout`` instead of freeing them (more memory, no
    re-gather when rolling out twice in a row with the same weights, as eval after a step does).
    """

    def __init__(self, inner: Any, policy: torch.nn.Module, copy: torch.nn.Module, keep_between_rollouts: bool = False) -> None:
        self.inner, self.policy, self.copy = inner, policy, copy
        self.keep = keep_between_rollouts
        self.version: int | None = 0
        self.gathered: int | None = None  # the version the copy holds (None: weights freed)
        self.stats = {"gathers": 0}

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        return await self.inner.generate(prompt_ids, sampling)

    def track_episodes(self, delta: int) -> None:
        self.inner.track_episodes(delta)

    def begin_rollout(self) -> None:
        if self.gathered != self.version:
            gather_into(self.policy, self.copy)
            self.gathered = self.version
            self.stats["gathers"] += 1
            self.inner.load_weights(WeightUpdate.from_module(self.copy, version=self.version or 0))
        self.inner.begin_rollout()

    def end_rollout(self) -> None:
        self.inner.end_rollout()
        if not self.keep:
            empty_weights(self.copy)
            self.gathered = None

    def load_weights(self, update: WeightUpdate) -> None:
        """Note the policy's new version; the sharded weights are gathered at the next rollout."""
        if update.module is not None and update.module is not self.policy:
            raise ValueError("GatheredGenerator.load_weights: expected an update of the sharded policy it wraps")
        self.version = update.version

    def run_rollouts(self, rollouts: Callable[[], T]) -> T:
        """The wrapped backend's choice of thread (the copy is its model)."""
        return self.inner.run_rollouts(rollouts)

    async def close(self) -> None:
        await self.inner.close()


def over_copy(inner: Any, policy: Any, copy: torch.nn.Module | None) -> Any:
    """``inner`` as is when generation decodes the policy itself (``copy`` None), else a
    :class:`GatheredGenerator` that fills ``copy`` from the sharded ``policy`` before each rollout."""
    return inner if copy is None else GatheredGenerator(inner, policy, copy)

