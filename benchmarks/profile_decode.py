"""Where a decode step's time goes on CUDA: graph replay alone, sampling alone, the whole generator.

    python benchmarks/profile_decode.py --model <folder> [--batch 64 --tokens 256]
    python benchmarks/profile_decode.py --model <folder> --batch 256 --tokens 512 --prompt 100 --trainer-like

Prints milliseconds per token step for each part, so changes to the generator can be predicted
and then checked (see benchmarks/RESULTS.md, "GPU log").
"""

from __future__ import annotations

import argparse
import time

import anyio
import torch


def timed(fn, n: int) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1000


def main() -> None:
    from transformers import AutoModelForCausalLM

    from agentrl.generators.hf.generator import TransformersGenerator, sample_next
    from agentrl.generators.hf.static_decode import StaticDecoder
    from agentrl.generators.protocol import SamplingParams

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=40)
    ap.add_argument("--kernels", action="store_true", help="profile the eager step's CUDA kernels")
    ap.add_argument("--only-kernels", action="store_true")
    ap.add_argument("--compile", action="store_true", help="also time the torch.compile'd step (generator.compile_decode)")
    ap.add_argument("--no-dynamic", action="store_true", help="skip the dynamic-cache generator run")
    ap.add_argument("--generator-only", action="store_true", help="skip the replay and sampler timings; time the compiled generator only")
    ap.add_argument("--per-rollout", action="store_true", help="end a rollout after each run as the trainer does (static caches and graphs freed, so recaptured)")
    ap.add_argument("--trainer-like", action="store_true", help="the generator as the trainer builds it (fp32 master, bf16 copy, "
                    "compiled step, seeded requests): each rollout's phases, the replay per active length, a kernel table")
    ap.add_argument("--unseeded", action="store_true", help="--trainer-like without per-request seeds")
    ap.add_argument("--host-sampler", action="store_true", help="--trainer-like with generator.sample_in_step=false (the host launches the sampler after each step)")
    args = ap.parse_args()
    B, N = args.batch, args.tokens
    prompts = [[(13 * i + j) % 1000 + 10 for j in range(args.prompt)] for i in range(B)]
    if args.trainer_like:
        return trainer_like(args.model, prompts, N, seeded=not args.unseeded, in_step=not args.host_sampler)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).cuda().eval()

    for compiled in [] if args.generator_only else [False, True] if args.compile else [False]:
        dec = StaticDecoder(model, 0, compile=compiled)
        with torch.inference_mode():
            batch = dec.start(prompts, N)
            tok = torch.zeros(B, dtype=torch.long, device="cuda")
            t0 = time.perf_counter()
            batch.step(tok)  # capture (and compile)
            torch.cuda.synchronize()
            capture_s = time.perf_counter() - t0
            replay = timed(lambda: dec.decode_step(batch.slot, batch.column), 100)
        print(f"{'compiled' if compiled else 'eager'} step: capture {capture_s:.1f} s, graph replay {replay:.2f} ms/step", flush=True)
    with torch.inference_mode():
        logits = batch.prefill_logits if not args.generator_only else torch.randn(B, model.config.vocab_size, device="cuda").bfloat16()
        params = [SamplingParams(temperature=1.0, max_tokens=N)] * B
        sample = timed(lambda: sample_next(logits, params, [None] * B), 100)
        sample_next(logits, params, [None] * B, fused=True)  # compiled on first use
        fused = timed(lambda: sample_next(logits, params, [None] * B, fused=True), 100)
        sample_tolist = timed(lambda: sample_next(logits, params, [None] * B)[0].tolist(), 100)
    print(f"sample_next {sample:.2f} ms; compiled (fused) {fused:.2f} ms; sample_next+tolist {sample_tolist:.2f} ms")
    if args.kernels:
        from torch.profiler import ProfilerActivity, profile

        with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                dec.forward(batch.slot, batch.slot.ids, batch.slot.pos, batch.slot.mask)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))
    if args.only_kernels:
        return

    runs = [("static+graph", True, False, 0), ("static+graph min_tokens", True, False, N), ("dynamic cache", False, False, 0)]
    if args.no_dynamic:
        runs = runs[:-1]
    if args.compile:  # the CUDA default: compiled step; min_tokens as in gpu_vs_trl's single-turn rows
        runs[1:1] = [("static+graph+compile", True, True, 0), ("static+graph+compile min_tokens", True, True, N)]
    if args.generator_only:
        runs = [("static+graph+compile min_tokens", True, True, N)]
    for label, static, compiled, min_tokens in runs:
        gen = TransformersGenerator(model, 0, static_cache=static, compile_decode=compiled, gather_window_s=0.05)
        # with min_tokens, two stop tokens held back as a chat format's would be (gpu_vs_trl's rows)
        sp = SamplingParams(temperature=1.0, max_tokens=N, min_tokens=min_tokens, stop_token_ids=[1, 2] if min_tokens else [])

        async def run() -> float:
            t = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for p in prompts:
                    tg.start_soon(gen.generate, p, sp)
            return time.perf_counter() - t

        anyio.run(run)  # warm-up / capture
        if args.per_rollout:
            gen.end_rollout()  # frees the static caches and graphs: the next run captures again
        gen.begin_rollout()
        elapsed = anyio.run(run)
        anyio.run(gen.close)
        print(f"{label}: {elapsed:.2f} s for {B}x{N} = {elapsed / N * 1000:.2f} ms/step, batches {gen.stats['batch_sizes'][-3:]}")


