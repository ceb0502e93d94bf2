"""Trajectories: the exact tokens of an episode, what was trained, and what happened.

One ``Trajectory`` is one episode. Its token sequence lives in ``samples``: normally one, more
when the chat template could not be bridged in token space and the engine split the episode
(each sample is then a separate training sequence with the episode's reward). ``loss_mask`` is 1
exactly on tokens the model sampled; ``logprobs`` are the sampler's (0.0 where the mask is 0).
Everything round-trips through JSONL: the same record training logs, ``agentrl eval`` writes and
a viewer shows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from agentrl.core.records import ToolRecord


@dataclass
class Sample:
    """One training sequence: prompt ids, then completion ids with their mask and logprobs."""

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    # The trainer's logprobs of the same tokens under the weights that sampled them (0.0 where the
    # mask is 0); filled by the trainer, None elsewhere. Their gap to ``logprobs`` is the
    # sampler/trainer mismatch the viewer shows.
    trainer_logprobs: list[float] | None = None

    def extend(self, ids: list[int], sampled: bool, logprobs: list[float] | None = None) -> None:
        self.completion_ids.extend(ids)
        self.loss_mask.extend([1 if sampled else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids

    @property
    def num_sampled(self) -> int:
        return sum(self.loss_mask)


@dataclass
class Turn:
    """One assistant turn and the environment's answer to it.

    Its sampled tokens are ``samples[sample].completion_ids[start : start + num_sampled]`` of the
    trajectory (what per-turn credit assignment needs). ``reward`` is the turn's weighted reward and
    ``rewards`` its components (None: did not apply); an episode-level reward, and the score of an
    episode the engine cut short, land on the last turn.
    """

    index: int
    message: dict[str, Any]
    num_sampled: int
    finish_reason: str
    env_messages: list[dict[str, Any]] = field(default_factory=list)
    num_env_tokens: int = 0
    tool_records: list[ToolRecord] = field(default_factory=list)
    parse_issues: list[dict[str, str]] = field(default_factory=list)
    reward: float = 0.0
    rewards: dict[str, float | None] = field(default_factory=dict)
    sample: int = 0
    start: int = 0
    generation_s: float = 0.0
    env_s: float = 0.0
    bridge: str = ""  # "proven", "split: <reason>", or "" on the last turn


@dataclass
class Trajectory:
    """One episode."""

    task: dict[str, Any]
    seed: int | None
    group: int = 0
    index: int = 0
    samples: list[Sample] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    rewards: dict[str, float | None] = field(default_factory=dict)
    finish_reason: str = ""  # "stop" (env terminated), "max_turns", "length", "max_tokens", "context", "error"
    truncated: bool = False
    splits: int = 0
    error: str | None = None
    duration_s: float = 0.0
    guided: bool = False  # the assistant turns are the environment's demonstration (agentrl/rollout/guidance.py), not samples
    policy_version: int | None = None  # the sampling weights' version (optimizer steps taken); set where rollouts run apart from training

    # Convenience views of the (usually single) sample.
    @property
    def prompt_ids(self) -> list[int]:
        return self.samples[0].prompt_ids if self.samples else []

    @property
    def completion_ids(self) -> list[int]:
        return self.samples[0].completion_ids if self.samples else []

    @property
    def loss_mask(self) -> list[int]:
        return self.samples[0].loss_mask if self.samples else []

    @property
    def logprobs(self) -> list[float]:
        return self.samples[0].logprobs if self.samples else []

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def num_sampled(self) -> int:
        return sum(s.num_sampled for s in self.samples)

    @property
    def num_env_tokens(self) -> int:
        return sum(len(s.loss_mask) - s.num_sampled for s in self.samples)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data, built without recursion (see :func:`plain`): a hostile tool call
        nested thousands of levels deep must not lose the results file it is written to.

        A log-prob that is not a number (a demonstrated token has no sampler log-prob: NaN) is
        written as ``null``, so each line is strict JSON that any reader (``jq``, JavaScript,
        pandas) parses; :meth:`from_dict` reads it back as NaN."""
        data = plain(self)
        for s in data.get("samples", []):
            for key in LOGPROB_KEYS:
                if isinstance(s.get(key), list):
                    s[key] = [None if isinstance(v, float) and not math.isfinite(v) else v for v in s[key]]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        data = dict(data)
        data["samples"] = [Sample(**_numbers(s)) for s in data.get("samples", [])]
        data["turns"] = [_turn(t) for t in data.get("turns", [])]
        return cls(**data)


