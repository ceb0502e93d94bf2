"""The training phase alone: ``Learner.learn`` on a fixed batch, the earlier path against the current one.

    python benchmarks/learner_phase.py                       # this CPU: a small model with Qwen's 152k vocabulary
    python benchmarks/learner_phase.py --preset qwen05 --rows 64 --completion 256   # a GPU: the 0.5B shape

"old" is the learner as it was before issue 13's training-phase work: the checkpointed head
(``logprob_head="checkpoint"``), micro-batches in batch order, every completion column scored,
autocast's weight cache on. "new" is the default: the fused linear + log-softmax head, rows of
similar length batched together, only sampled tokens scored, no autocast weight cache
(``agentrl.learn.config.LearnerConfig``), which since issue 45 also packs the micro-batches and
runs each group's prompt once. ``--variants`` also takes ``fused_only`` and ``no_cache_only`` (one
change each against "old"), ``padded`` ("new" before issue 45: padded micro-batches of ``--micro``
rows) and ``packed_only`` (packed, every prompt computed per row); ``--micro-tokens`` sets
``micro_batch_tokens``. Both run the same
batch, model weights, loss (dapo), AdamW and micro-batch size; each variant runs in its own
process so its peak memory is its own (CUDA: ``max_memory_allocated``; CPU: peak resident set
minus the resident set before the first step). Time is the median over the steps after the first; with ``--rounds`` the
variants' processes alternate and the median over rounds is reported (the machine may be shared).
On a shared CPU the process's CPU seconds (``time.process_time``) are the steadier measure of work
(with one torch thread, other processes' load shows up in wall time, hardly in CPU time).
Loss and gradient norm per step are those of the first round.
The batch is synthetic: P groups x G episodes, prompts of varied length, and for ``--shape
multi`` several assistant turns separated by tool results (loss mask 0), as the calculator's
episodes are. The loss and gradient norm of each step are printed for both, so the two paths can
be seen to compute the same thing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

PRESETS = {  # Qwen2 shapes; "small" keeps the 152k vocabulary (the head is the point) and a small decoder
    "mid": dict(vocab_size=32768, hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2),
    "tiny": dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1),
    "small": dict(vocab_size=151936, hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    "qwen05": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2),
    # the bundled default model's shape (agentrl/bundled/default_model)
    "bundled": dict(vocab_size=455, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64),
}
VARIANTS = {
    "old": dict(logprob_head="checkpoint", sort_by_length=False, score_sampled_only=False, autocast_cache=True, pack_sequences=False),
    "new": dict(logprob_head="fused", sort_by_length=True, score_sampled_only=True, autocast_cache=False),
    "padded": dict(logprob_head="fused", sort_by_length=True, score_sampled_only=True, autocast_cache=False, pack_sequences=False),
    "packed_only": dict(logprob_head="fused", sort_by_length=True, score_sampled_only=True, autocast_cache=False, share_prompt=False),
    # one change at a time, for attributing a difference
    "fused_only": dict(logprob_head="fused", sort_by_length=False, score_sampled_only=False, autocast_cache=True, pack_sequences=False),
    "no_cache_only": dict(logprob_head="checkpoint", sort_by_length=False, score_sampled_only=False, autocast_cache=False, pack_sequences=False),
}


def synthetic_groups(P: int, G: int, completion: int, vocab: int, shape: str, seed: int = 0, prompt_tokens: int | None = None) -> list[Any]:
    """P groups of G episodes. single: one turn of ``completion`` sampled tokens after a 20-60 token
    prompt (``prompt_tokens``: that many instead). multi: 2-4 turns of 15-60 sampled tokens, each followed by a 5-20 token tool result,
    at most ``completion`` tokens in all (the calculator's shape)."""
    from agentrl.core.trajectory import Sample, Trajectory, TrajectoryGroup, Turn

    rng = random.Random(seed)
    groups = []
    for p in range(P):
        prompt = [rng.randrange(vocab) for _ in range(prompt_tokens or rng.randint(20, 60))]
        episodes = []
        for _ in range(G):
            t = Trajectory(task={"p": p}, seed=0)
            s = Sample(prompt_ids=list(prompt))
            t.samples.append(s)
            n_turns = 1 if shape == "single" else rng.randint(2, 4)
            for k in range(n_turns):
                n = completion if shape == "single" else rng.randint(15, 60)
                n = min(n, completion - len(s.completion_ids))
                if n <= 0:
                    break
                start = len(s.completion_ids)
                s.extend([rng.randrange(vocab) for _ in range(n)], sampled=True, logprobs=[-rng.uniform(0.1, 3.0) for _ in range(n)])
                t.turns.append(Turn(index=k, message={"role": "assistant"}, num_sampled=n, finish_reason="stop", sample=0, start=start))
                if k < n_turns - 1:
                    room = completion - len(s.completion_ids)
                    if room > 0:
                        s.extend([rng.randrange(vocab) for _ in range(min(room, rng.randint(5, 20)))], sampled=False)
            t.reward = float(rng.random() < 0.5)
            t.rewards = {"correct": t.reward}
            if t.turns:
                t.turns[-1].reward = t.reward
                t.turns[-1].rewards = {"correct": t.reward}
            episodes.append(t)
        groups.append(TrajectoryGroup(task={"p": p}, seed=0, trajectories=episodes))
    return groups


def build_learner(model: Any, accelerator: Any, micro: int, variant: dict[str, Any], chunk: int, beta: float, lr: float, micro_tokens: int = 4096) -> Any:
    from agentrl.compute.reference import Reference
    from agentrl.learn.config import LearnerConfig
    from agentrl.learn.learner import Learner
    from agentrl.learn.losses import LossConfig

    cuda = accelerator.device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0, fused=True if cuda else None)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    settings = LearnerConfig(
        micro_batch_size=micro, num_iterations=1, steps_per_generation=1, temperature=1.0, logprob_chunk_size=chunk,
        max_grad_norm=1.0, mask_truncated_completions=False, ref_mix_alpha=None, ref_mix_every=1, **(dict(micro_batch_tokens=micro_tokens) | variant),
    )
    return Learner(accelerator, model, opt, sched, Reference(model, "full", beta), LossConfig(loss_type="dapo", beta=beta), settings)


