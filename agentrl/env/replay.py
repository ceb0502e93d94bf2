"""Record tool results once, replay them later: reproduce episodes exactly without the tools.

For flaky, slow or paid tools (web search, APIs, sandboxes): an eval or training run records every
tool call of every episode with its result; a later run with the same model, seeds and tasks
replays them, so each episode sees the same tool messages and, with seeded sampling, produces the
same tokens, without calling a single tool.

A recorded result is keyed by what determines it from the episode's side: the task, the whole
conversation up to and including the assistant message that made the calls, and how often that
exact conversation was seen before (two episodes of a group can share a prefix). Replay of a
conversation the tape does not hold raises ``ReplayMiss`` (the episode diverged; the engine records
it as that episode's error) rather than guessing.

Use it around any run (``with record_tools("tape.jsonl"): ...``) or, for ``agentrl eval`` and
``agentrl train`` without code, with ``AGENTRL_RECORD_TOOLS=tape.jsonl`` /
``AGENTRL_REPLAY_TOOLS=tape.jsonl`` in the environment. The tape is JSON lines, appended call batch
by call batch, so a crashed run keeps what it recorded.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl.core.errors import AgentrlError
from agentrl.core.messages import ToolCall
from agentrl.env.dispatch import ToolRecord, ToolResult, dispatch
from agentrl.env.tool import Tool

RECORD_ENV = "AGENTRL_RECORD_TOOLS"
REPLAY_ENV = "AGENTRL_REPLAY_TOOLS"


class ReplayMiss(AgentrlError, LookupError):
    """Replay met a tool call the tape does not hold: the episode left the recorded path."""


class ToolTape:
    """A file of recorded tool results, in "record" or "replay" mode."""

    def __init__(self, path: str | Path, mode: str) -> None:
        if mode not in ("record", "replay"):
            raise ValueError(f"tool tape mode must be 'record' or 'replay', got {mode!r}")
        self.path, self.mode = Path(path), mode
        self._seen: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._entries: dict[str, list[dict[str, Any]]] = {}
        if mode == "replay":
            if not self.path.is_file():
                raise FileNotFoundError(f"tool tape {self.path} does not exist; record one first")
            for n, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
                if line.strip():
                    try:
                        entry = json.loads(line)
                        self._entries[entry["key"]] = entry["results"]
                    except (json.JSONDecodeError, KeyError, TypeError) as exc:
                        raise ValueError(f"tool tape {self.path} line {n} is not a tape entry: {exc}") from None
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.calls_replayed = 0
        self.calls_recorded = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _key(self, task: dict[str, Any], messages: list[dict[str, Any]]) -> str:
        blob = json.dumps({"task": task, "messages": messages}, sort_keys=True, default=str, ensure_ascii=False)
        digest = hashlib.sha256(blob.encode()).hexdigest()
        with self._lock:
            self._seen[digest] += 1
            return f"{digest}#{self._seen[digest]}"

    async def dispatch(
        self,
        calls: list[ToolCall | dict[str, Any]],
        tools: dict[str, Tool],
        injected: dict[str, Any],
        task: dict[str, Any],
        messages: list[dict[str, Any]],
    ) -> list[ToolResult]:
        """Run (record) or look up (replay) the results of one assistant turn's calls."""
        key = self._key(task, messages)
        if self.mode == "replay":
            stored = self._entries.get(key)
            if stored is None or len(stored) != len(calls):
                raise ReplayMiss(f"tool tape {self.path} has no results for this turn (key {key[:16]}...): the episode diverged from the recording")
            self.calls_replayed += len(stored)
            return [ToolResult(dict(r["message"]), ToolRecord(**r["record"])) for r in stored]
        results = await dispatch(calls, tools, injected)
        line = json.dumps({"key": key, "results": [{"message": r.message, "record": r.record.to_dict()} for r in results]}, ensure_ascii=False, default=str)
        with self._lock, self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
        self.calls_recorded += len(results)
        return results


_ACTIVE: contextvars.ContextVar[ToolTape | None] = contextvars.ContextVar("agentrl_tool_tape", default=None)
_FROM_ENV: dict[tuple[str, str], ToolTape] = {}


def active_tape() -> ToolTape | None:
    """The tape of the current context, else one named by AGENTRL_RECORD_TOOLS / AGENTRL_REPLAY_TOOLS."""
    tape = _ACTIVE.get()
    if tape is not None:
        return tape
    record, replay = os.environ.get(RECORD_ENV), os.environ.get(REPLAY_ENV)
    if record and replay:
        raise ValueError(f"set {RECORD_ENV} or {REPLAY_ENV}, not both")
    if not (record or replay):
        return None
    key = ("record", record) if record else ("replay", replay)  # type: ignore[assignment]
    if key not in _FROM_ENV:
        _FROM_ENV[key] = ToolTape(key[1], key[0])  # type: ignore[arg-type]
    return _FROM_ENV[key]


@contextlib.contextmanager
def record_tools(path: str | Path) -> Iterator[ToolTape]:
    """Record every tool call made inside the block (episodes started in it included) to ``path``."""
    with _active(ToolTape(path, "record")) as tape:
        yield tape


@contextlib.contextmanager
def replay_tools(path: str | Path) -> Iterator[ToolTape]:
    """Answer every tool call made inside the block from the tape at ``path``; no tool runs."""
    with _active(ToolTape(path, "replay")) as tape:
        yield tape


@contextlib.contextmanager
def _active(tape: ToolTape) -> Iterator[ToolTape]:
    token = _ACTIVE.set(tape)
    try:
        yield tape
    finally:
        _ACTIVE.reset(token)


async def run_tools(
    calls: list[ToolCall | dict[str, Any]],
    tools: dict[str, Tool],
    injected: dict[str, Any],
    task: dict[str, Any],
    messages: list[dict[str, Any]],
) -> list[ToolResult]:
    """``dispatch`` through the active tape if there is one (the hook ``ToolEnvironment.step`` calls)."""
    tape = active_tape()
    if tape is None:
        return await dispatch(calls, tools, injected)
    return await tape.dispatch(calls, tools, injected, task, messages)
