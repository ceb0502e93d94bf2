"""Learning at equal wall-clock: agentrl's trainer and TRL's GRPOTrainer on the multi-turn calculator.

    # lent GPUs, in stages (each call at most 10 minutes; the work folder survives while the machine is warm);
    # with 2 GPUs the two frameworks train at once, each alone on its card, and the evaluations share both
    python benchmarks/learning_race.py --work /tmp/race --stage sft --sft-seconds 75     # model + SFT
    python benchmarks/learning_race.py --work /tmp/race --stage race --budget 240 --every 60 --lr 5e-6
    python benchmarks/learning_race.py --work /tmp/race --stage eval --eval-tasks 64     # -> race.png, race.json
    # this CPU: the whole pipeline on a tiny random model (plumbing only; it learns nothing in seconds)
    python benchmarks/learning_race.py --work /tmp/race-cpu --tiny --sft-seconds 10 --budget 40 --every 20 --eval-tasks 4

Both frameworks start from the same SFT'd model (multiturn_bench.sft: the 0.5B-shaped random model
taught the calculator episode on ideal transcripts), train on the same calculator tasks with the
settings of the throughput rows (multiturn_bench.run_agentrl / run_trl: 8 prompts x 8 episodes
per step, dapo, beta 0, lr, bf16, gradient checkpointing, 256 completion tokens, 6 tool calls, and
the same reward: `correct` alone),
each in its own process for ``--budget`` seconds of training wall-clock (model loading excluded;
agentrl's first-rollout compilation included). Every ``--every`` seconds each saves a checkpoint
(bf16 weights; the save is not counted). Afterwards one evaluator scores every checkpoint the
same way: ``agentrl eval`` greedy on the first ``--eval-tasks`` held-out test tasks. The PNG
plots held-out accuracy (the share answered correctly) against training wall-clock seconds, one line per framework, starting
from the shared SFT model at 0 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from queue import Queue
from typing import Any

import torch

HERE = Path(__file__).resolve()
T0 = time.monotonic()
sys.path.insert(0, str(HERE.parent))  # multiturn_bench, gpu_vs_trl


class _Budget(Exception):
    """The wall-clock budget is spent: stop training."""


class Clock:
    """Training wall-clock without the checkpoint saves; decides when to save and when to stop."""

    def __init__(self, budget: float, every: float, folder: Path, name: str) -> None:
        self.budget, self.every, self.folder, self.name = budget, every, folder, name
        self.start = time.perf_counter()
        self.paused = 0.0
        self.next = every
        self.checkpoints: list[dict[str, Any]] = []
        self.trace: list[tuple[float, float]] = []  # (elapsed s, training reward of the step)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start - self.paused

    def tick(self, step: int, reward: float, save: Any) -> bool:
        """After an optimizer step: record, save when a mark is passed; True when the budget is spent."""
        t = self.elapsed()
        self.trace.append((t, reward))
        done = t >= self.budget
        if t >= self.next or done:
            t0 = time.perf_counter()
            path = self.folder / f"{self.name}-{len(self.checkpoints) + 1:02d}"
            save(path)
            self.paused += time.perf_counter() - t0
            self.checkpoints.append({"elapsed_s": t, "step": step, "path": str(path)})
            while self.next <= t:
                self.next += self.every
        return done


def _save_bf16(model: Any, tokenizer: Any, path: Path) -> None:
    """Weights in bf16 (half the disk of the fp32 master; the evaluator decodes in bf16 anyway)."""
    state = {k: v.detach().to(torch.bfloat16) if v.is_floating_point() else v for k, v in model.state_dict().items()}
    model.save_pretrained(path, state_dict=state)
    tokenizer.save_pretrained(path)


def race_agentrl(model: str, P: int, G: int, budget: float, every: float, folder: Path, lr: float) -> dict[str, Any]:
    import multiturn_bench

    from agentrl.core.overrides import build, parse_overrides
    from agentrl.train.config import TrainConfig
    from agentrl.train.trainer import Trainer

    args = multiturn_bench.agentrl_args(model, P, G, steps=100_000, lr=lr)
    trainer = Trainer(build(TrainConfig, parse_overrides(args)))
    clock = Clock(budget, every, folder, "agentrl")
    original = trainer._finish_step

    def finish(log: Any, metrics: dict[str, Any], *rest: Any) -> None:
        original(log, metrics, *rest)
        if clock.tick(trainer.step, metrics.get("reward/mean", float("nan")), lambda p: _save_bf16(trainer._module(), trainer.tokenizer, p)):
            raise _Budget

    trainer._finish_step = finish  # type: ignore[method-assign]
    clock.start = time.perf_counter()
    try:
        trainer.train()
    except _Budget:
        pass
    return {"framework": "agentrl", "steps": trainer.step, "checkpoints": clock.checkpoints, "train_reward": clock.trace}


def race_trl(model: str, P: int, G: int, budget: float, every: float, folder: Path, lr: float) -> dict[str, Any]:
    import multiturn_bench
    from transformers import AutoTokenizer, TrainerCallback

    tokenizer = AutoTokenizer.from_pretrained(model)
    clock = Clock(budget, every, folder, "trl")
    rewards: list[float] = []

    class Race(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.start = time.perf_counter()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            reward = rewards[-1] if rewards else float("nan")
            if clock.tick(state.global_step, reward, lambda p: _save_bf16(model, tokenizer, p)):
                control.should_training_stop = True

    trainer = multiturn_bench.trl_trainer(model, P, G, steps=100_000, lr=lr, callbacks=[Race()])
    trainer.train()
    return {"framework": "trl", "steps": trainer.state.global_step, "checkpoints": clock.checkpoints, "train_reward": clock.trace}


def evaluate(model: str, n: int, out: Path, gpu: str | None = None) -> dict[str, Any]:
    """The one evaluator for every checkpoint: ``agentrl eval`` greedy on the first ``n`` test tasks.

    CUDA graphs without torch.compile: a compile costs more than one evaluation saves."""
    import multiturn_bench

    cmd = [
        sys.executable, "-m", "agentrl", "eval", f"model={model}", "env=calculator",
        f"env_args={{\"difficulty\": {multiturn_bench.DIFFICULTY}}}", f"n={n}", "sampling.temperature=0", f"output={out}",
        f"rollout.max_tokens_per_turn={multiturn_bench.MAX_COMPLETION}", f"rollout.max_completion_tokens={multiturn_bench.MAX_COMPLETION}",
        "rollout.max_context=1536", "rollout.max_turns=6",
        *(["generator.cuda_graphs=true", "generator.compile_decode=false"] if torch.cuda.is_available() else []),
    ]
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    summary = json.loads((out / "summary.json").read_text())
    # accuracy: the share of tasks answered correctly (the calculator's reward is >= 1 exactly then), the objective
    # both sides train on; reward_mean adds the format and progress terms neither trains on
    return {"accuracy": summary["pass@1"], **{k: summary[k] for k in ("reward_mean", "well_formed_call_rate", "turns_mean", "truncated_rate", "tool_calls")}}


def _tiny_model(tokenizer_dir: str, out: Path) -> None:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, tie_word_embeddings=True, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)


def _subprocess(args: list[str], gpu: str | None = None) -> dict[str, Any]:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", **({"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {})}
    proc = subprocess.run([sys.executable, str(HERE), *args], capture_output=True, text=True, env=env)
    found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if not found:
        print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
        raise SystemExit(f"{args[:2]}: no result")
    return json.loads(found[-1][7:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True, help="folder for the model, checkpoints and results (kept between stages)")
    ap.add_argument("--stage", default="all", choices=["all", "sft", "race", "eval"])
    ap.add_argument("--frameworks", default="agentrl,trl")
    ap.add_argument("--tokenizer", default=".assets/qwen3")
    ap.add_argument("--tiny", action="store_true", help="a tiny random model (CPU check of the pipeline)")
    ap.add_argument("--sft-seconds", type=float, default=150)
    ap.add_argument("--budget", type=float, default=300, help="training wall-clock seconds per framework")
    ap.add_argument("--every", type=float, default=60, help="seconds of training between checkpoints")
    ap.add_argument("--eval-tasks", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--gens", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--deadline", type=float, default=float("inf"), help="eval stage: skip checkpoints not scored by this many seconds after the start")
    ap.add_argument("--worker", choices=["agentrl", "trl", "sft"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    work = Path(args.work)
    base, sft_dir, ckpts = work / "base", work / "sft", work / "checkpoints"
    if args.worker == "sft":
        import multiturn_bench

        print("RESULT " + json.dumps(multiturn_bench.sft(str(base), str(sft_dir), args.sft_seconds)), flush=True)
        return
    if args.worker:
        fn = race_agentrl if args.worker == "agentrl" else race_trl
        ckpts.mkdir(parents=True, exist_ok=True)
        print("RESULT " + json.dumps(fn(str(sft_dir), args.prompts, args.gens, args.budget, args.every, ckpts, args.lr)), flush=True)
        return

    work.mkdir(parents=True, exist_ok=True)
    if args.stage in ("all", "sft"):
        if args.tiny:
            _tiny_model(args.tokenizer, base)
        else:
            from gpu_vs_trl import build_model

            build_model(args.tokenizer, base)
        result = _subprocess(["--work", str(work), "--worker", "sft", "--sft-seconds", str(args.sft_seconds)])
        (work / "sft.json").write_text(json.dumps(result))
        print("sft:", result, flush=True)
    if args.stage in ("all", "race"):
        frameworks = args.frameworks.split(",")
        gpus = _gpus()

        def one(i: int, fw: str) -> None:
            # with a GPU per framework both train at once, each alone on its card; else one after the other
            result = _subprocess(["--work", str(work), "--worker", fw, "--budget", str(args.budget), "--every", str(args.every),
                                  "--prompts", str(args.prompts), "--gens", str(args.gens), "--lr", str(args.lr)],
                                 gpu=gpus[i] if len(gpus) >= len(frameworks) else None)
            (work / f"race-{fw}.json").write_text(json.dumps(result))
            print(f"{fw}: {result['steps']} steps, {len(result['checkpoints'])} checkpoints", flush=True)

        with ThreadPoolExecutor(len(frameworks) if len(gpus) >= len(frameworks) else 1) as pool:
            list(pool.map(one, range(len(frameworks)), frameworks))
    if args.stage in ("all", "eval"):
        report(work, args.eval_tasks, T0 + args.deadline)


def _gpus() -> list[str]:
    """The visible GPUs as CUDA_VISIBLE_DEVICES values (empty on a CPU machine)."""
    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def report(work: Path, n: int, deadline: float = float("inf")) -> None:
    """Evaluate the SFT model and every checkpoint (one evaluation per GPU at a time), then write race.json,
    race.png and a table. Checkpoints not reached by ``deadline`` (time.monotonic) are left out, named."""
    from agentrl.observe.plot import write_curve_png

    races = [json.loads(p.read_text()) for p in sorted(work.glob("race-*.json"))]
    jobs = [("sft", {"path": str(work / "sft"), "elapsed_s": 0.0, "step": 0})]
    jobs += [("agentrl" if r["framework"] == "agentrl" else "TRL", c) for r in races for c in r["checkpoints"]]
    gpus = _gpus() or [None]
    free: Queue = Queue()
    for g in gpus:
        free.put(g)

    def score(job: tuple[str, dict[str, Any]]) -> dict[str, Any]:
        name, c = job
        if time.monotonic() > deadline:
            return {"error": "not evaluated: the call's deadline"}
        gpu = free.get()
        try:
            result = evaluate(c["path"], n, work / "eval" / Path(c["path"]).name, gpu)
        finally:
            free.put(gpu)
        print(name, c["elapsed_s"], c["step"], result, flush=True)
        if "error" not in result and name != "sft":
            shutil.rmtree(c["path"], ignore_errors=True)  # 1 GB each; the score is kept
        return result

    with ThreadPoolExecutor(len(gpus)) as pool:
        scores = list(pool.map(score, jobs))
    start = scores[0]
    print("sft model:", start, flush=True)
    series: dict[str, list[tuple[float, float]]] = {}
    rows = []
    for (name, c), result in zip(jobs[1:], scores[1:]):
        points = series.setdefault(name, [(0.0, start.get("accuracy", float("nan")))])
        if "error" not in result:
            points.append((c["elapsed_s"], result["accuracy"]))
        rows.append({"framework": name, **c, **result})
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    out = {"device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "eval_tasks": n, "sft": start, "checkpoints": rows,
           "train_reward": {r["framework"]: r["train_reward"] for r in races}, "steps": {r["framework"]: r["steps"] for r in races}}
    (work / "race.json").write_text(json.dumps(out, indent=1))
    png = write_curve_png(work / "race.png", series, title=f"calculator, held-out greedy accuracy ({n} tasks), {device}",
                          x_label="training wall-clock s", y_label="held-out accuracy")
    print("\n| framework | training s | step | held-out accuracy | reward | well-formed calls | turns | truncated |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| SFT model | 0 | 0 | {start.get('accuracy', float('nan')):.3f} | {start.get('reward_mean', float('nan')):.3f} | {start.get('well_formed_call_rate', float('nan')):.2f} | "
          f"{start.get('turns_mean', float('nan')):.2f} | {start.get('truncated_rate', float('nan')):.2f} |")
    for r in rows:
        if "error" in r:
            print(f"| {r['framework']} | {r['elapsed_s']:.0f} | {r['step']} | failed: {r['error'][:60]} | | | | |")
            continue
        print(f"| {r['framework']} | {r['elapsed_s']:.0f} | {r['step']} | {r['accuracy']:.3f} | {r['reward_mean']:.3f} | {r['well_formed_call_rate']:.2f} | "
              f"{r['turns_mean']:.2f} | {r['truncated_rate']:.2f} |")
    print(f"wrote {png} and {work / 'race.json'}")


if __name__ == "__main__":
    main()
