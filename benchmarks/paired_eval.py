"""Paired before/after comparison of two ``agentrl eval`` runs on the same tasks: gained, lost, sign test.

Why: a pass@1 difference between two models on the same held-out tasks is judged by the tasks
that changed, not by two independent proportions. Each task is matched by its question (and env
seed); a task passes when its episode's reward reaches ``--threshold`` (the calculator's correct
answer scores at least 1). The sign test counts gained (fail -> pass) against lost (pass -> fail):
z = (gained - lost) / sqrt(gained + lost), with the exact two-sided binomial p-value beside it.
Episodes that died of an infrastructure error are counted and left out of the pairing.

    python benchmarks/paired_eval.py outputs/eval-before outputs/eval-after [--markdown]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any


def load(folder: Path) -> tuple[dict[str, Any], dict[tuple[str, Any], dict[str, Any]]]:
    """``summary.json`` and the episodes of ``results.jsonl`` keyed by (question, seed) (k = 1)."""
    for name in ("summary.json", "results.jsonl"):
        if not (folder / name).is_file():
            sys.exit(f"{folder}: no {name} (expected an `agentrl eval` output folder)")
    summary = json.loads((folder / "summary.json").read_text())
    if summary.get("k", 1) != 1:
        sys.exit(f"{folder}: k={summary['k']}; the paired test compares one episode per task (k=1)")
    episodes: dict[tuple[str, Any], dict[str, Any]] = {}
    for line in (folder / "results.jsonl").read_text().splitlines():
        if line.strip():
            t = json.loads(line)
            task = t.get("task") or {}
            episodes[(str(task.get("question", task.get("prompt"))), t.get("seed"))] = t
    return summary, episodes


def calls(t: dict[str, Any]) -> int:
    return sum(len(turn.get("tool_records") or []) for turn in t.get("turns") or [])


def sign_test(gained: int, lost: int) -> tuple[float, float]:
    """(z, exact two-sided binomial p) of ``gained`` against ``lost`` under p = 1/2."""
    n = gained + lost
    if n == 0:
        return 0.0, 1.0
    z = (gained - lost) / math.sqrt(n)
    k = min(gained, lost)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return z, min(1.0, 2 * tail)


def compare(before: Path, after: Path, threshold: float = 1.0) -> dict[str, Any]:
    sb, eb = load(before)
    sa, ea = load(after)
    common = sorted(set(eb) & set(ea), key=str)
    if not common:
        sys.exit(f"{before} and {after} share no task: not the same split or env seed")
    ok = [key for key in common if not eb[key].get("error") and not ea[key].get("error")]
    passed = {side: [(ep[key].get("reward") or 0.0) >= threshold for key in ok] for side, ep in (("before", eb), ("after", ea))}
    gained = sum(1 for b, a in zip(passed["before"], passed["after"]) if a and not b)
    lost = sum(1 for b, a in zip(passed["before"], passed["after"]) if b and not a)
    z, p = sign_test(gained, lost)
    side = {}
    for name, summary, ep in (("before", sb, eb), ("after", sa, ea)):
        side[name] = {
            "pass@1": sum(passed[name]) / len(ok),
            "well_formed_call_rate": summary.get("well_formed_call_rate"),
            "tool_calls": summary.get("tool_calls"),
            "calls_per_task": sum(calls(ep[key]) for key in ok) / len(ok),
            "sampled_tokens_mean": summary.get("sampled_tokens_mean"),
            "elapsed_s": summary.get("elapsed_s"),
        }
    return {
        "tasks": len(ok), "unmatched": len(set(eb) ^ set(ea)), "errors": len(common) - len(ok),
        "before": side["before"], "after": side["after"], "gained": gained, "lost": lost, "z": z, "p": p,
    }


def markdown(row: dict[str, Any], label: str) -> str:
    b, a = row["before"], row["after"]

    def wf(s: dict[str, Any]) -> str:
        return "–" if not s["tool_calls"] else f"{s['well_formed_call_rate']:.1%} of {s['tool_calls']}"

    return (
        f"| {label} | {row['tasks']} | {b['pass@1']:.1%} | {a['pass@1']:.1%} | {wf(b)} | {wf(a)} | {b['calls_per_task']:.2f} | "
        f"{a['calls_per_task']:.2f} | {row['gained']} / {row['lost']} | {row['z']:.2f} | {row['p']:.1e} |"
    )


HEADER = (
    "| split | tasks | pass@1 before | pass@1 after | well-formed calls before | after | calls/task before | after | gained / lost | z | p |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--threshold", type=float, default=1.0, help="an episode passes when its reward >= this")
    ap.add_argument("--markdown", metavar="LABEL", help="print a RESULTS.md table row labelled LABEL")
    args = ap.parse_args()
    row = compare(args.before, args.after, args.threshold)
    print(json.dumps(row, indent=2))
    if args.markdown:
        print(HEADER)
        print(markdown(row, args.markdown))


if __name__ == "__main__":
    main()
