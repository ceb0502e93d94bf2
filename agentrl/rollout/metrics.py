"""Batch metrics of a rollout: throughput, turns, tools, tokens, truncation, splits, errors."""

from __future__ import annotations

from collections import Counter
from typing import Any

from agentrl.core.records import FAILURES, MALFORMED
from agentrl.core.trajectory import Trajectory, TrajectoryGroup


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (0 for an empty list)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def rollout_metrics(groups: list[TrajectoryGroup] | list[Trajectory], elapsed_s: float | None = None) -> dict[str, Any]:
    """Flat metrics dict (keys like ``tools/failures/timeout``) for logs and tables."""
    every = [t for g in groups for t in (g.trajectories if isinstance(g, TrajectoryGroup) else [g])]
    trajs = [t for t in every if not t.guided]  # demonstrated episodes (agentrl/rollout/guidance.py) are counted, not measured
    ok = [t for t in trajs if t.ok]
    records = [r for t in ok for turn in t.turns for r in turn.tool_records]
    latencies = [r.latency_s for r in records]
    turns = [len(t.turns) for t in ok]
    sampled = sum(t.num_sampled for t in ok)
    env_tokens = sum(t.num_env_tokens for t in ok)
    call_turns = [turn for t in ok for turn in t.turns if turn.message.get("tool_calls") or _tried_call(turn)]
    malformed_turns = [
        turn for turn in call_turns if turn.parse_issues or any(r.kind in MALFORMED for r in turn.tool_records)
    ]
    out: dict[str, Any] = {
        "episodes": len(trajs),
        "episodes/errors": len(trajs) - len(ok),
        "turns/mean": _mean(turns),
        "turns/max": max(turns, default=0),
        "tools/calls": len(records),
        "tools/failures": sum(r.kind in FAILURES for r in records),
        "tools/latency_p50_s": percentile(latencies, 50),
        "tools/latency_p95_s": percentile(latencies, 95),
        "tools/well_formed_rate": 1 - len(malformed_turns) / len(call_turns) if call_turns else 0.0,
        "tokens/sampled": sampled,
        "tokens/environment": env_tokens,
        "truncated_rate": _mean([float(t.truncated) for t in ok]),
        "prefix_splits": sum(t.splits for t in ok),
        "bridges/proven": sum(turn.bridge == "proven" for t in ok for turn in t.turns),
        "reward/mean": _mean([t.reward for t in ok]),
    }
    if len(every) > len(trajs):
        out["guided"] = len(every) - len(trajs)
    reward_errors = sum(t.finish_reason == "reward_error" for t in trajs)
    if reward_errors:  # rollout.reward_errors=drop: left out, and shown on the step line
        out["episodes/reward_errors"] = reward_errors
    for kind, count in sorted(Counter(r.kind for r in records if r.kind != "ok").items()):
        out[f"tools/failures/{kind}"] = count
    for (tool, kind), count in sorted(Counter((r.tool, r.kind) for r in records if r.kind in FAILURES).items()):
        out[f"tools/failures/{tool}/{kind}"] = count
    for reason, count in sorted(Counter(t.finish_reason for t in trajs).items()):
        out[f"finish/{reason}"] = count
    if elapsed_s:
        out["elapsed_s"] = elapsed_s
        out["episodes_per_s"] = len(ok) / elapsed_s
        out["sampled_tokens_per_s"] = sampled / elapsed_s
    return out


def _tried_call(turn: Any) -> bool:
    return any(issue["kind"] in ("bad_json", "missing_name", "bad_name", "unclosed_tag") for issue in turn.parse_issues)


def _mean(values: list[float] | list[int]) -> float:
    return sum(values) / len(values) if values else 0.0