def trainer_like(path: str, prompts: list[list[int]], N: int, seeded: bool, in_step: bool = True) -> None:
    """Rollouts as the trainer runs them, each phase timed with a device sync around it."""
    import json

    from transformers import AutoModelForCausalLM

    from agentrl.generators.hf import static_decode as sd
    from agentrl.generators.hf.generator import TransformersGenerator
    from agentrl.generators.protocol import SamplingParams

    phases: dict[str, float] = {}

    def timed_phase(name, fn):
        def wrap(*a, **k):
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = fn(*a, **k)
            torch.cuda.synchronize()
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - t
            return out
        return wrap

    sd.StaticDecoder._capture = timed_phase("capture", sd.StaticDecoder._capture)
    sd.StaticBatch.__init__ = timed_phase("prefill", sd.StaticBatch.__init__)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    gen = TransformersGenerator(model, 0, static_cache=True, compile_decode=True, weights_dtype=torch.bfloat16, gather_window_s=0.05,
                               sample_in_step=in_step)
    B, P = len(prompts), len(prompts[0])
    base = SamplingParams(temperature=1.0, max_tokens=N, min_tokens=N, stop_token_ids=[1, 2])
    params = [base.model_copy(update={"seed": 1000 + i}) if seeded else base for i in range(B)]

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            for p, sp in zip(prompts, params):
                tg.start_soon(gen.generate, p, sp)

    for i, end in enumerate([True, True, True, False, False]):
        phases.clear()
        torch.cuda.synchronize()
        t = time.perf_counter()
        gen.begin_rollout()
        anyio.run(run)
        torch.cuda.synchronize()
        took = time.perf_counter() - t
        if end:
            gen.end_rollout()
        batch = gen.stats["trace"][-1]
        print(json.dumps({"rollout": i, "end_rollout_after": end, "seconds": round(took, 3), "batch_s": round(batch["end"] - batch["start"], 3),
                          "host_wait_s": batch.get("wait_s"),
                          **{k: round(v, 3) for k, v in phases.items()}, "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}), flush=True)
    print("static decoder", gen.static.stats, flush=True)
    dec = gen.static
    length = -(-(P + N + 1) // 256) * 256
    with torch.inference_mode():
        slot = dec._slot(B, length)
        sd.StaticBatch(dec, slot, prompts, P)
        for column in range(P, P + N, 128):
            active = dec._active(slot, column)
            dec.decode_step(slot, column)
            replay = timed(active.graph.replay, 100)
            print(f"replayed step at column {column} ({active.mask.shape[-1]} of {length} columns): {replay:.3f} ms", flush=True)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                active.graph.replay()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10, max_name_column_width=70))


if __name__ == "__main__":
    main()
