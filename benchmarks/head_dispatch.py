"""How many ops the fused log-prob head issues, and how long Python takes to issue them.

    python benchmarks/head_dispatch.py                      # the head at this checkout
    python benchmarks/head_dispatch.py --ref b264b7e        # and agentrl/compute/logprobs.py at a revision
    python benchmarks/head_dispatch.py --compiled           # also count the compiled tiles' ops

Runs ``_LinearLogprob`` forward and backward on the ``meta`` device (shapes only, no kernels), so
the time is dispatch alone: what the host spends per micro-batch whatever the accelerator. On an
H200 the head's kernels are short enough that this sets the pace when tiles are many (see
benchmarks/RESULTS.md, 2026-11-29 call K). Default shapes: Qwen2.5-0.5B's 151,936 x 896 head, one
micro-batch of 16 x 512 sampled positions, bf16 compute, entropies on (as the learner asks).

The compiled tiles (``agentrl/compute/head_tiles.py``, the learner's head when it compiles its layers)
cannot run on ``meta``; ``--compiled`` counts their ops on the CPU with real tensors instead (a
narrow hidden size: the count does not depend on it), each compiled call as one, and no time.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
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
        from agentrl.compute import logprobs
        return logprobs
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:agentrl/compute/logprobs.py"], check=True, capture_output=True, text=True).stdout
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

    extra = (False,) if "compiled" in inspect.signature(mod._LinearLogprob.forward).parameters else ()  # revisions before it

    def once() -> None:
        lp, _ = mod._LinearLogprob.apply(h, w, None, t, 1.0, None, torch.bfloat16, rows, cols, True, False, *extra)
        lp.sum().backward()

    with _Count() as count:
        once()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    return {"tile_rows": rows, "tile_cols": cols, "ops": count.ops, "dispatch_ms": 1e3 * statistics.median(times)}


def count_compiled(positions: int, vocab: int, chunk: int) -> tuple[int, int]:
    """(ops outside the compiled calls, compiled calls) of one forward and backward with compiled tiles."""
    sys.path.insert(0, str(ROOT))
    from torch.utils._python_dispatch import _disable_current_modes

    from agentrl.compute import head_tiles, logprobs
    rows, cols = logprobs.tile_shape(chunk, vocab)
    calls = [0]
    real = head_tiles.compiled

    def counted(name: str):  # type: ignore[no-untyped-def]
        fn = real(name)

        def run(*a):  # type: ignore[no-untyped-def]
            calls[0] += 1
            with _disable_current_modes():  # the compiled code's own work is not dispatched ops
                return fn(*a)
        return run

    h = torch.randn(positions, 8, requires_grad=True)
    w = torch.randn(vocab, 8, requires_grad=True)
    t = torch.randint(0, vocab, (positions,))

    def once() -> None:
        lp, _ = logprobs._LinearLogprob.apply(h, w, None, t, 1.0, None, torch.bfloat16, rows, cols, True, False, True)
        lp.sum().backward()

    head_tiles.compiled = counted  # type: ignore[assignment]
    try:
        once()  # compiles
        calls[0] = 0
        with _Count() as count:
            once()
    finally:
        head_tiles.compiled = real
    return count.ops, calls[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", action="append", default=[], help="also measure agentrl/compute/logprobs.py at this git revision")
    ap.add_argument("--positions", type=int, default=16 * 512)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--chunks", default="256,1024", help="logprob_chunk_size values")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--compiled", action="store_true", help="also count the compiled tiles' ops (CPU, this checkout)")
    args = ap.parse_args()
    print("| head | chunk | tile | ops | dispatch ms (median) |\n|---|---|---|---|---|")
    for ref in [None, *args.ref]:
        mod = _module(ref)
        for chunk in (int(c) for c in args.chunks.split(",")):
            r = measure(mod, args.positions, args.hidden, args.vocab, chunk, args.repeats)
            print(f"| {ref or 'this checkout'} | {chunk} | {r['tile_rows']} x {r['tile_cols']} | {r['ops']:,} | {r['dispatch_ms']:.1f} |")
    if args.compiled:
        for chunk in (int(c) for c in args.chunks.split(",")):
            ops, calls = count_compiled(args.positions, args.vocab, chunk)
            print(f"| this checkout, compiled tiles | {chunk} | | {ops:,} and {calls} compiled calls | (not timed) |")


if __name__ == "__main__":
    main()
