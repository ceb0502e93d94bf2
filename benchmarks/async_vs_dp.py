"""Two GPUs three ways: synchronous data parallel, asynchronous rollouts on the second GPU, and FSDP2
(issue 14, items 1-3), against one synchronous GPU, with the same global batch.

    # once: the Qwen2.5-0.5B-shaped random model of gpu_vs_trl.py (needs Qwen3's tokenizer folder)
    python benchmarks/async_vs_dp.py --build --tokenizer .assets/qwen3 --model /tmp/q05
    python benchmarks/async_vs_dp.py --mode sync --model /tmp/q05                           # 1 GPU
    torchrun --nproc_per_node 2 benchmarks/async_vs_dp.py --mode dp --model /tmp/q05      # 2 GPUs, DDP-style
    python benchmarks/async_vs_dp.py --mode async --model /tmp/q05                          # train cuda:0, generate cuda:1
    torchrun --nproc_per_node 2 benchmarks/async_vs_dp.py --mode fsdp --model /tmp/q05    # 2 GPUs, sharded
    # reward after the same wall-clock (multi-turn, on learning_race.py's SFT model): 150 s of training each,
    # then greedy held-out accuracy on 128 tasks; compile off so the first step's compilation does not eat the budget
    python benchmarks/async_vs_dp.py --mode async --multiturn --model /tmp/race/sft --prompts 8 --lr 5e-6 \
        --budget 150 --eval-tasks 128 --extra generator.compile_decode=false
    # this CPU (logic only): the bundled model
    python benchmarks/async_vs_dp.py --mode async --cpu --steps 3 --prompts 2 --generations 4 --tokens 32

Each run trains ``--steps`` GRPO steps of ``--prompts`` tasks x ``--generations`` episodes (global
numbers) on the calculator environment with a toy extra reward (share of digits: a random model
never calls a tool, so each episode is one turn of ``--tokens`` tokens), bf16 on CUDA. Printed as
one ``RESULT`` JSON line: episodes/s from the median step time over the steps after the first (and the mean), rollout
and train time, the staleness seen (async), peak memory of this process. Needs pydantic and
datasets on the device (carry their wheels, as for gpu_smoke.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def digits(completion: str) -> float:
    """Toy reward with variance across random samples: the share of digits in the answer."""
    return sum(c.isdigit() for c in completion) / max(1, len(completion))


def keys_for(mode: str, args: argparse.Namespace) -> list[str]:
    out = tempfile.mkdtemp(prefix=f"async-vs-dp-{mode}-") if int(os.environ.get("RANK", "0")) == 0 else None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # every rank needs the same output_dir: rank 0's, shared
        obj = [out]
        if torch.cuda.is_available() and not args.cpu:  # before NCCL starts: each rank on its own GPU
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group("nccl" if torch.cuda.is_available() and not args.cpu else "gloo")
        torch.distributed.broadcast_object_list(obj, src=0)
        out = obj[0]
    if args.multiturn:  # the multi-turn row of gpu_vs_trl.py: the same settings, on its SFT model
        import multiturn_bench

        keys = [k for k in multiturn_bench.agentrl_args(args.model, args.prompts, args.generations, args.steps, lr=args.lr) if not k.startswith("output_dir=")]
        keys.append(f"output_dir={out}")
    else:
        keys = [
            f"model.path={args.model}", f"max_steps={args.steps}", f"prompts_per_step={args.prompts}", f"num_generations={args.generations}",
            f"micro_batch_size={args.micro}", f"rollout.max_tokens_per_turn={args.tokens}", f"rollout.max_completion_tokens={args.tokens}",
            "sampling.temperature=1.0", f"learning_rate={args.lr}", f"output_dir={out}", "samples_per_log=0", "save_final=false",
            f'extra_rewards=[{{"fn": "{HERE / "async_vs_dp.py"}:digits", "weight": 1.0}}]',
        ]
        if not args.cpu:
            keys += ["precision=bf16", "gradient_checkpointing=true"]
    keys += args.extra
    if mode == "async":
        keys += [f"max_staleness={args.staleness}", f"rollout_device={'cpu' if args.cpu else 'cuda:1'}"]
    if mode == "fsdp":
        keys += ["distributed.strategy=fsdp"]
    return keys


def stop_on_budget(trainer: Any, t0: float, budget: float, world: int) -> None:
    """End training after the step that passes ``budget`` seconds; with several ranks, rank 0's
    clock decides for all (every rank finishes each step, so the broadcast there cannot hang)."""
    original = trainer._finish_step

    def finish(*a: Any) -> None:
        original(*a)
        done = [time.perf_counter() - t0 >= budget]
        if world > 1:
            torch.distributed.broadcast_object_list(done, src=0)
        if done[0]:
            trainer.cfg.max_steps = trainer.state.step  # the loop ends after this step

    trainer._finish_step = finish


def score(trainer: Any, n: int) -> dict[str, Any]:
    """The final weights in bf16, scored as learning_race.py scores checkpoints (greedy, held out)."""
    import learning_race

    folder = Path(trainer.run_dir) / "final-bf16"
    learning_race._save_bf16(trainer._module(), trainer.tokenizer, folder)
    return learning_race.evaluate(str(folder), n, Path(trainer.run_dir) / "eval", gpu=os.environ.get("LOCAL_RANK", "0") if torch.cuda.is_available() else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["sync", "dp", "async", "fsdp"], default="sync")
    ap.add_argument("--build", action="store_true", help="write the 0.5B-shaped random model to --model and exit")
    ap.add_argument("--tokenizer", default=".assets/qwen3")
    ap.add_argument("--model", default="/tmp/q05", help="model folder ('default': the bundled model)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--micro", type=int, default=16)
    ap.add_argument("--staleness", type=int, default=1)
    ap.add_argument("--multiturn", action="store_true", help="the multi-turn calculator row's settings (multiturn_bench.py); --model: its SFT model (gpu_vs_trl.py --worker sft)")
    ap.add_argument("--cpu", action="store_true", help="logic check on CPU (bundled model unless --model is given)")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--extra", nargs="*", default=[], help="more trainer keys, e.g. generator.compile_decode=false")
    ap.add_argument("--budget", type=float, default=0, help="stop after this many seconds of training wall-clock (compilation included) instead of --steps")
    ap.add_argument("--eval-tasks", type=int, default=0, help="then score the final weights: greedy held-out accuracy on this many test tasks (learning_race.evaluate)")
    args = ap.parse_args()
    if args.build:
        from gpu_vs_trl import build_model

        build_model(args.tokenizer, Path(args.model))
        return
    if args.cpu and args.model == "/tmp/q05":
        args.model = "default"
    if args.cpu:
        torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if (args.mode in ("dp", "fsdp")) != (world > 1):
        raise SystemExit(f"--mode {args.mode}: {'launch with torchrun --nproc_per_node 2' if world == 1 else 'run it with python, not torchrun'}")
    if args.mode == "async" and not args.cpu and torch.cuda.device_count() < 2:
        raise SystemExit("--mode async trains on cuda:0 and generates on cuda:1: it needs 2 GPUs")

    from agentrl.core.overrides import build, parse_overrides
    from agentrl.train.config import TrainConfig
    from agentrl.train.trainer import Trainer

    if args.budget:
        args.steps = 100_000
    trainer = Trainer(build(TrainConfig, parse_overrides(keys_for(args.mode, args))))
    t0 = time.perf_counter()
    if args.budget:
        stop_on_budget(trainer, t0, args.budget, world)
    trainer.train()
    total = time.perf_counter() - t0
    if not trainer.is_main:
        return
    scored = score(trainer, args.eval_tasks) if args.eval_tasks else None
    rows = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    later = rows[1:] or rows
    step_s = statistics.median(r["perf/step_s"] for r in later)  # a one-off recompile of a new shape is not the rate
    result = {
        "mode": args.mode, "processes": world, "device": torch.cuda.get_device_name() if torch.cuda.is_available() and not args.cpu else "cpu",
        "steps": len(rows), "episodes_per_step": args.prompts * args.generations,
        "episodes_per_s": round(args.prompts * args.generations / step_s, 2), "step_s_median": round(step_s, 3),
        "step_s_mean": round(sum(r["perf/step_s"] for r in later) / len(later), 3),
        "step_s_first": round(rows[0]["perf/step_s"], 3),
        "rollout_s_mean": round(sum(r["rollout/elapsed_s"] for r in later) / len(later), 3),
        "train_s_mean": round(sum(r["perf/train_s"] for r in later) / len(later), 3),
        "reward_last": round(rows[-1]["reward/mean"], 4), "total_s": round(total, 1),
        "staleness": [r.get("async/staleness") for r in rows] if args.mode == "async" else None,
        "held_out": scored,
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() and not args.cpu else None,
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
