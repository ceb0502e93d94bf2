"""The default calculator run, padded micro-batches against packed ones with each group's prompt once (issue 45).

    python benchmarks/packing_run.py --steps 8                 # this CPU: both paths, one process each, same seed
    python benchmarks/packing_run.py --steps 8 --rounds 2      # the paths alternate (a shared machine)
    python benchmarks/packing_run.py --env math_python --steps 2   # prompts with tool schemas

Each path is ``agentrl train env=calculator`` (the defaults, ``max_steps`` cut to ``--steps``,
``save_every=0``) in its own process; "padded" adds ``pack_sequences=false`` (the learner before
issue 45: length-sorted micro-batches of ``micro_batch_size`` rows, each padded to its longest),
"packed" is the default (``pack_sequences=true share_prompt=true``). From each run's
``metrics.jsonl``: the learner's decoder columns per step (``perf/computed_tokens``: padding and
repeated prompts included), the training phase (``perf/train_s``), the whole step
(``perf/step_s``) and the mean reward; medians over the steps after the first.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = {"padded": ["pack_sequences=false"], "packed_only": ["share_prompt=false"], "packed": []}


def run(name: str, steps: int, seed: int, extra: list[str], env: str = "calculator") -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [
            sys.executable,
            "-m",
            "agentrl",
            "train",
            f"env={env}",
            f"max_steps={steps}",
            f"seed={seed}",
            "save_every=0",
            f"output_dir={out}",
            *VARIANTS[name],
            *extra,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            print(proc.stdout[-2000:], proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{name}: exit {proc.returncode}")
        return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--env", default="calculator", help="another environment (math_python, search: prompts with tool schemas)")
    ap.add_argument("--variants", default="padded,packed")
    ap.add_argument("extra", nargs="*", help="more key=value overrides for both paths")
    args = ap.parse_args()
    names = args.variants.split(",")
    start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()
    rows: dict[str, list[list[dict]]] = {n: [] for n in names}
    for _ in range(args.rounds):
        for name in names:
            rows[name].append([m for m in run(name, args.steps, args.seed, args.extra, args.env) if "perf/train_s" in m])

    def med(name: str, key: str) -> float:
        return statistics.median(m[key] for r in rows[name] for m in (r[1:] or r) if key in m)

    cpu = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    print(f"\n{start}; {cpu}; load average at start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")
    print(f"agentrl train env={args.env} max_steps={args.steps} seed={args.seed} save_every=0 {' '.join(args.extra)}")
    print(f"{args.rounds} process(es) per path; medians of steps 2+")
    keys = {"tokens": "perf/computed_tokens", "train": "perf/train_s", "cpu": "perf/train_cpu_s", "step": "perf/step_s"}
    print("| path | computed tokens / step | train phase s | train phase CPU s | step s | reward (mean) | tokens vs first "
          "| train phase vs first (wall / CPU) | step vs first |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    base = {k: med(names[0], key) for k, key in keys.items()}
    for name in names:
        v = {k: med(name, key) for k, key in keys.items()}
        reward = statistics.mean(m["reward/mean"] for r in rows[name] for m in r if "reward/mean" in m)
        print(f"| {name} | {v['tokens']:.0f} | {v['train']:.2f} | {v['cpu']:.2f} | {v['step']:.2f} | {reward:.3f} | "
              f"{v['tokens'] / base['tokens']:.2f}x | {base['train'] / v['train']:.2f}x / {base['cpu'] / v['cpu']:.2f}x faster | "
              f"{base['step'] / v['step']:.2f}x faster |")
    for name in names:
        for i, r in enumerate(rows[name]):
            train = ", ".join(f"{m['perf/train_s']:.2f}" for m in r)
            tokens = ", ".join(f"{m['perf/computed_tokens']:.0f}" for m in r)
            print(f"{name} round {i + 1}: train_s {train}; computed tokens {tokens}")


if __name__ == "__main__":
    main()
