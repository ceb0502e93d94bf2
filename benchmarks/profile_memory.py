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
    torch.cuda.memory._record_memory_history(max_entries=2_000_000)
    os.environ.setdefault("AGENTRL_BENCH_EXTRA", "")
    bench.run_agentrl(args.model, P, G, N, 2, cpu=False)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    peak_live: dict[int, tuple[int, str]] = {}
    for event in snap["device_traces"][0]:
        action, addr, size = event["action"], event["addr"], event["size"]
        if action == "alloc":
            live[addr] = (size, where(event.get("frames", [])))
            total += size
            if total > peak:
                peak, peak_live = total, dict(live)
        elif action in ("free_requested", "free_completed") and addr in live and action == "free_completed":
            total -= live.pop(addr)[0]
    by_site = collections.Counter()
    for size, site in peak_live.values():
        by_site[site] += size
    print(f"peak of traced allocations: {peak / 2**30:.2f} GiB (allocations made before recording started are not included)")
    for site, size in by_site.most_common(18):
        print(f"{size / 2**30:7.2f} GiB  {site}")


if __name__ == "__main__":
    main()
