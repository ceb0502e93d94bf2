"""Guidance: a demonstrated episode in each group, trained on where it beats every sample.

GRPO learns only from what the policy samples: a group whose eight episodes all fail the same way
has no success to move towards. Where the environment can demonstrate (``Environment.demonstrate``:
the assistant message an expert would send next), ``guidance.enabled`` plays one extra episode per
group whose assistant turns are the demonstration's, through the same chat format, environment,
tools and rewards as the sampled ones. When its reward is above every sampled episode's, it takes
the place of the group's lowest-reward episode, so the group's advantages point at it; otherwise it
is dropped. As the policy learns, its own samples match the demonstration and guidance fades by
itself. This is off-policy guidance in the spirit of LUFFY (Yan et al., 2025, "Learning to Reason
under Off-Policy Guidance"), in its simplest form: the demonstration's tokens carry no sampler
log-probabilities (NaN), so the loss treats them as on-policy (ratio 1 at the first pass, no
sampler correction).

The demonstrated turns are token ids the model could have sampled (``ChatFormat.assistant_ids``);
they are trained like sampled ones (loss mask 1) and are never scored as the policy's: training
reward and rollout metrics leave guided episodes out and count them (``rollout/guided``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any, Literal

import anyio

if sys.version_info < (3, 11):  # anyio brings the backport there
    from exceptiongroup import BaseExceptionGroup

from agentrl.chat.base import ChatFormat
from agentrl.core.errors import AgentrlError
from agentrl.core.trajectory import Trajectory, TrajectoryGroup
from agentrl.env.environment import Environment
from agentrl.generators.protocol import Generation
from agentrl.rollout.engine import RolloutEngine, TurnRequest, reward_error_in


class GuidanceError(AgentrlError, RuntimeError):
    """A demonstrated turn that cannot be played (no demonstration, a template that cannot render it)."""


def has_demonstrations(env: Environment) -> bool:
    """Whether ``env`` overrides ``Environment.demonstrate``."""
    return type(env).demonstrate is not Environment.demonstrate


class GuidedRollouts:
    """A rollout engine's ``run`` plus one demonstrated episode per group, put in place of the group's
    worst sample where it beats every sample (``keep="above_all"``) or their mean (``"above_mean"``).

    A plug-in around the engine, not a branch in it: the demonstrated episodes run through the
    engine's own ``run_episode`` with their turns taken from :func:`demonstrated_turn` instead of the
    generator. They send the generator nothing, so they run outside its episode count, under their
    own limiter, concurrently with the sampled ones.
    """

    def __init__(self, engine: RolloutEngine, keep: Literal["above_all", "above_mean"] = "above_all") -> None:
        self.engine, self.keep = engine, keep
        self.run_episode = engine.run_episode  # one episode, as the engine plays it

    async def run(
        self, env: Environment, tasks: list[dict[str, Any]], n: int = 1, seed: int | None = 0, on_episode: Callable[[Trajectory], None] | None = None
    ) -> list[TrajectoryGroup]:
        guided: list[Trajectory | None] = [None] * len(tasks)
        sampled: list[list[TrajectoryGroup]] = []
        limiter = anyio.CapacityLimiter(self.engine.config.max_concurrent_episodes)

        async def samples() -> None:
            sampled.append(await self.engine.run(env, tasks, n=n, seed=seed, on_episode=on_episode))

        async def demonstrate(g: int) -> None:
            async with limiter:
                traj = await self.engine.run_episode(env, tasks[g], None if seed is None else seed + g, group=g, index=n, turns=demonstration)
            traj.guided = True
            guided[g] = traj

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(samples)
                for g in range(len(tasks)):
                    tg.start_soon(demonstrate, g)
        except BaseExceptionGroup as group:  # a reward raised (reward_errors=raise): that error, not the group
            found = reward_error_in(group)
            if found is None:
                raise
            raise found from None
        groups = sampled[0]
        merge_guided(groups, guided, self.keep)
        return groups


async def demonstration(turn: TurnRequest) -> Generation:
    """The engine's turn source for a demonstrated episode."""
    return await demonstrated_turn(turn.env, turn.chat_format, turn.messages, turn.tools, turn.sampling.max_tokens, turn.ids)


async def demonstrated_turn(
    env: Environment, fmt: ChatFormat, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, budget: int, prompt_ids: list[int]
) -> Generation:
    """The environment's next demonstrated message as the ids a model would sample after
    ``prompt_ids`` (the episode's ids so far), ending with the end of turn; NaN log-probabilities
    (no sampler drew them)."""
    message = await env.demonstrate()
    if message is None:
        raise GuidanceError(f"{type(env).__name__}.demonstrate() has no message for turn {sum(m.get('role') == 'assistant' for m in messages) + 1}")
    if not isinstance(message, dict) or message.get("role") != "assistant":
        raise GuidanceError(f"{type(env).__name__}.demonstrate() must return an assistant message (a dict with role 'assistant'), got {message!r:.200}")
    try:
        ids = fmt.assistant_ids(messages, message, tools, prompt_ids=prompt_ids)
    except ValueError as exc:
        raise GuidanceError(f"the demonstrated message cannot be rendered as a turn: {exc}") from None
    if len(ids) > budget:
        raise GuidanceError(f"the demonstrated turn has {len(ids)} tokens, over this turn's budget of {budget}")
    return Generation(token_ids=ids, logprobs=[math.nan] * len(ids), finish_reason="stop")


def merge_guided(groups: list[TrajectoryGroup], guided: list[Trajectory | None], keep: Literal["above_all", "above_mean"] = "above_all") -> int:
    """Put each group's demonstrated episode in place of its lowest-reward sample where the
    demonstration's reward is above every sample's (``above_all``) or above the samples' mean
    (``above_mean``); returns how many groups took one."""
    taken = 0
    for group, demo in zip(groups, guided):
        ok = group.ok
        if demo is None or not demo.ok or not ok:
            continue
        bar = max(t.reward for t in ok) if keep == "above_all" else sum(t.reward for t in ok) / len(ok)
        if demo.reward <= bar:
            continue
        worst = min(range(len(group.trajectories)), key=lambda i: (group.trajectories[i].ok, group.trajectories[i].reward))
        demo.index = group.trajectories[worst].index
        group.trajectories[worst] = demo
        taken += 1
    return taken
