"""The environment's answer to one assistant turn, typed: what the rollout engine reads from ``step``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from agentrl.core.messages import Message
from agentrl.core.records import ToolRecord

__all__ = ["StepResult"]


@dataclass
class StepResult:
    """``messages`` (the environment's reply), ``reward``, ``terminated``, ``truncated`` and ``info``,
    as gym's ``step`` returns them (it unpacks as that 5-tuple), plus the typed parts the engine
    records: reward ``rewards`` by component and the turn's ``tool_records``.

    ``history``: the conversation goes on from these messages instead of the history plus
    ``messages`` (an environment that rewrote earlier turns, such as a harness that edited what it
    re-sends). The engine cannot bridge a rewrite in token space, so it starts a new sample from it
    and counts a split."""

    messages: list[Message]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)
    rewards: dict[str, float | None] = field(default_factory=dict)
    tool_records: list[ToolRecord] = field(default_factory=list)
    history: list[Message] | None = None

    def __iter__(self) -> Iterator[Any]:
        return iter(self.as_tuple())

    def __getitem__(self, index: int) -> Any:
        return self.as_tuple()[index]

    def __len__(self) -> int:
        return 5

    def as_tuple(self) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        return self.messages, self.reward, self.terminated, self.truncated, self.info

    @classmethod
    def of(cls, value: Any) -> StepResult:
        """A ``StepResult``, or one from a plain gym 5-tuple whose ``info`` may carry ``rewards`` and
        ``tool_records`` (dicts or records): what an environment written against the tuple returns."""
        if isinstance(value, StepResult):
            return value
        try:
            messages, reward, terminated, truncated, info = value
        except (TypeError, ValueError):
            raise TypeError(f"step() must return a StepResult or (messages, reward, terminated, truncated, info), got {value!r:.200}") from None
        info = dict(info or {})
        records = [r if isinstance(r, ToolRecord) else ToolRecord(**r) for r in info.get("tool_records", [])]
        return cls(list(messages), float(reward), bool(terminated), bool(truncated), info, dict(info.get("rewards", {})), records)
