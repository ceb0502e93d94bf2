"""Where the training phase of a step goes on CUDA: kernel time by kernel, against wall time.

    python benchmarks/profile_train.py --model <folder> [--row 32x8x512 | --row mt8x8 --sft-seconds 60]

Runs ``--profile-step`` (default 2) agentrl steps of the gpu_vs_trl.py single-turn setup (``mtPxG``: the multi-turn
calculator of multiturn_bench.py, after SFT of ``--sft-seconds``) and profiles the last step's
training phase (log-probs, loss, backward, optimizer) with torch.profiler. Prints the wall time,
the summed CUDA kernel time (the gap between the two is launch and host overhead), and the
kernels that take the most time, so a change to the training path can be predicted and checked.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    import gpu_vs_trl as bench

    import agentrl.learn.learner as L

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--row", default="32x8x512")
    ap.add_argument("--rows", type=int, default=18, help="kernels to list")
    ap.add_argument("--sft-seconds", type=float, default=60, help="mtPxG rows: SFT before the steps")
    ap.add_argument("--sft-model", default=None, help="mtPxG rows: where the SFT model goes; a folder that already holds one is reused")
    ap.add_argument("--profile-step", type=int, default=2, help="which step's training phase to profile (earlier ones warm up)")
    args = ap.parse_args()
    calls = {"n": 0}
    original = L.Learner.learn

    def optimize(self, batch, step):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] != args.profile_step:
            yield from original(self, batch, step)
            return
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        t = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            out = list(original(self, batch, step))
            torch.cuda.synchronize()
        wall = time.perf_counter() - t
        lengths = batch.lengths.float()
        print(f"batch: {len(batch)} rows, length mean {lengths.mean():.0f} max {lengths.max():.0f}, "
              f"{int(batch.loss_mask.sum())} sampled tokens", flush=True)
        events = prof.key_averages()
        print(f"train phase (profiled) wall {wall:.2f} s; CUDA kernel time {kernel_seconds(events):.2f} s", flush=True)
        print(events.table(sort_by="self_cuda_time_total", row_limit=args.rows, max_name_column_width=70), flush=True)
        print(events.table(sort_by="cpu_time_total", row_limit=args.rows, max_name_column_width=70), flush=True)
        print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=70), flush=True)
        yield from out

    L.Learner.learn = optimize
    _label_phases(L)
    os.environ.setdefault("AGENTRL_BENCH_EXTRA", "")
    if args.row.startswith("mt"):
        import tempfile

        import multiturn_bench

        P, G = (int(x) for x in args.row[2:].split("x"))
        model = args.sft_model or tempfile.mkdtemp(prefix="sft-")
        if (Path(model) / "config.json").exists():
            print(f"sft: reusing {model}", flush=True)
        else:
            print("sft:", multiturn_bench.sft(args.model, model, args.sft_seconds), flush=True)
        r = multiturn_bench.run_agentrl(model, P, G, args.profile_step)
    else:
        P, G, N = (int(x) for x in args.row.split("x"))
        r = bench.run_agentrl(args.model, P, G, N, args.profile_step, cpu=False)
    print({k: r[k] for k in ("step_s", "gen_s", "peak_gib")})


def kernel_seconds(events: Any) -> float:
    """Summed time of the CUDA kernels in profiler events (``key_averages()``).

    A ``record_function`` range (the ``agentrl:*`` labels, an optimizer's step) also appears on the
    device's timeline as a user annotation spanning the kernels it launched; counting it would count
    those kernels twice (2.42 s printed where the profiler's own total said 1.30 s, H200, 2026-11-29).
    """
    cuda = torch.autograd.DeviceType.CUDA
    return sum(e.self_device_time_total for e in events
               if e.device_type == cuda and not getattr(e, "is_user_annotation", False)) / 1e6


def _label_phases(L: Any) -> None:
    """Name the learner's phases in the profile (``agentrl:*`` rows: host time spent inside each)."""
    import accelerate
    from torch.profiler import record_function

    def labelled(name: str, fn: Any) -> Any:
        def run(*a: Any, **kw: Any) -> Any:
            with record_function(f"agentrl:{name}"):
                return fn(*a, **kw)
        return run

    L.Learner._logprobs = labelled("forward", L.Learner._logprobs)
    L.Learner._loss = labelled("loss", L.Learner._loss)
    L.Learner._micro_batches = labelled("micro_batches", L.Learner._micro_batches)
    accelerate.Accelerator.backward = labelled("backward", accelerate.Accelerator.backward)
    accelerate.Accelerator.clip_grad_norm_ = labelled("clip_grad_norm", accelerate.Accelerator.clip_grad_norm_)
    accelerate.Accelerator.reduce = labelled("reduce_totals", accelerate.Accelerator.reduce)


if __name__ == "__main__":
    main()
