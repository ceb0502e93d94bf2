"""``agentrl view``: one self-contained HTML page of a run's or an eval's trajectories.

Input is a run folder (its ``samples.jsonl``), an eval's ``results.jsonl`` or a ``samples.jsonl``;
each line is a ``Trajectory`` record. The files keep token ids only, so the page decodes them with
the run's own tokenizer, found next to the file (a run's latest checkpoint, else the model path in
``config.json`` / ``summary.json``) or given as ``tokenizer=``. Decoding at view time keeps the
training hot path and the files free of per-token text (several times the size of the ids), and a
run cannot exist without its tokenizer. When none loads, the page shows ids and says so.

This module reads the records and works out what happened (which tokens belong to which turn,
splits, cuts, tool failures); ``viewer_html`` turns that into the page.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.core.errors import UserError
from agentrl.core.records import FAILURES
from agentrl.core.trajectory import Trajectory, Turn

USAGE = "usage: agentrl view <run folder | results.jsonl | samples.jsonl> [out=page.html] [tokenizer=PATH|none]"
WINDOW = 8  # tokens of left context when decoding one token, so byte pieces and merges decode right


class ViewError(UserError, ValueError):
    """Input the viewer cannot show; the message names the file and the problem."""


@dataclass
class Episode:
    traj: Trajectory
    step: int | None = None  # the training step of a samples.jsonl record
    problems: list[str] = field(default_factory=list)  # fields of the record that were not what they should be


@dataclass
class Segment:
    """Tokens ``[start, mid)`` sampled by ``turn``, then ``[mid, end)`` from the environment."""

    turn: Turn | None
    start: int
    mid: int
    end: int


@dataclass
class SampleView:
    index: int
    segments: list[Segment] = field(default_factory=list)


# ---------------------------------------------------------------------------- inputs


def find_input(path: Path) -> Path:
    """The JSONL file behind a run folder or eval folder, or ``path`` itself."""
    if path.is_dir():
        for name in ("samples.jsonl", "results.jsonl"):
            if (path / name).is_file():
                return path / name
        raise ViewError(f"{path}: no samples.jsonl (run folder) or results.jsonl (eval folder) in it")
    if not path.exists():
        raise ViewError(f"no such file or folder: {path}")
    return path


def read_episodes(path: Path) -> list[Episode]:
    """Trajectory records of a results.jsonl or samples.jsonl; a bad line is an error naming it."""
    episodes = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ViewError(f"{path}:{n}: not JSON ({exc.msg})") from None
            except RecursionError:
                raise ViewError(f"{path}:{n}: nested too deeply to read") from None
            if not isinstance(data, dict) or "samples" not in data or "turns" not in data:
                raise ViewError(
                    f"{path}:{n}: not a trajectory record (no 'samples' and 'turns'); "
                    "samples.jsonl files written before agentrl view existed hold only text"
                )
            data.pop("text", None)
            problems: list[str] = []
            try:
                step = _whole(data.pop("step", None), "step", problems, None)
                traj = Trajectory.from_dict(sanitise(data, problems))
            except (TypeError, ValueError) as exc:
                raise ViewError(f"{path}:{n}: not a trajectory record ({exc})") from None
            episodes.append(Episode(traj, step, problems))
    if not episodes:
        raise ViewError(f"{path}: no episodes in it")
    episodes.sort(key=lambda e: (e.step or 0, _order(e.traj.group), _order(e.traj.index)))
    return episodes


def sanitise(data: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """A trajectory record with every field the page computes with of the right type.

    A hand-edited or foreign results file may hold a string reward, a list as a seed or a tool call
    that is not an object; such values are coerced (numbers that are not numbers become NaN, ids
    become text) and named in ``problems``, which the page shows on the episode. Token ids that are
    not integers cannot be shown at all: ValueError. Everything textual is escaped by the page.
    """
    out = dict(data)
    out["task"] = data["task"] if isinstance(data.get("task"), dict) else {"task": data.get("task")}
    for key in ("seed", "group", "index"):
        value = data.get(key, 0 if key != "seed" else None)
        if not (value is None or type(value) is int):
            problems.append(f"{key} is not an integer ({_short(value)})")
            value = _short(value)
        out[key] = value
    out["reward"] = _real(data.get("reward", 0.0), "reward", problems)
    out["duration_s"] = _real(data.get("duration_s", 0.0), "duration_s", problems)
    rewards = data.get("rewards") if isinstance(data.get("rewards"), dict) else {}
    out["rewards"] = {str(k): None if v is None else _real(v, f"reward {k}", problems) for k, v in rewards.items()}
    out["finish_reason"] = _text(data.get("finish_reason", ""))
    out["error"] = None if data.get("error") is None else _text(data["error"])
    out["truncated"] = bool(data.get("truncated", False))
    out["splits"] = _whole(data.get("splits", 0), "splits", problems, 0)
    out["messages"] = _dicts(data.get("messages"))
    out["samples"] = [_sample(s) for s in _dicts(data.get("samples"))]
    out["turns"] = [_turn(t, i, problems) for i, t in enumerate(_dicts(data.get("turns")))]
    return out


def _sample(s: dict[str, Any]) -> dict[str, Any]:
    out = dict(s)
    for key in ("prompt_ids", "completion_ids", "loss_mask"):
        value = s.get(key, [])
        if not isinstance(value, list) or not all(type(v) is int for v in value):
            raise ValueError(f"sample {key} is not a list of integers")
        out[key] = value
    for key in ("logprobs", "trainer_logprobs"):
        value = s.get(key, [] if key == "logprobs" else None)
        if value is None and key == "trainer_logprobs":
            continue
        if not isinstance(value, list) or not all(v is None or type(v) in (int, float) for v in value):
            raise ValueError(f"sample {key} is not a list of numbers")
        out[key] = [None if v is None else float(v) for v in value]  # null: no log-prob; Trajectory.from_dict makes it NaN
    return out


def _turn(t: dict[str, Any], i: int, problems: list[str]) -> dict[str, Any]:
    out = dict(t)
    out["index"] = _whole(t.get("index", i), f"turn {i + 1} index", problems, i)
    for key in ("num_sampled", "num_env_tokens"):
        out[key] = max(0, _whole(t.get(key, 0), f"turn {i + 1} {key}", problems, 0))
    for key in ("reward", "generation_s", "env_s"):
        out[key] = _real(t.get(key, 0.0), f"turn {i + 1} {key}", problems)
    out["finish_reason"] = _text(t.get("finish_reason", ""))
    out["bridge"] = _text(t.get("bridge", ""))
    message = dict(t["message"]) if isinstance(t.get("message"), dict) else {}
    calls = message.get("tool_calls")
    if calls is not None:
        message["tool_calls"] = [_with_text_id(c, "id") for c in _dicts(calls)]
    out["message"] = message
    out["env_messages"] = [_with_text_id(m, "tool_call_id") for m in _dicts(t.get("env_messages"))]
    out["tool_records"] = [_texts(_with_text_id(r, "call_id"), ("kind", "tool", "detail")) for r in _dicts(t.get("tool_records"))]
    out["parse_issues"] = [_texts(i, ("kind", "detail")) for i in _dicts(t.get("parse_issues"))]
    return out


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _with_text_id(d: dict[str, Any], key: str) -> dict[str, Any]:
    """Ids join calls to their results (dict keys): anything but text or None becomes text."""
    if d.get(key) is None or isinstance(d.get(key), str):
        return d
    return {**d, key: _short(d[key])}


def _texts(d: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """Fields the page counts or prints as labels, as text."""
    return {**d, **{k: _text(d[k]) for k in keys if k in d and not isinstance(d[k], str)}}


def _real(value: Any, name: str, problems: list[str]) -> float:
    if type(value) in (int, float, bool):
        return float(value)
    problems.append(f"{name} is not a number ({_short(value)})")
    return math.nan


def _whole(value: Any, name: str, problems: list[str], default: Any) -> Any:
    if value is None or type(value) is int:
        return default if value is None else value
    problems.append(f"{name} is not an integer ({_short(value)})")
    return default


def _text(value: Any) -> str:
    return value if isinstance(value, str) else _short(value)


def _short(value: Any, n: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= n else text[: n - 1] + "…"


def _order(value: Any) -> tuple[int, Any]:
    """Sort key that puts integers first and never compares an integer with text."""
    return (0, value) if type(value) is int else (1, str(value))


def tokenizer_candidates(jsonl: Path) -> list[str]:
    """Where the run's tokenizer is, most exact first: the latest checkpoint, then the configured model."""
    folder = jsonl.parent
    out: list[str] = []
    checkpoints = folder / "checkpoints"
    if checkpoints.is_dir():
        done = sorted(p for p in checkpoints.iterdir() if p.name.startswith("step-") and not p.name.endswith(".tmp"))
        out += [str(p) for p in reversed(done) if (p / "tokenizer_config.json").is_file()][:1]
    for name, keys in (("config.json", ("model", "path")), ("summary.json", ("config", "model", "path"))):
        try:
            value: Any = json.loads((folder / name).read_text())
            for key in keys:
                value = value[key]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(value, str) and value not in out:
            out.append(value)
    return out


