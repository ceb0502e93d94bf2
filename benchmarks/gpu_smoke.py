"""GPU smoke run of the trainer: a Qwen2.5-0.5B-shaped random model, bf16 on CUDA, full and LoRA.

    python benchmarks/gpu_smoke.py --tokenizer .assets/qwen3 --steps 3

The model has random weights (no hub on the lent machine), so it never calls a tool: episodes run
to the per-turn token cap. A toy extra reward (digits in the answer) gives the groups variance so
the loss has real gradients. What it checks is the machinery — rollouts, chunked log-probs,
backward, optimizer, checkpoints — at realistic size; it prints step time and peak memory.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


def digits(completion: str) -> float:
    """Toy reward with variance across random samples: the share of digits in the answer."""
    return sum(c.isdigit() for c in completion) / max(1, len(completion))


def build_model(tokenizer_dir: str, out: Path) -> None:
    """The Qwen2.5-0.5B-shaped random model of gpu_vs_trl.py, in bf16."""
    from gpu_vs_trl import build_model as build

    build(tokenizer_dir, out, torch.bfloat16)


def run(name: str, model_dir: Path, steps: int, extra: list[str]) -> dict:
    from agentrl.core.overrides import build, parse_overrides
    from agentrl.train.config import TrainConfig
    from agentrl.train.trainer import Trainer

    args = [
        f"model.path={model_dir}", f"max_steps={steps}", "precision=bf16", "prompts_per_step=8", "num_generations=8",
        "micro_batch_size=16", "rollout.max_tokens_per_turn=128", "rollout.max_completion_tokens=128",
        "learning_rate=1e-5", f"output_dir={tempfile.mkdtemp(prefix=f'smoke-{name}-')}", "samples_per_log=0",
        'extra_rewards=[{"fn": "benchmarks/gpu_smoke.py:digits", "weight": 1.0}]', *extra,
    ]
    torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(build(TrainConfig, parse_overrides(args)))
    t0 = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t0
    rows = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    later = rows[1:] or rows
    return {
        "run": name,
        "steps": len(rows),
        "step_s_first": round(rows[0]["perf/step_s"], 2),
        "step_s_later_mean": round(sum(r["perf/step_s"] for r in later) / len(later), 2),
        "rollout_s_mean": round(sum(r["rollout/elapsed_s"] for r in later) / len(later), 2),
        "train_s_mean": round(sum(r["perf/train_s"] for r in later) / len(later), 2),
        "sampled_tok_s": round(sum(r["perf/sampled_tokens_per_s"] for r in later) / len(later)),
        "trained_tok_s": round(sum(r["perf/trained_tokens_per_s"] for r in later) / len(later)),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "loss_finite": all(r["loss/loss"] == r["loss/loss"] for r in rows),
        "total_s": round(total, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default=".assets/qwen3")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default="/tmp/q05")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA device"
    out = Path(args.out)
    build_model(args.tokenizer, out)
    results = [run("full", out, args.steps, []), run("lora", out, args.steps, ["peft.r=16"])]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    keys = list(results[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in results:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
