"""tests/test_learning.py's run over several seeds at once, to set its thresholds on measured spread.

Why: the CI learning test asserts a gain and a paired sign test z with a margin beyond the
seed-to-seed noise; that noise has to be measured with the test's own run (the default
``agentrl train env=calculator`` cut to 45 steps, greedy on 300 held-out tasks before and after).
Each seed runs in its own process on two cores of its own (``--cuda``: sharing the GPU, fp32).

    python benchmarks/learning_test_seeds.py --seeds 0,1,2,3,4,5,6 --cuda

Prints one line per seed: accuracy before and after, tasks gained and lost, z.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

STEPS, TASKS = 45, 300


def one(seed: int, out: str, extra: list[str]) -> None:
    """The test's body for one seed (same overrides as tests/test_learning.py)."""
    from agentrl.core.overrides import build, parse_overrides
    from agentrl.train.config import TrainConfig
    from agentrl.train.trainer import Trainer

    start = time.time()
    keys = [f"max_steps={STEPS}", f"eval_every={STEPS}", f"eval_tasks={TASKS}", f"seed={seed}", f"output_dir={out}", *extra]
    trainer = Trainer(build(TrainConfig, parse_overrides(keys)))
    trainer.train()
    before = [(x or 0) >= 1 for x in trainer.eval_results[0]]
    after = [(x or 0) >= 1 for x in trainer.eval_results[STEPS]]
    gained = sum(1 for b, a in zip(before, after) if a and not b)
    lost = sum(1 for b, a in zip(before, after) if b and not a)
    z = (gained - lost) / math.sqrt(max(1, gained + lost))
    row = {"seed": seed, "before": sum(before) / TASKS, "after": sum(after) / TASKS, "gained": gained, "lost": lost, "z": z, "seconds": time.time() - start}
    print("RESULT", json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", default="/tmp/learning_test_seeds")
    ap.add_argument("--cuda", action="store_true", help="share the host's GPU (fp32), two cores per seed")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: run one seed in this process
    args, extra = ap.parse_known_args()
    if args.one is not None:
        one(args.one, f"{args.out}/seed-{args.one}", extra)
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    cores = sorted(os.sched_getaffinity(0))
    if 2 * len(seeds) > len(cores):
        sys.exit(f"{len(seeds)} seeds need {2 * len(seeds)} cores; this host has {len(cores)}")
    env = dict(os.environ, OMP_NUM_THREADS="2", MKL_NUM_THREADS="2", TOKENIZERS_PARALLELISM="false")
    if not args.cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    keys = ["precision=fp32", "model.dtype=float32"] if args.cuda else []
    procs = []
    for i, seed in enumerate(seeds):
        mine = cores[2 * i : 2 * i + 2]
        cmd = [sys.executable, __file__, "--one", str(seed), "--out", args.out, *keys, *extra]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        os.sched_setaffinity(proc.pid, mine)  # before it imports torch, which sizes its thread pool then
        procs.append(proc)
    for seed, p in zip(seeds, procs):
        out, _ = p.communicate()
        lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
        print(lines[-1][len("RESULT ") :] if lines else f"seed {seed} failed (exit {p.returncode}):\n{out[-2000:]}", flush=True)


if __name__ == "__main__":
    main()
