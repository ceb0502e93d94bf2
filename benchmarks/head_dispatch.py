"""How many ops the fused log-prob head issues, and how long Python takes to issue them.

    python benchmarks/head_dispatch.py                      # the head at this checkout
    python benchmarks/head_dispatch.py --ref b264b7e        # and agentrl/logprobs.py at a revision

Runs ``_LinearLogprob`` forward and backward on the ``meta`` device (shapes only, no kernels), so
the time is dispatch alone: what the host spends per micro-batch whatever the accelerator. On an
H200 the head's kernels are short enough that this sets the pace when tiles are many (see
benchmarks/RESULTS.md, 2026-11-29 call K). Default shapes: Qwen2.5-0.5B's 151,936 x 896 head, one
micro-batch of 16 x 512 sampled positions, bf16 compute, entropies on (as the learner asks).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _module(ref: str | None) -> ModuleType:
    if ref is None:
        sys.path.insert(0, str(ROOT))
        from agentrl import logprobs

        return logprobs
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:agentrl/logprobs.py"], check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "logprobs_ref.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"logprobs_{ref}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def measure(mod: ModuleType, positions: int, hidden: int, vocab: int, chunk: int, repeats: int) -> dict[str, float]:
    rows, cols = mod.tile_shape(chunk, vocab)
    h = torch.empty(positions, hidden, device="meta", dtype=torch.bfloat16, requires_grad=True)
    w = torch.empty(vocab, hidden, device="meta", requires_grad=True)
    t = torch.zeros(positions, dtype=torch.long, device="meta")

    def once() -> None:
        lp, _ = mod._LinearLogprob.apply(h, w, None, t, 1.0, None, torch.bfloat16, rows, cols, True, False)
        lp.sum().backward()

    with _Count() as count:
        once()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    return {"tile_rows": rows, "tile_cols": cols, "ops": count.ops, "dispatch_ms": 1e3 * statistics.median(times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", action="append", default=[], help="also measure agentrl/logprobs.py at this git revision")
    ap.add_argument("--positions", type=int, default=16 * 512)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--chunks", default="256,1024", help="logprob_chunk_size values")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print("| head | chunk | tile | ops | dispatch ms (median) |\n|---|---|---|---|---|")
    for ref in [None, *args.ref]:
        mod = _module(ref)
        for chunk in (int(c) for c in args.chunks.split(",")):
            r = measure(mod, args.positions, args.hidden, args.vocab, chunk, args.repeats)
            print(f"| {ref or 'this checkout'} | {chunk} | {r['tile_rows']} x {r['tile_cols']} | {r['ops']:,} | {r['dispatch_ms']:.1f} |")


if __name__ == "__main__":
    main()
