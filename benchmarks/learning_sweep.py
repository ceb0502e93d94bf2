"""Several `agentrl train` configurations side by side, each on its own two CPU cores, then evaluated.

Why: issue 18's target is measured on a 2-core machine, and a sweep of configurations and seeds
on one such machine takes hours. On a host with more cores each run gets two cores of its own
(``sched_setaffinity`` and two torch threads, CUDA hidden), so the runs do not disturb each other.
Each run trains for a wall-clock budget (it is sent Ctrl-C at the deadline: the trainer finishes
the step, saves and stops) or to its ``max_steps``, then its last checkpoint is evaluated greedily
on the shipped test split, on the test split of another seed, on three-call tasks, and at T=1.

    python benchmarks/learning_sweep.py --out /tmp/sweep --train-seconds 420 \
        --run base= --run ds=dynamic_sampling.enabled=true --run "lr2=learning_rate=2e-4 warmup_steps=10"

``--run "NAME=k=v k=v"``: one configuration (its keys are added to ``agentrl train env=calculator``).
``--cuda``: the runs share the host's GPU (each still on two cores of its own, fp32 like the CPU
runs): many more steps per minute when the point is the learning dynamics, not the CPU time.
Writes ``<out>/summary.json`` and ``<out>/<name>/`` (metrics.jsonl, eval summaries).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

EVALS = {
    "greedy": ["sampling.temperature=0"],
    "greedy_seed7": ["sampling.temperature=0", "env_args.seed=7"],
    "greedy_d2": ["sampling.temperature=0", "env_args.difficulty=2", "n=200"],
    "greedy_d3": ["sampling.temperature=0", "env_args.difficulty=3", "n=200"],
    "t1": ["sampling.temperature=1.0", "sampling.seed=1"],
}


def _pinned(cores: list[int]):
    def pin() -> None:
        os.sched_setaffinity(0, cores)
    return pin


def _env(cuda: bool) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="2", MKL_NUM_THREADS="2", TOKENIZERS_PARALLELISM="false")
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--run", action="append", required=True, help="NAME=key=value,key=value (empty after = for the defaults)")
    ap.add_argument("--train-seconds", type=float, default=420)
    ap.add_argument("--evals", default="greedy,greedy_seed7,greedy_d3,t1")
    ap.add_argument("--eval-n", type=int, default=None, help="tasks per evaluation (default: the split, 200 for three-call tasks)")
    ap.add_argument("--cuda", action="store_true", help="train and evaluate on the GPU (shared), fp32")
    ap.add_argument("--eval-baseline", action="store_true", help="also evaluate the bundled model")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cores = sorted(os.sched_getaffinity(0))
    runs = []
    for spec in args.run:
        name, _, keys = spec.partition("=")
        runs.append((name, keys.split()))
    if 2 * len(runs) > len(cores):
        sys.exit(f"{len(runs)} runs need {2 * len(runs)} cores; this host has {len(cores)}")

    procs = {}
    start = time.time()
    for i, (name, keys) in enumerate(runs):
        folder = out / name
        shutil.rmtree(folder, ignore_errors=True)
        cmd = [sys.executable, "-m", "agentrl", "train", "env=calculator", f"output_dir={folder}", "keep_checkpoints=1", *(["precision=fp32", "model.dtype=float32"] if args.cuda else []), *keys]
        log = open(out / f"{name}.train.log", "w")
        procs[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(args.cuda), preexec_fn=_pinned(cores[2 * i : 2 * i + 2])), log)
    while any(p.poll() is None for p, _ in procs.values()):
        if time.time() - start > args.train_seconds:
            for p, _ in procs.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGINT)
            for p, _ in procs.values():
                try:
                    p.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    p.kill()
            break
        time.sleep(2)
    train_s = time.time() - start

    evals = [e for e in args.evals.split(",") if e]
    jobs = []
    targets = [(name, out / name) for name, _ in runs]
    if args.eval_baseline:
        targets.append(("bundled", None))
    for name, folder in targets:
        ckpt = "default"
        if folder is not None:
            found = sorted((folder / "checkpoints").glob("step-*"))
            if not found:
                continue
            ckpt = str(found[-1])
        for e in evals:
            jobs.append((name, e, ckpt))
    results: dict[str, dict] = {name: {} for name, _ in targets}
    slots = len(cores) // 2
    running: list = []
    while jobs or running:
        while jobs and len(running) < slots:
            name, e, ckpt = jobs.pop(0)
            slot = next(s for s in range(slots) if s not in {r[3] for r in running})
            dest = out / name / f"eval-{e}"
            cmd = [sys.executable, "-m", "agentrl", "eval", f"model.path={ckpt}", f"output={dest}", *(["model.dtype=float32"] if args.cuda else []), *EVALS[e], *([f"n={args.eval_n}"] if args.eval_n else [])]
            log = open(out / f"{name}.eval-{e}.log", "w")
            running.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(args.cuda), preexec_fn=_pinned(cores[2 * slot : 2 * slot + 2])), name, e, slot, dest, ckpt))
        time.sleep(1)
        for r in list(running):
            if r[0].poll() is not None:
                running.remove(r)
                p, name, e, _, dest, ckpt = r
                summary = dest / "summary.json"
                results[name][e] = json.loads(summary.read_text()) if summary.is_file() else {"error": p.returncode}
                results[name]["checkpoint"] = ckpt
    for name, _ in runs:
        metrics = out / name / "metrics.jsonl"
        if metrics.is_file():
            lines = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
            results[name]["steps"] = len(lines)
            results[name]["step_s_mean"] = sum(m.get("perf/step_s", 0) for m in lines) / max(1, len(lines))
            results[name]["reward_first5"] = sum(m.get("reward/mean", 0) for m in lines[:5]) / max(1, len(lines[:5]))
            results[name]["reward_last5"] = sum(m.get("reward/mean", 0) for m in lines[-5:]) / max(1, len(lines[-5:]))
            if any("rollout/guided" in m for m in lines):  # guidance: groups that took the demonstration
                results[name]["guided_first5"] = sum(m.get("rollout/guided", 0) for m in lines[:5]) / max(1, len(lines[:5]))
                results[name]["guided_last5"] = sum(m.get("rollout/guided", 0) for m in lines[-5:]) / max(1, len(lines[-5:]))
    (out / "summary.json").write_text(json.dumps({"train_seconds": train_s, "results": results}, indent=1))
    for name, r in results.items():
        row = {e: (r.get(e, {}).get("pass@1"), r.get(e, {}).get("well_formed_call_rate"), r.get(e, {}).get("tool_calls")) for e in evals}
        print(name, r.get("steps"), f"{r.get('step_s_mean', 0):.1f}s/step", f"guided {r.get('guided_first5')} -> {r.get('guided_last5')}", row, flush=True)


if __name__ == "__main__":
    main()
