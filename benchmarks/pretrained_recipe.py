"""A real pretrained chat model learns the calculator tool: SmolLM2-135M-Instruct, before and after.

Slow (about two and a half hours on two CPU cores, one phase after another: the LoRA run 57 min,
each eval of a trained model ~20 min); not part of any test suite. Phases, each a plain
``agentrl`` command run as a child process (so what it measures is what a user runs):

1. ``convert``: scripts/convert_smollm2.py, PyPI's GGUF wheel -> a normal safetensors folder, once;
2. ``eval-before``: ``agentrl eval`` greedy on the first ``--tasks`` tasks of the calculator's test
   split for each ``--env-seeds`` (0 = the shipped split), with the training run's episode limits
   (64-token turns, 256 completion tokens, 1,024 context);
3. ``train``: ``agentrl train config=examples/recipes/pretrained_calculator_lora.yaml model=<folder>``
   (LoRA, warm start on demonstrations, GRPO with guidance; ``--recipe`` names another file, e.g.
   the full fine-tuning one), under ``/usr/bin/time -v`` for the peak resident memory;
4. ``eval-after``: the same evals of the final adapter and of the warm-started one (step 0);
5. ``report``: paired gained/lost and sign test (benchmarks/paired_eval.py), tokens/s of the warm
   start, the rollouts and the learner from the run's logs, peak memory; a RESULTS.md section.

    python benchmarks/pretrained_recipe.py --out /tmp/recipe                      # every phase
    python benchmarks/pretrained_recipe.py --out /tmp/recipe --phases report      # one phase

Threads: one torch thread per process (``OMP_NUM_THREADS=1``): on a loaded two-core machine two
threads decoded 5x slower than one (6.7 against 34 tokens/s, benchmarks/RESULTS.md, issue 47).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "recipes" / "pretrained_calculator_lora.yaml"
LIMITS = ["rollout.max_tokens_per_turn=64", "rollout.max_completion_tokens=256", "rollout.max_context=1024"]
PHASES = ("convert", "eval-before", "train", "eval-after", "report")
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def child_env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


def run(cmd: list[str], log: Path) -> float:
    """``cmd`` under ``nice -n 10`` and ``/usr/bin/time -v``, output to ``log``; its wall seconds."""
    start = time.time()
    with open(log, "w") as out:
        code = subprocess.call(["nice", "-n", "10", "/usr/bin/time", "-v", *cmd], stdout=out, stderr=subprocess.STDOUT, env=child_env())
    if code:
        sys.exit(f"{' '.join(cmd)} failed (exit {code}); see {log}")
    return time.time() - start


def peak_rss_gib(log: Path) -> float | None:
    match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", log.read_text(errors="replace")) if log.is_file() else None
    return int(match.group(1)) / 2**20 if match else None


def evaluate(model: str, out: Path, tasks: int, seed: int) -> None:
    if (out / "summary.json").is_file():
        return
    cmd = ["agentrl", "eval", "env=calculator", f"model={model}", f"n={tasks}", f"env_args.seed={seed}", "sampling.temperature=0", *LIMITS, f"output={out}"]
    run(cmd, out.with_suffix(".log"))


def final_checkpoint(run_dir: Path) -> Path:
    steps = sorted(run_dir.glob("checkpoints/step-*"))
    if not steps:
        sys.exit(f"{run_dir}: no checkpoint (run the train phase first)")
    return steps[-1]


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def speeds(run_dir: Path) -> dict[str, Any]:
    """Tokens/s of the warm start's learner, the RL rollouts and the RL learner (medians over steps)."""
    warm = jsonl(run_dir / "warm_start.jsonl")
    steps = [m for m in jsonl(run_dir / "metrics.jsonl") if m.get("step", 0) > 0 and "perf/step_s" in m]

    def med(rows: list[dict[str, Any]], key: str) -> float | None:
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        return statistics.median(values) if values else None

    return {
        "warm_steps": sum(1 for r in warm if "warm_start/step" in r),
        "warm_train_tok_s": med(warm, "warm_start/perf/trained_tokens_per_s"),
        "warm_step_s": med([{"s": r["warm_start/perf/train_s"] + r["warm_start/demo_s"]} for r in warm if "warm_start/demo_s" in r], "s"),
        "warm_nll": [round(r["warm_start/nll"], 4) for r in warm if "warm_start/nll" in r],
        "rl_steps": len(steps),
        "rollout_sampled_tok_s": med(steps, "rollout/sampled_tokens_per_s"),
        "rl_train_tok_s": med(steps, "perf/trained_tokens_per_s"),
        "rl_step_s": med(steps, "perf/step_s"),
        "rl_reward": [round(m.get("reward/mean", float("nan")), 3) for m in steps],
        "rl_accuracy": [round(m.get("accuracy", float("nan")), 3) for m in steps],
        "rl_well_formed": [round(m.get("rollout/tools/well_formed_rate", float("nan")), 3) for m in steps],
    }


