"""Evaluation through the rollout engine: pass@k, pass^k, results.jsonl and summary.json.

pass@k (at least one of k samples passes) and pass^k (all k pass) use the unbiased estimators
over the n samples drawn per task: pass@k = 1 - C(n-c, k) / C(n, k), pass^k = C(c, k) / C(n, k),
with c the passing samples. Episodes that died of an infrastructure error are excluded and counted.
"""

from __future__ import annotations

import json
import statistics
import time
from math import comb
from pathlib import Path
from typing import Any

from agentrl.core.trajectory import TrajectoryGroup, write_jsonl
from agentrl.rollout.engine import RolloutEngine
from agentrl.rollout.metrics import rollout_metrics


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples (drawn without replacement from n) passes."""
    if k > n:
        raise ValueError(f"k={k} > n={n} samples")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Probability that all of k samples (drawn without replacement from n) pass."""
    if k > n:
        raise ValueError(f"k={k} > n={n} samples")
    return comb(c, k) / comb(n, k)


async def evaluate(
    engine: RolloutEngine, env: Any, tasks: list[dict[str, Any]], k: int, seed: int, on_episode: Any = None
) -> tuple[list[TrajectoryGroup], float]:
    """Run ``k`` episodes per task through the engine; returns the groups and the elapsed seconds."""
    start = time.perf_counter()
    groups = await engine.run(env, tasks, n=k, seed=seed, on_episode=on_episode)
    return groups, time.perf_counter() - start


def summarize(groups: list[TrajectoryGroup], k: int, pass_threshold: float, elapsed_s: float) -> dict[str, Any]:
    rewards = [t.reward for g in groups for t in g.ok]
    p1, pk, phk = [], [], []
    for g in groups:
        n = len(g.ok)
        if n == 0:
            continue
        c = sum(t.reward >= pass_threshold for t in g.ok)
        p1.append(c / n)
        if n >= k:
            pk.append(pass_at_k(n, c, k))
            phk.append(pass_hat_k(n, c, k))
    metrics = rollout_metrics(groups, elapsed_s)
    tokens = [t.num_sampled for g in groups for t in g.ok]
    return {
        "tasks": len(groups),
        "k": k,
        "episodes": metrics["episodes"],
        "errors": metrics["episodes/errors"],
        "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "pass@1": statistics.fmean(p1) if p1 else 0.0,
        f"pass@{k}": statistics.fmean(pk) if pk else 0.0,
        f"pass^{k}": statistics.fmean(phk) if phk else 0.0,
        "well_formed_call_rate": metrics["tools/well_formed_rate"],
        "tool_calls": metrics["tools/calls"],
        "tool_failures": metrics["tools/failures"],
        "turns_mean": metrics["turns/mean"],
        "sampled_tokens_mean": statistics.fmean(tokens) if tokens else 0.0,
        "truncated_rate": metrics["truncated_rate"],
        "prefix_splits": metrics["prefix_splits"],
        "elapsed_s": round(elapsed_s, 2),
        "episodes_per_s": metrics.get("episodes_per_s", 0.0),
        "metrics": metrics,
    }


def write_results(out_dir: str | Path, groups: list[TrajectoryGroup], summary: dict[str, Any], config: dict[str, Any]) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl([t for g in groups for t in g.trajectories], out / "results.jsonl")
    (out / "summary.json").write_text(json.dumps({**summary, "config": config}, indent=2, default=str) + "\n")
    return out


def format_summary(summary: dict[str, Any]) -> str:
    """A plain-text table (also what the CLI prints)."""
    k = summary["k"]
    rows = [
        ("tasks x samples", f"{summary['tasks']} x {k} ({summary['errors']} errors)"),
        ("reward", f"{summary['reward_mean']:.3f} ± {summary['reward_std']:.3f}"),
        ("pass@1", f"{summary['pass@1']:.3f}"),
        *([(f"pass@{k}", f"{summary[f'pass@{k}']:.3f}"), (f"pass^{k}", f"{summary[f'pass^{k}']:.3f}")] if k > 1 else []),
        ("well-formed calls", f"{summary['well_formed_call_rate']:.1%} of {summary['tool_calls']} calls"),
        ("tool failures", str(summary["tool_failures"])),
        ("turns (mean)", f"{summary['turns_mean']:.2f}"),
        ("sampled tokens (mean)", f"{summary['sampled_tokens_mean']:.1f}"),
        ("truncated", f"{summary['truncated_rate']:.1%}"),
        ("prefix splits", str(summary["prefix_splits"])),
        ("time", f"{summary['elapsed_s']:.1f} s ({summary['episodes_per_s']:.1f} episodes/s)"),
    ]
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