def _rss_gib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import transformers
    from accelerate import Accelerator

    from agentrl.learn.batch import build_batch

    cuda = torch.cuda.is_available() and not args.cpu
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(**PRESETS[args.preset], tie_word_embeddings=True)
    model = transformers.Qwen2ForCausalLM(cfg).float()
    if args.gradient_checkpointing:
        from agentrl.train.build import enable_gradient_checkpointing

        enable_gradient_checkpointing(model)  # as the trainer does
    accelerator = Accelerator(cpu=not cuda, mixed_precision="bf16" if args.bf16 else "no")
    model = model.to(accelerator.device).train()
    learner = build_learner(model, accelerator, args.micro, VARIANTS[args.worker], args.chunk, args.beta, args.lr, args.micro_tokens)
    batch = build_batch(synthetic_groups(args.prompts, args.gens, args.completion, cfg.vocab_size, args.shape, prompt_tokens=args.prompt_tokens), pad_id=0)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    rss0 = _rss_gib()
    times, cpu_times, losses, norms, computed = [], [], [], [], []
    for step in range(args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        for m in learner.learn(batch, step):
            losses.append(m["loss/loss"])
            norms.append(m.get("grad_norm", float("nan")))
            computed.append(m["perf/computed_tokens"])
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20 - rss0
    return {
        "variant": args.worker, "step_s": statistics.median(times[1:] or times), "times": times, "peak_gib": peak,
        "cpu_s": statistics.median(cpu_times[1:] or cpu_times),
        "losses": losses, "grad_norms": norms, "rows": len(batch), "width": int(batch.input_ids.shape[1]),
        "sampled_tokens": int(batch.loss_mask.sum()), "computed_tokens": computed[0], "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="small")
    ap.add_argument("--shape", choices=["single", "multi"], default="single")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--gens", type=int, default=4)
    ap.add_argument("--completion", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=None, help="every prompt this long (default: 20-60 tokens)")
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--micro-tokens", type=int, default=4096, help="micro_batch_tokens of the packed variants")
    ap.add_argument("--chunk", type=int, default=1024, help="logprob_chunk_size (default: the trainer's)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--beta", type=float, default=0.0, help="> 0 adds the reference model's forward")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast over float32 weights (the GPU setting)")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="stay on the CPU even with CUDA present")
    ap.add_argument("--variants", default="old,new")
    ap.add_argument("--rounds", type=int, default=1, help="processes per variant, alternating; the median is reported")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--worker", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker:
        print("RESULT " + json.dumps(worker(args)), flush=True)
        return
    names = args.variants.split(",")
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for _ in range(args.rounds):  # variants alternate, so a load change on a shared machine hits them alike
        for name in names:
            proc = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--worker", name], capture_output=True, text=True)
            found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            if not found:
                print(proc.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"{name}: no result")
            runs[name].append(json.loads(found[-1][7:]))
    results = []
    for name in names:
        r = dict(runs[name][0])
        r["round_s"] = [x["step_s"] for x in runs[name]]
        r["step_s"] = statistics.median(r["round_s"])
        r["peak_gib"] = statistics.median(x["peak_gib"] for x in runs[name])
        r["cpu_s"] = statistics.median(x["cpu_s"] for x in runs[name])
        results.append(r)
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() and not args.cpu else f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    r0 = results[0]
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {dev}; torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}")
    print(f"model: {args.preset} ({r0['params_m']:.1f}M parameters), batch {r0['rows']} rows x {r0['width']} columns, "
          f"{r0['sampled_tokens']} sampled tokens, shape {args.shape}, micro-batch {args.micro}, chunk {args.chunk}, "
          f"{'bf16 autocast' if args.bf16 else 'fp32'}{', gradient checkpointing' if args.gradient_checkpointing else ''}, beta {args.beta}, "
          f"{args.steps} steps per process (median of steps 2+), {args.rounds} process(es) per variant, torch threads {args.threads or torch.get_num_threads()}")
    print("| path | computed tokens / step | train phase s (median) | per round s | CPU s (median) | peak GiB | loss per step | grad norm per step | speed vs first (wall) | speed vs first (CPU s) | memory vs first |")
    print("|---|---:|---:|---|---:|---:|---|---|---:|---:|---:|")
    for r in results:
        print(f"| {r['variant']} | {r['computed_tokens']:.0f} | {r['step_s']:.3f} | {', '.join(f'{t:.2f}' for t in r['round_s'])} | {r['cpu_s']:.2f} | {r['peak_gib']:.2f} | "
              f"{', '.join(f'{x:.6e}' for x in r['losses'])} | {', '.join(f'{x:.6e}' for x in r['grad_norms'])} | "
              f"{r0['step_s'] / r['step_s']:.2f}x | {r0['cpu_s'] / r['cpu_s']:.2f}x | {r['peak_gib'] / r0['peak_gib']:.2f}x |")


if __name__ == "__main__":
    main()