def report(out: Path, seeds: list[int]) -> str:
    from paired_eval import HEADER, compare, markdown

    lines = [HEADER]
    rows = {}
    for seed in seeds:
        label = "shipped test split" if seed == 0 else f"env seed {seed}"
        for name, after in (("warm start only", "eval-warm"), ("warm start + RL", "eval-after")):
            folder = out / f"{after}-s{seed}"
            if (folder / "summary.json").is_file():
                rows[(seed, name)] = row = compare(out / f"eval-before-s{seed}", folder)
                lines.append(markdown(row, f"{label}, {name}"))
    sp = speeds(out / "run")
    lines += [
        "",
        f"- warm start: {sp['warm_steps']} steps, median {sp['warm_step_s'] or 0:.0f} s/step, learner {sp['warm_train_tok_s'] or 0:.1f} "
        f"demonstrated tokens/s; NLL of the demonstrations per step: {sp['warm_nll']}",
        f"- RL: {sp['rl_steps']} steps, median {sp['rl_step_s'] or 0:.0f} s/step, rollouts {sp['rollout_sampled_tok_s'] or 0:.1f} sampled tokens/s, "
        f"learner {sp['rl_train_tok_s'] or 0:.1f} trained tokens/s; reward per step {sp['rl_reward']}, accuracy (T=0.7) {sp['rl_accuracy']}, "
        f"well-formed calls {sp['rl_well_formed']}",
        f"- peak resident memory: train {peak_rss_gib(out / 'train.log') or 0:.2f} GiB; eval "
        f"{max((peak_rss_gib(p) or 0) for p in out.glob('eval-*.log')) if list(out.glob('eval-*.log')) else 0:.2f} GiB",
    ]
    (out / "report.json").write_text(json.dumps({"rows": {f"{k[0]}:{k[1]}": v for k, v in rows.items()}, "speeds": sp}, indent=2, default=str))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", type=Path, default=None, help="the converted folder (default: scripts/convert_smollm2.py's)")
    ap.add_argument("--recipe", type=Path, default=RECIPE, help="the train phase's config file (default: the LoRA recipe; "
                    "examples/recipes/pretrained_calculator_full.yaml is full fine-tuning)")
    ap.add_argument("--tasks", type=int, default=500, help="test tasks per split")
    ap.add_argument("--env-seeds", default="0,1")
    ap.add_argument("--phases", default=",".join(PHASES))
    args = ap.parse_args()
    phases = args.phases.split(",")
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        sys.exit(f"--phases: unknown {unknown}; known: {', '.join(PHASES)}")
    seeds = [int(s) for s in args.env_seeds.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    from convert_smollm2 import convert, default_dest

    model = args.model or default_dest()
    if "convert" in phases:
        model = convert(model)
    if "eval-before" in phases:
        for seed in seeds:
            evaluate(str(model), args.out / f"eval-before-s{seed}", args.tasks, seed)
    if "train" in phases and not (args.out / "run" / "run.json").is_file():
        run(["agentrl", "train", f"config={args.recipe}", f"model={model}", f"output_dir={args.out / 'run'}"], args.out / "train.log")
    if "eval-after" in phases:
        final = final_checkpoint(args.out / "run")
        for seed in seeds:
            evaluate(str(final), args.out / f"eval-after-s{seed}", args.tasks, seed)
            warm = args.out / "run" / "checkpoints" / "step-000000"
            if warm.is_dir() and warm != final:
                evaluate(str(warm), args.out / f"eval-warm-s{seed}", args.tasks, seed)
    if "report" in phases:
        text = report(args.out, seeds)
        print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; load {os.getloadavg()}")
        print(text)


if __name__ == "__main__":
    main()
