"""Rewards scored over a whole group at once, with TRL's signature: ``(prompts, completions, **columns) -> list``.

TRL's reward functions take lists: one entry per completion of the batch, the task's columns as
keyword lists, and return one number (or None: does not apply) per completion. Here they are called
once per GRPO group, when its last episode has ended, so a reward sees every completion of its
group (a ranking, a diversity bonus, a judge that compares) and a TRL script's functions work
unchanged. The rollout engine calls :func:`score_group`; per-episode ``Reward`` functions are
untouched by it.

A function is taken as batched when it asks for ``prompts``, ``completions``, ``completion_ids`` or ``environments``
(the names TRL passes), or when it is wrapped in :class:`BatchedReward`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

# What a batched reward is given besides the task's columns (TRL's names).
GROUP_ARGUMENTS = {
    "prompts": "the prompt of each completion (the dataset's `prompt` value: text or messages)",
    "completions": "each completion: its text, or for a conversational prompt its messages after the prompt (assistant turns, tool replies)",
    "completion_ids": "each completion's sampled token ids",
    "environments": "each episode's object, for an environment_factory environment",
}
_NOT_COLUMNS = ("prompt", "completion", "completion_ids")  # TRL passes these columns under the names above, not as themselves
TRL_ONLY = {
    "trainer_state": "agentrl's environments do not see the trainer; give the reward what it needs through the task's columns",
    "log_extra": "completions are logged by the trainer (samples_per_log, the run viewer)",
    "log_metric": "the step line and trackers log every reward's mean and std by its name",
}


def is_batched(fn: Callable[..., Any]) -> bool:
    """Does ``fn`` take TRL's batched arguments (rather than one episode's)?"""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return any(name in params for name in GROUP_ARGUMENTS)


@dataclass
class BatchedReward:
    """A named, weighted reward called on a group's completions as lists (TRL's reward functions).

    ``fn(prompts=..., completions=..., completion_ids=..., **columns)`` may be sync or async and
    returns a list with one float or None per completion.
    """

    fn: Callable[..., Sequence[float | None] | Awaitable[Sequence[float | None]]]
    weight: float = 1.0
    name: str = ""
    per_turn = False  # scored once, when the group is complete

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"BatchedReward fn must be callable, got {type(self.fn).__name__}")
        self.name = self.name or getattr(self.fn, "__name__", None) or type(self.fn).__name__
        params = inspect.signature(self.fn).parameters.values()
        self.takes_all = any(p.kind is p.VAR_KEYWORD for p in params)
        self.wanted = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        self.required = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty}

    async def __call__(self, arguments: dict[str, list[Any]], count: int) -> list[float | None]:
        kwargs = arguments if self.takes_all else {k: v for k, v in arguments.items() if k in self.wanted}
        missing = sorted(self.required - set(kwargs))
        if missing:
            raise TypeError(f"asks for {missing}, which neither the group ({', '.join(GROUP_ARGUMENTS)}) nor the task's columns provide")
        values = self.fn(**kwargs)
        if inspect.isawaitable(values):
            values = await values
        if isinstance(values, str | bytes) or not hasattr(values, "__len__"):
            raise TypeError(f"returned {type(values).__name__}, not a list with one value per completion")
        values = list(values)
        if len(values) != count:
            raise TypeError(f"returned {len(values)} values for {count} completions (one per completion)")
        return [_number(v) for v in values]


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "item"):  # a tensor or numpy scalar
        value = value.item()
    out = float(value)
    return None if math.isnan(out) else out


def group_arguments(tasks: list[dict[str, Any]], messages: list[list[dict[str, Any]]], completion_ids: list[list[int]],
                    environments: list[Any] | None = None) -> dict[str, list[Any]]:  # fmt: skip
    """The keyword lists one call gets, in TRL's shape, from each episode's task and conversation."""
    out: dict[str, list[Any]] = {"prompts": [], "completions": [], "completion_ids": [list(c) for c in completion_ids]}
    for task, conversation in zip(tasks, messages):
        prompt = task.get("prompt", task.get("question"))
        out["prompts"].append(prompt)
        if isinstance(prompt, list):  # as TRL: every message after the prompt (assistant turns and tool replies)
            first = next((k for k, m in enumerate(conversation) if m.get("role") == "assistant"), len(conversation))
            out["completions"].append([dict(m) for m in conversation[first:]])
        else:
            out["completions"].append(next((m.get("content") or "" for m in reversed(conversation) if m.get("role") == "assistant"), ""))
    columns = [k for k in (tasks[0] if tasks else {}) if k not in _NOT_COLUMNS]
    for name in columns:
        out[name] = [t.get(name) for t in tasks]
    if environments is not None:
        out["environments"] = list(environments)
    return out


def column_clashes(columns: Sequence[str]) -> list[str]:
    """Columns a batched reward could not get as themselves (TRL's group argument names)."""
    return [c for c in columns if c in GROUP_ARGUMENTS and c not in _NOT_COLUMNS]
