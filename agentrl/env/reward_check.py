"""Reward arguments checked against a real episode before any model loads: one line naming the reward.

A reward asks for its inputs by name (``Reward``). A name that neither the episode nor the task's
columns provide would otherwise fail on the first scored episode, after the model load and a whole
rollout; a column named like an episode argument (a prompt-completion dataset's ``completion``)
would silently be shadowed by the episode's value. Both are refused here, from the reward context
of the first task's episode (so ``FactoryEnvironment``'s ``environment`` counts too).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from typing import Any

from agentrl.core.errors import UserError
from agentrl.env.batched import GROUP_ARGUMENTS, TRL_ONLY, BatchedReward, column_clashes
from agentrl.env.environment import Environment, Reward, reward_context

EPISODE_ARGUMENTS = frozenset(reward_context({}, [], {}, 0, []))
MEANING = {
    "completion": "the text of the model's last message",
    "messages": "the whole conversation",
    "task": "the dataset row",
    "state": "the episode's scratch dict",
    "turn": "the turn number",
    "tool_records": "the episode's tool calls",
    "environment": "the episode's object",
}


class RewardArgumentError(UserError, TypeError):
    """A reward asks for an argument nobody provides, or one a column and the episode both claim."""


def required_arguments(reward: Reward) -> list[str]:
    """Names the reward function needs: its keyword-passable parameters without a default."""
    params = inspect.signature(reward.fn).parameters.values()
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty]


def named_arguments(reward: Reward) -> list[str]:
    params = inspect.signature(reward.fn).parameters.values()
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def check_reward_arguments(rewards: Sequence[Reward], context: dict[str, Any], columns: Iterable[str]) -> None:
    """Raise ``RewardArgumentError`` for the first reward whose arguments ``context`` cannot fill exactly."""
    columns = set(columns)
    episode = EPISODE_ARGUMENTS | (set(context) - columns)
    for r in rewards:
        if isinstance(r, BatchedReward):
            _check_batched(r, columns)
            continue
        missing = [a for a in required_arguments(r) if a not in context]
        if missing:
            hint = (
                " (rewards here score one episode: `completion` is its text; a TRL-style batched function takes lists)"
                if "completions" in missing
                else ""
            )
            raise RewardArgumentError(
                f"reward {r.name!r} asks for {missing}, which neither the episode ({', '.join(sorted(episode))}) "
                f"nor the task's columns ({', '.join(sorted(columns)) or 'none'}) provide{hint}"
            )
        clash = [a for a in named_arguments(r) if a in columns and a in episode]
        if clash:
            a = clash[0]
            raise RewardArgumentError(
                f"reward {r.name!r} asks for {a!r}, which is both a column of the tasks and the episode's {a!r} "
                f"({MEANING.get(a, 'an episode argument')}); the reward would get the episode's: rename the column "
                f"(Dataset.rename_column) or read it as task[{a!r}]"
            )


async def check_env_rewards(env: Environment, task: dict[str, Any]) -> None:
    """Check ``env.rewards`` against the reward context of an episode reset on ``task`` (nothing is sampled)."""
    if not env.rewards or type(env).reward_context is Environment.reward_context:
        return
    episode = env.spawn()
    try:
        await episode.reset(task=dict(task), seed=0)
        context = episode.reward_context()
    finally:
        await episode.close()
    check_reward_arguments(env.rewards, context, dict(task))


def _check_batched(r: BatchedReward, columns: set[str]) -> None:
    """A batched reward gets TRL's group lists and the columns (as lists) by name."""
    for a in sorted(r.required):
        if a in TRL_ONLY and a not in columns:
            raise RewardArgumentError(f"reward {r.name!r} asks for {a!r}, a TRL argument agentrl does not pass: {TRL_ONLY[a]}")
    missing = sorted(a for a in r.required if a not in GROUP_ARGUMENTS and a not in columns)
    if missing:
        raise RewardArgumentError(
            f"reward {r.name!r} asks for {missing}, which neither the group ({', '.join(GROUP_ARGUMENTS)}) "
            f"nor the task's columns ({', '.join(sorted(columns)) or 'none'}) provide"
        )
    clash = column_clashes(sorted(columns)) if r.takes_all or r.wanted & set(GROUP_ARGUMENTS) else []
    if clash:
        raise RewardArgumentError(
            f"the tasks have a column {clash[0]!r}, which batched reward {r.name!r} would get as the group's {clash[0]!r} "
            f"({GROUP_ARGUMENTS[clash[0]]}); rename the column (Dataset.rename_column)"
        )
