"""Which allocations make up the training step's peak CUDA memory, grouped by the code that made them.

    python benchmarks/profile_memory.py --model <folder> [--row 8x8x256]

Runs two agentrl steps of the gpu_vs_trl.py single-turn setup with CUDA memory history recording,
replays the allocation trace to find the peak, and prints the live bytes at that moment by the
innermost agentrl/transformers/torch frame that allocated them.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))


def where(frames: list[dict]) -> str:
    picked = []
    for f in frames:
        name = f.get("filename", "")
        if any(k in name for k in ("agentrl", "transformers/models", "transformers/integrations", "torch/utils/checkpoint", "torch/optim", "accelerate")):
            picked.append(f"{Path(name).name}:{f.get('line')} {f.get('name')}")
        if len(picked) == 2:
            break
    return " <- ".join(picked) or (frames[0].get("name", "?") if frames else "?")


def main() -> None:
    import gpu_vs_trl as bench

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--row", default="8x8x256")
    args = ap.parse_args()
    P, G, N = (int(x) for x in args.row.split("x"))
    # Python stacks only: with C++ stacks too (the default, "all") the compiled training forward
    # failed under recording on an H200 (SystemError from an autograd Function's apply, calls 22
    # and 23 of benchmarks/RESULTS.md) and the learner fell back to eager, so its peak was not the
    # default path's
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    os.environ.setdefault("AGENTRL_BENCH_EXTRA", "")
    bench.run_agentrl(args.model, P, G, N, 2, cpu=False)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = snap["device_traces"][0]
    # pass 1: the total live bytes after each event, and the highest total reached while the
    # rollout (a frame in agentrl/generators) or the learning (learner, logprobs, losses) allocated
    sizes: dict[int, int] = {}
    total, peaks = 0, {"rollout": (0, -1), "training": (0, -1)}
    for i, event in enumerate(events):
        action, addr, size = event["action"], event["addr"], event["size"]
        if action == "alloc":
            sizes[addr] = size
            total += size
            phase = phase_of(event.get("frames", []))
            if phase and total > peaks[phase][0]:
                peaks[phase] = (total, i)
        elif action == "free_completed" and addr in sizes:
            total -= sizes.pop(addr)
    print("allocations made before recording started are not included")
    for phase, (peak, at) in peaks.items():
        if at < 0:
            continue
        # pass 2: what was live at that event, grouped by where it was allocated
        live: dict[int, tuple[int, str]] = {}
        for event in events[: at + 1]:
            action, addr, size = event["action"], event["addr"], event["size"]
            if action == "alloc":
                live[addr] = (size, where(event.get("frames", [])))
            elif action == "free_completed":
                live.pop(addr, None)
        by_site: collections.Counter[str] = collections.Counter()
        for size, site in live.values():
            by_site[site] += size
        print(f"\n{phase} peak of traced allocations: {peak / 2**30:.2f} GiB (event {at} of {len(events)})")
        for site, size in by_site.most_common(18):
            print(f"{size / 2**30:7.2f} GiB  {site}")
    print(f"\ntorch.cuda.max_memory_allocated: {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")


def phase_of(frames: list[dict]) -> str | None:
    """``rollout`` or ``training`` by the agentrl module that allocated, else None."""
    for f in frames:
        name = f.get("filename", "")
        if "agentrl/generators" in name:
            return "rollout"
        if any(k in name for k in ("agentrl/learner", "agentrl/logprobs", "agentrl/losses", "torch/optim")):
            return "training"
    return None

if __name__ == "__main__":
    main()