@dataclass
class TrajectoryGroup:
    """The ``n`` episodes of one task with the same environment seed (GRPO's group)."""

    task: dict[str, Any]
    seed: int | None
    trajectories: list[Trajectory]

    @property
    def ok(self) -> list[Trajectory]:
        """Episodes that did not die of an infrastructure error."""
        return [t for t in self.trajectories if t.ok]

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.ok]

    def to_dict(self) -> dict[str, Any]:
        """Plain data (as :meth:`Trajectory.to_dict`), for another rank or a file."""
        return {"task": plain(self.task), "seed": self.seed, "trajectories": [t.to_dict() for t in self.trajectories]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrajectoryGroup:
        return cls(data["task"], data["seed"], [Trajectory.from_dict(t) for t in data["trajectories"]])


def write_jsonl(trajectories: Iterable[Trajectory], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_dict(), ensure_ascii=False, default=_jsonable) + "\n")


def read_jsonl(path: str | Path) -> list[Trajectory]:
    with open(path, encoding="utf-8") as f:
        return [Trajectory.from_dict(json.loads(line)) for line in f if line.strip()]


LOGPROB_KEYS = ("logprobs", "trainer_logprobs")


def _numbers(sample: dict[str, Any]) -> dict[str, Any]:
    """A sample's stored log-probs with ``null`` (no number, see ``Trajectory.to_dict``) as NaN."""
    out = dict(sample)
    for key in LOGPROB_KEYS:
        if isinstance(out.get(key), list) and None in out[key]:
            out[key] = [math.nan if v is None else v for v in out[key]]
    return out


def _turn(data: dict[str, Any]) -> Turn:
    data = dict(data)
    data["tool_records"] = [r if isinstance(r, ToolRecord) else ToolRecord(**r) for r in data.get("tool_records", [])]
    return Turn(**data)


# Values nested deeper than this are stored as their JSON text (a string), so that json.dumps (and
# any reader) never recurses past it; parsers already refuse arguments deeper than 64 levels.
MAX_DEPTH = 100
_SCALARS = frozenset({int, float, str, bool, type(None)})


def plain(value: Any, max_depth: int = MAX_DEPTH) -> Any:
    """A copy of ``value`` made of dicts, lists and scalars only: dataclasses become dicts (by
    field), tuples lists, and anything nested deeper than ``max_depth`` becomes its JSON text.

    Iterative (an explicit stack), so no input depth can raise RecursionError here.
    """
    root: list[Any] = [None]
    stack: list[tuple[Any, int, Any, Any]] = [(value, 0, root, 0)]  # (value, depth, parent, key in parent)
    while stack:
        item, depth, parent, key = stack.pop()
        if is_dataclass(item) and not isinstance(item, type):
            item = {f.name: getattr(item, f.name) for f in fields(item)}
        if isinstance(item, dict):
            if depth >= max_depth:
                parent[key] = json_text(item)
                continue
            out: dict[Any, Any] = {}
            parent[key] = out
            for k, v in item.items():
                k = k if isinstance(k, (str, int, float, bool)) or k is None else str(k)
                out[k] = None
                stack.append((v, depth + 1, out, k))
        elif isinstance(item, (list, tuple)):
            if depth >= max_depth:
                parent[key] = json_text(item)
                continue
            if all(type(v) in _SCALARS for v in item):  # token ids, masks, logprobs: copied at C speed
                parent[key] = list(item)
                continue
            seq: list[Any] = [None] * len(item)
            parent[key] = seq
            stack.extend((v, depth + 1, seq, i) for i, v in enumerate(item))
        else:
            parent[key] = item
    return root[0]


def json_text(value: Any) -> str:
    """Compact JSON of ``value`` at any depth, written iteratively (json.dumps recurses)."""
    parts: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Raw):
            parts.append(item.text)
        elif is_dataclass(item) and not isinstance(item, type):
            stack.append({f.name: getattr(item, f.name) for f in fields(item)})
        elif isinstance(item, dict):
            todo: list[Any] = [_Raw("{")]
            for i, (k, v) in enumerate(item.items()):
                todo += [_Raw(("," if i else "") + json.dumps(str(k), ensure_ascii=False) + ":"), v]
            todo.append(_Raw("}"))
            stack.extend(reversed(todo))
        elif isinstance(item, (list, tuple)):
            todo = [_Raw("[")]
            for i, v in enumerate(item):
                todo += [_Raw(","), v] if i else [v]
            todo.append(_Raw("]"))
            stack.extend(reversed(todo))
        else:
            parts.append(json.dumps(item, ensure_ascii=False, default=_jsonable))
    return "".join(parts)


@dataclass(frozen=True)
class _Raw:
    text: str


def _jsonable(obj: Any) -> Any:
    """Task rows may hold numpy or other values; store them as plain data or text."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)
