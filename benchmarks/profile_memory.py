"""Which allocations make up a run's peak CUDA memory, grouped by the code that made them.

    python benchmarks/profile_memory.py --model <folder> [--row 8x8x256] [--steps 3] [--watch modeling_layers.py:109]
    AGENTRL_BENCH_MEMORY=1 python benchmarks/gpu_vs_trl.py ...   # the same summary in the agentrl run's result

``max_memory_allocated`` says how high a run went, not what held the memory there. With
``torch.cuda.memory._record_memory_history`` on from the start of the process, every allocation
and free is an event with the Python stack that made it; replaying them finds the peak (overall,
and while the rollout or the learning allocated) and what was alive at it, by call site, with the
whole stack of one allocation of each of the largest sites and of any ``--watch`` site. Each
site's ``event`` says when that allocation was made: one made in an early step and still alive
at a later step's peak is what a leak looks like (the cuBLAS workspaces of 2026-11-29 in
benchmarks/RESULTS.md were found so). Recording slows a run: do not time it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

HISTORY = 4_000_000  # allocator events kept; older ones are dropped (then the summary says so)
# frames from these folders say who asked for the memory; torch's own frames say only how
OURS = ("/agentrl/", "/transformers/", "/trl/", "/peft/", "/bitsandbytes/", "/benchmarks/", "/accelerate/")


def record() -> None:
    """Start recording (Python stacks only: with C++ stacks too, the compiled training forward
    failed under recording on an H200 (SystemError from an autograd Function's apply, calls 22
    and 23 of benchmarks/RESULTS.md) and the learner fell back to eager)."""
    torch.cuda.memory._record_memory_history(max_entries=HISTORY, stacks="python")


def _inner_first(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return frames[::-1] if frames and frames[0].get("name") == "<module>" else frames


def _line(f: dict[str, Any]) -> str:
    """``folder/file:line function``."""
    return f"{f['filename'].rsplit('/', 2)[-2]}/{f['filename'].rsplit('/', 1)[-1]}:{f['line']} {f['name']}"


def site(frames: list[dict[str, Any]], depth: int = 3) -> str:
    """The innermost frame's function, then the innermost ``depth`` frames of ours."""
    frames = _inner_first(frames)
    if not frames:
        return "(no Python stack: made by the autograd engine, e.g. a gradient)"
    mine = [f for f in frames if any(k in f.get("filename", "") for k in OURS)][:depth] or frames[:1]
    return f"{frames[0]['name']} @ " + " < ".join(_line(f) for f in mine)


def phase_of(frames: list[dict[str, Any]]) -> str | None:
    """``rollout`` or ``training`` by the agentrl module that allocated, else None (generation runs
    through agentrl/compute's model code too, so a generators frame anywhere decides first)."""
    names = [f.get("filename", "") for f in frames]
    if any("agentrl/generators" in n for n in names):
        return "rollout"
    if any(k in n for n in names for k in ("agentrl/learn/", "agentrl/compute/", "torch/optim")):
        return "training"
    return None


def summarise(snapshot: dict[str, Any], device: int = 0, top: int = 20, stacks: int = 6, watch: tuple[str, ...] = ()) -> dict[str, Any]:
    """The peaks of allocated bytes over the recorded events and what was alive at the highest.

    Allocated bytes rise at ``alloc`` and fall at ``free_requested``, as the allocator's own
    counter does (a free waiting on another stream is still freed memory to
    ``max_memory_allocated``). Allocations from before the recording started are unknown.
    """
    events = snapshot["device_traces"][device]
    total, peak, peak_at = 0, 0, -1
    phases = {"rollout": (0, -1), "training": (0, -1)}
    sizes: dict[int, int] = {}
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            sizes[e["addr"]] = e["size"]
            total += e["size"]
            if total > peak:
                peak, peak_at = total, i
            phase = phase_of(e.get("frames", []))
            if phase and total > phases[phase][0]:
                phases[phase] = (total, i)
        elif e["action"] == "free_requested":
            total -= sizes.pop(e["addr"], 0)
    alive: dict[int, tuple[int, dict[str, Any]]] = {}
    for i, e in enumerate(events[: peak_at + 1]):
        if e["action"] == "alloc":
            alive[e["addr"]] = (i, e)
        elif e["action"] == "free_requested":
            alive.pop(e["addr"], None)
    by_site: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for i, e in alive.values():
        by_site[site(e.get("frames", []))].append((i, e))
    ranked = sorted(by_site.items(), key=lambda kv: -sum(e["size"] for _, e in kv[1]))
    shown = [s for s, _ in ranked[:stacks]] + [s for s, _ in ranked[stacks:] if any(w in s for w in watch)]
    first = {s: min(by_site[s], key=lambda ie: ie[0]) for s in shown}  # the site's earliest allocation still alive
    gib = lambda b: round(b / 2**30, 3)
    return {
        "events": len(events),
        "dropped": len(events) >= HISTORY,
        "peak_gib": gib(peak),
        "peak_event": peak_at,
        "phase_peaks": {p: {"gib": gib(b), "event": at} for p, (b, at) in phases.items()},
        "peak_made_by": site(events[peak_at].get("frames", []), depth=6) if peak_at >= 0 else None,
        "sites": [{"gib": gib(sum(e["size"] for _, e in allocs)), "n": len(allocs), "site": s} for s, allocs in ranked[:top]],
        "rest_gib": gib(sum(e["size"] for _, allocs in ranked[top:] for _, e in allocs)),
        "stacks": [
            {
                "site": s, "event": first[s][0], "stream": first[s][1].get("stream"),
                "sizes_mib": sorted({round(e["size"] / 2**20, 2) for _, e in by_site[s]})[:12],
                "frames": [_line(f) for f in _inner_first(first[s][1].get("frames", []))[:30]],
            }
            for s in shown
        ],
    }


def main() -> None:
    import gpu_vs_trl as bench

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--row", default="8x8x256")
    ap.add_argument("--steps", type=int, default=3, help="a leak shows as a site that grows step by step")
    ap.add_argument("--watch", nargs="*", default=[], help="call sites (substrings) whose whole stacks are printed too")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_memory.py records CUDA allocations: it needs a GPU")
    P, G, N = (int(x) for x in args.row.split("x"))
    os.environ["AGENTRL_BENCH_MEMORY"] = "1"
    os.environ["AGENTRL_BENCH_MEMORY_WATCH"] = " ".join(args.watch)
    result = bench.run_agentrl(args.model, P, G, N, args.steps, cpu=False)
    summary = result.pop("memory_at_peak")
    print(json.dumps({k: v for k, v in result.items() if "peak" in k}, indent=1))
    print(f"\npeak of traced allocations {summary['peak_gib']} GiB at event {summary['peak_event']} of {summary['events']}"
          f"{' (oldest events dropped)' if summary['dropped'] else ''}; by phase: {summary['phase_peaks']}")
    print(f"made by: {summary['peak_made_by']}\n")
    for s in summary["sites"]:
        print(f"{s['gib']:7.3f} GiB  {s['n']:5d}  {s['site']}")
    for st in summary["stacks"]:
        print(f"\n{st['site']}: first made at event {st['event']} on stream {st['stream']}, sizes (MiB) {st['sizes_mib']}")
        print("    " + "\n    ".join(st["frames"]))


if __name__ == "__main__":
    main()