def load_tokenizer(candidates: list[str]) -> tuple[Any, str]:
    """The first tokenizer that loads, and a note saying which (or why none did)."""
    from agentrl.compute.models import load_tokenizer as load

    errors = []
    for spec in candidates:
        try:
            return load(spec), f"tokens decoded with the tokenizer of {spec}"
        except Exception as exc:  # a moved folder or an offline hub id: try the next one
            errors.append(f"{spec}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    why = "; ".join(errors) if errors else "none named next to the file"
    return None, f"no tokenizer could be loaded ({why}); tokens are shown as ids — pass tokenizer=PATH"


class Decoder:
    """Token ids to text: whole runs, and one piece per token for the token view."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[tuple[int, ...], str] = {}

    def text(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return "".join(f"[{i}]" for i in ids)
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def pieces(self, ids: list[int], context: list[int] | None = None) -> list[str]:
        """Text each token adds, decoded with a few tokens of left context (``context`` precedes ``ids``).

        A byte-level token may hold part of a character: it gets "" and the token that completes
        the character gets all of it, so the pieces join to the decoded text. The left context
        also keeps the word-initial spaces that SentencePiece decoders drop from a first token.
        """
        if self.tokenizer is None:
            return [f"[{i}]" for i in ids]
        ctx = list(context or [])[-WINDOW:]
        seq = ctx + list(ids)
        out = []
        for i in range(len(ctx), len(seq)):
            lo = max(0, i - WINDOW)
            before = self._window(tuple(seq[lo:i])).rstrip("\ufffd") if i > lo else ""
            full = self._window(tuple(seq[lo : i + 1])).rstrip("\ufffd")
            out.append(full[len(before) :] if full.startswith(before) else self._window((seq[i],)))
        return out

    def _window(self, ids: tuple[int, ...]) -> str:
        """Decode a short window, cached: the same few tokens recur across a run's episodes."""
        text = self._cache.get(ids)
        if text is None:
            text = self.text(list(ids))
            if len(self._cache) < 500_000:
                self._cache[ids] = text
        return text


# ---------------------------------------------------------------------------- what happened


def align(traj: Trajectory) -> tuple[list[SampleView], str]:
    """Split each sample's completion into turns (sampled tokens, then environment tokens).

    The turn records say how many tokens each turn sampled and appended; the loss mask must agree.
    If it does not, the segments follow the mask alone and the second value says what disagreed.
    """
    views = [SampleView(k) for k in range(len(traj.samples))]
    k, pos = 0, 0
    problem = ""
    for turn in traj.turns:
        if k >= len(traj.samples):
            problem = f"turn {turn.index + 1} has no sample left (records name more turns than the tokens hold)"
            break
        mask = traj.samples[k].loss_mask
        mid, end = pos + turn.num_sampled, pos + turn.num_sampled + turn.num_env_tokens
        if end > len(mask) or any(m != 1 for m in mask[pos:mid]) or any(m != 0 for m in mask[mid:end]):
            problem = f"turn {turn.index + 1}: {turn.num_sampled} sampled + {turn.num_env_tokens} environment tokens do not match the loss mask of sample {k}"
            break
        views[k].segments.append(Segment(turn, pos, mid, end))
        pos = end
        if turn.bridge.startswith("split"):
            k, pos = k + 1, 0
    if not problem:
        for view, sample in zip(views, traj.samples):
            covered = view.segments[-1].end if view.segments else 0
            if covered != len(sample.completion_ids):
                problem = f"sample {view.index}: the turn records cover {covered} of {len(sample.completion_ids)} completion tokens"
                break
    if problem:
        views = [SampleView(k, mask_segments(s.loss_mask)) for k, s in enumerate(traj.samples)]
    return views, problem


def mask_segments(mask: list[int]) -> list[Segment]:
    """Runs of sampled tokens, each followed by its run of environment tokens."""
    segments: list[Segment] = []
    i = 0
    while i < len(mask):
        start = i
        while i < len(mask) and mask[i] == 1:
            i += 1
        mid = i
        while i < len(mask) and mask[i] == 0:
            i += 1
        segments.append(Segment(None, start, mid, i))
    return segments


LIMITS = {"length": "max_tokens_per_turn", "max_tokens": "max_completion_tokens", "context": "max_context"}


def ending(traj: Trajectory) -> str:
    """One sentence on how the episode ended, naming a cut or a rollback."""
    if traj.error:
        return f"failed: {traj.error} (excluded from scoring)"
    if traj.finish_reason == "stop":
        return "the environment ended the episode"
    if traj.finish_reason == "max_turns":
        return "truncated: the turn limit was reached"
    limit = LIMITS.get(traj.finish_reason)
    if limit is None:
        return f"finish reason {traj.finish_reason or 'unknown'}"
    last = traj.turns[-1] if traj.turns else None
    if last is not None and last.finish_reason != "stop":
        return f"truncated: cut mid-turn by the {limit} budget (turn {last.index + 1} has no end-of-turn token)"
    if last is not None and last.env_messages and last.num_env_tokens == 0:
        n = len(last.env_messages)
        return f"truncated: the environment's reply to turn {last.index + 1} ({n} message{'s' * (n != 1)}) did not fit the {limit} budget and was rolled back"
    return f"truncated: the {limit} budget was used up before the next turn"


def deltas(traj: Trajectory) -> list[float]:
    """Trainer minus sampler logprob of every sampled token that has both (a demonstrated
    episode's tokens have no sampler logprob: NaN, agentrl/rollout/guidance.py)."""
    out = []
    for s in traj.samples:
        if s.trainer_logprobs is not None:
            out += [t - lp for t, lp, m in zip(s.trainer_logprobs, s.logprobs, s.loss_mask) if m and math.isfinite(lp)]
    return out


def flags(traj: Trajectory) -> list[str]:
    """Filterable properties of an episode (the page's "only" checkboxes)."""
    kinds = {r.kind for turn in traj.turns for r in turn.tool_records}
    out = []
    if traj.error:
        out.append("error")
    if kinds & FAILURES:
        out.append("toolfail")
    if any(turn.parse_issues for turn in traj.turns):
        out.append("parse")
    if traj.truncated:
        out.append("truncated")
    if traj.splits:
        out.append("split")
    if any(s.trainer_logprobs is not None and any(s.loss_mask) for s in traj.samples):
        out.append("trainer")
    return out


def summary(episodes: list[Episode]) -> list[tuple[str, str]]:
    """Rows of the table at the top of the page."""
    trajs = [e.traj for e in episodes]
    ok = [t for t in trajs if t.ok]
    rewards = [t.reward for t in ok if math.isfinite(t.reward)]
    groups = {(e.step, e.traj.group) for e in episodes}
    records = [r for t in trajs for turn in t.turns for r in turn.tool_records]
    kinds = Counter(r.kind for r in records)
    issues = Counter(i.get("kind", "?") for t in trajs for turn in t.turns for i in turn.parse_issues)
    finish = Counter(t.finish_reason or "?" for t in trajs)
    steps = sorted({e.step for e in episodes if e.step is not None})
    rows = [("episodes", f"{len(trajs)} in {len(groups)} groups ({len(trajs) - len(ok)} failed)")]
    if steps:
        rows.append(("training steps", f"{steps[0]}–{steps[-1]} ({len(steps)} logged)"))
    if rewards:
        std = statistics.pstdev(rewards) if len(rewards) > 1 else 0.0
        positive = sum(r > 0 for r in rewards)
        rows.append(("reward", f"mean {statistics.fmean(rewards):.3f} ± {std:.3f}, min {min(rewards):g}, max {max(rewards):g}; {positive} of {len(rewards)} > 0"))
    for name in sorted({k for t in ok for k in t.rewards}):
        values = [v for t in ok if (v := t.rewards.get(name)) is not None and math.isfinite(v)]
        if values:
            rows.append((f"reward: {name}", f"mean {statistics.fmean(values):.3f} over {len(values)} episodes"))
    rows.append(("finish", ", ".join(f"{k} {v}" for k, v in finish.most_common())))
    rows.append(("truncated / split", f"{sum(t.truncated for t in trajs)} truncated; {sum(t.splits > 0 for t in trajs)} episodes split ({sum(t.splits for t in trajs)} splits)"))
    failed = sum(v for k, v in kinds.items() if k in FAILURES)
    detail = ", ".join(f"{k} {v}" for k, v in kinds.most_common() if k != "ok")
    rows.append(("tool calls", f"{len(records)} calls, {failed} failed" + (f" ({detail})" if detail else "")))
    rows.append(("parse issues", ", ".join(f"{k} {v}" for k, v in issues.most_common()) or "none"))
    turns = [len(t.turns) for t in trajs]
    rows.append(("turns", f"mean {statistics.fmean(turns):.2f}, max {max(turns)}"))
    sampled = [t.num_sampled for t in trajs]
    rows.append(("tokens", f"{sum(sampled)} sampled (mean {statistics.fmean(sampled):.1f}), {sum(t.num_env_tokens for t in trajs)} from the environment"))
    d = [abs(x) for t in trajs for x in deltas(t)]
    if d:
        rows.append(("trainer − sampler logprob", f"mean |Δ| {statistics.fmean(d):.2e}, max |Δ| {max(d):.2e} over {len(d)} tokens of {sum(bool(deltas(t)) for t in trajs)} episodes"))
    else:
        rows.append(("trainer − sampler logprob", "not recorded (the trainer stores it on the samples it logs; evals have none)"))
    return rows


def lp_bucket(logprob: float) -> int:
    """0 (probability >= 0.9) to 4 (< 0.05): how surprising the sampled token was."""
    p = math.exp(min(0.0, logprob))
    return 0 if p >= 0.9 else 1 if p >= 0.5 else 2 if p >= 0.2 else 3 if p >= 0.05 else 4


def delta_bucket(delta: float) -> int:
    """0 (|Δ| < 1e-3) to 4 (>= 0.5)."""
    d = abs(delta)
    return 0 if d < 1e-3 else 1 if d < 1e-2 else 2 if d < 0.1 else 3 if d < 0.5 else 4
