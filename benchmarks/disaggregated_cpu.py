"""Disaggregated (1 generator rank + 2 trainer ranks) against 2-process data parallel, on this CPU.

    python benchmarks/disaggregated_cpu.py                       # one call: every layout, one after the other
    python benchmarks/disaggregated_cpu.py --steps 6 --prompts 4 --generations 4

Each layout is a real ``torchrun`` launch of ``agentrl train`` on the multi-turn calculator (the
default training tasks: up to three tool calls per episode) with the bundled model, fp32, the same
global batch (``--prompts`` tasks x ``--generations`` episodes per optimizer step) and seed:

- ``dp``: 2 processes, each rolls out half the tasks and trains on half the rows;
- ``disagg-s0``: 3 processes, ``distributed.generator_ranks=1``, ``max_staleness=0`` (the generator
  rank samples every episode, then the 2 trainer ranks train on it: the same steps as one process);
- ``disagg-s1``: the same with ``max_staleness=1`` (the next batch is sampled while this one trains).

Read from each run's metrics.jsonl: the median ``perf/step_s`` over the steps after the first
(the first carries start-up), episodes/s = episodes per step / that median, optimizer steps per
hour = 3600 / that median, and the staleness seen. One ``RESULT`` JSON line per layout, then a
table. On a 2-core machine shared with other jobs the 3-process layout has fewer cores per process
than the 2-process one: the numbers say what this machine does, not what GPUs do
(docs/distributed.md has the arithmetic).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = {
    "dp": (2, []),
    "disagg-s0": (3, ["distributed.generator_ranks=1", "max_staleness=0"]),
    "disagg-s1": (3, ["distributed.generator_ranks=1", "max_staleness=1"]),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(layout: str, args: argparse.Namespace) -> dict:
    nproc, extra = LAYOUTS[layout]
    out = Path(tempfile.mkdtemp(prefix=f"disagg-bench-{layout}-"))
    keys = [
        "env=calculator", "model.path=default", f"seed={args.seed}", f"max_steps={args.steps}", f"prompts_per_step={args.prompts}",
        f"num_generations={args.generations}", "micro_batch_size=8", "learning_rate=2e-5", "precision=fp32", "samples_per_log=0",
        "save_final=false", "loss.sampler_is_mode=truncate", f"output_dir={out}", "distributed_timeout_s=600", *extra,
    ]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "-m", "agentrl", "train", *keys]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{layout} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["perf/step_s"] for r in records if "perf/step_s" in r]
    later = steps[1:] or steps
    median = statistics.median(later)
    episodes = args.prompts * args.generations
    result = {
        "layout": layout, "processes": nproc, "steps": len(steps), "episodes_per_step": episodes,
        "median_step_s": round(median, 3), "mean_step_s": round(statistics.mean(later), 3),
        "episodes_per_s": round(episodes / median, 3), "optimizer_steps_per_hour": round(3600 / median, 1),
        "rollout_s_median": round(statistics.median([r["rollout/elapsed_s"] for r in records[1:] if "rollout/elapsed_s" in r] or [0.0]), 3),
        "train_s_median": round(statistics.median([r["perf/train_s"] for r in records[1:] if "perf/train_s" in r] or [0.0]), 3),
        "staleness": [r.get("async/staleness") for r in records], "reward_mean": [round(r["reward/mean"], 3) for r in records],
        "wall_s": round(wall, 1),
    }
    print("RESULT " + json.dumps(result), flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    args = ap.parse_args()
    results = [run(layout, args) for layout in args.layouts.split(",")]
    base = results[0]
    print(f"\n{'layout':<10} {'procs':>5} {'step s':>7} {'episodes/s':>10} {'steps/hour':>10} {'vs ' + base['layout']:>8}")
    for r in results:
        print(f"{r['layout']:<10} {r['processes']:>5} {r['median_step_s']:>7.2f} {r['episodes_per_s']:>10.2f} {r['optimizer_steps_per_hour']:>10.0f} "
              f"{r['episodes_per_s'] / base['episodes_per_s']:>7.2f}x")


if __name__ == "__main__":
    main()
