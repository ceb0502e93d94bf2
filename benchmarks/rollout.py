"""Episodes per second of the rollout engine against a lockstep (TRL-style) tool loop, in one run.

What it measures: the bundled model (CPU) plays the calculator environment, whose tool is wrapped
to sleep (asyncio) for a latency drawn from a seeded log-normal distribution, like a real API or
sandbox call (default median 0.2 s, p95 1 s). Two schedulers run the same episodes:

* ``engine``: ``RolloutEngine`` as shipped. Every episode is its own task; while one waits for its
  tool, the others keep generating, and the generator batches whatever requests are queued.
* ``lockstep``: what TRL's tool loop does. All live episodes generate their turn together (one
  batch: every request issued at once, all awaited together), then all their tool calls run
  (concurrently with each other), and the next turn starts only when the slowest tool finished.

Why: in lockstep every turn costs as much as the slowest tool call of the whole batch, so a long
latency tail idles the model; the engine overlaps one episode's tool wait with the others' decoding.

Only scheduling differs: the lockstep baseline is the same engine code (environment, chat format
render/parse/bridge, budgets, seeds, ``TransformersGenerator``) behind ``LockstepGenerator``, a
barrier holding each generate request until every live episode has submitted one, then issuing
them all as one generator batch (like one batched generate() call). An episode submits only after
its tool returned, so the barrier is exactly "the next turn waits for the slowest tool". Tasks,
seeds (environment, per-turn sampling, per-episode tool latencies), concurrency (all episodes in
flight) and model/sampling settings are identical. The table counts episodes that sampled exactly
the same tokens under both. A zero-latency variant shows what the engine costs when tools are
instant. Torch gets all cores but one: the event loop (templates, tokenizing) needs one, and
oversubscribed OpenMP threads on a busy CPU made decoding ~20x slower when tried.

    python benchmarks/rollout.py                       # 64 and 256 episodes, appends to RESULTS.md
    python benchmarks/rollout.py --episodes 32 --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import math
import os
import platform
import random
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import torch

from agentrl import Tool, make
from agentrl.chat import get_chat_format
from agentrl.chat.base import ChatFormat
from agentrl.compute.models import load_model, load_tokenizer
from agentrl.core.trajectory import Trajectory
from agentrl.env.environment import Environment
from agentrl.generators.hf.generator import TransformersGenerator
from agentrl.generators.protocol import Generation, SamplingParams
from agentrl.rollout import RolloutConfig, RolloutEngine

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
HEADER = (
    "# Benchmark results\n\nEach entry records the machine, the date, the exact command, the numbers, and the\n"
    "baseline measured in the same run (numbers are only compared within one run on one machine).\n"
)
SECTION = "## Rollout engine vs lockstep"
SECTION_INTRO = (
    "`benchmarks/rollout.py`: the bundled model on CPU plays the calculator environment with a tool that\n"
    "sleeps a seeded log-normal latency. `engine` = `RolloutEngine` (episodes as independent tasks);\n"
    "`lockstep` = TRL-style loop (one generator batch per turn, then all tools, next turn after the\n"
    "slowest tool): the same engine code behind a barrier, so only scheduling differs. Speedup = engine\n"
    "episodes/s over lockstep episodes/s; \"same tokens\" = episodes that sampled identical ids in both.\n"
)
Z95 = 1.6448536269514722  # standard normal 95th percentile


class LatencyTool(Tool):
    """Wraps a tool (same name and schema) and sleeps a log-normal latency before each call.

    Latencies come from a per-episode RNG seeded by the benchmark seed and the episode's own
    environment RNG, so an episode sees the same latency sequence under either scheduler.
    """

    def __init__(self, inner: Tool, median_s: float, p95_s: float, seed: int, max_concurrency: int) -> None:
        self.inner, self.seed = inner, seed
        self.name = inner.tool_name
        self.injected = ("env",)
        self.timeout = 600.0  # the tail is the point: never cut it
        self.max_output_chars = inner.max_output_chars
        self.max_concurrency = max_concurrency  # a scaled-out API: the tool itself never queues
        self.__dict__["_schema"] = inner.schema  # the model sees exactly the calculator it was trained on
        self.mu = math.log(median_s) if median_s > 0 else None
        self.sigma = math.log(p95_s / median_s) / Z95 if median_s > 0 and p95_s > median_s else 0.0

    async def run(self, expression: str, env: Any) -> str:
        if self.mu is not None:
            state = env.episode["state"]
            if "latency_rng" not in state:
                state["latency_rng"] = random.Random(self.seed * 1_000_003 + env.rng.getrandbits(62))
            await asyncio.sleep(state["latency_rng"].lognormvariate(self.mu, self.sigma))
        return self.inner.run(expression=expression)


class LockstepGenerator:
    """A barrier in front of a generator: requests go out only when every live episode has one.

    Then all of them are issued together (one ``gather``, one batch) and awaited together.
    ``episode_done`` (the engine's ``on_episode``) removes a finished episode from the barrier.
    """

    def __init__(self, inner: TransformersGenerator, live: int) -> None:
        self.inner, self.live, self.rounds = inner, live, 0
        self.batch_cap = inner.max_batch_size
        self.pending: list[tuple[list[int], SamplingParams, asyncio.Future[Generation]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        future: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        self.pending.append((prompt_ids, sampling, future))
        self._release_if_complete()
        return await future

    def track_episodes(self, delta: int) -> None:
        """Ignored: the barrier counts its own live episodes (``episode_done``)."""

    def episode_done(self, _traj: Trajectory) -> None:
        self.live -= 1
        self._release_if_complete()

    def _release_if_complete(self) -> None:
        if self.pending and len(self.pending) >= self.live:
            batch, self.pending = self.pending, []
            self.rounds += 1
            task = asyncio.get_running_loop().create_task(self._issue(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _issue(self, batch: list[tuple[list[int], SamplingParams, asyncio.Future[Generation]]]) -> None:
        # One batch per round, as one batched generate() call would be: the worker starts when the
        # round's last request is queued (rounds never overlap), not when the 5 ms window ends.
        self.inner.max_batch_size = min(len(batch), self.batch_cap)
        self.inner.gather_window_s = 10.0
        results = await asyncio.gather(*(self.inner.generate(p, s) for p, s, _ in batch), return_exceptions=True)
        for (_, _, future), result in zip(batch, results):
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)


@dataclass
class Result:
    """One rollout of one scheduler."""

    scheduler: str
    wall_s: float
    ok: int
    errors: int
    sampled: int
    turns: int
    batches: int
    rounds: int  # lockstep barrier releases (0 for the engine)
    ids: list[list[int]]  # completion ids per episode, to check both schedulers sampled the same

    @property
    def episodes_per_s(self) -> float:
        return self.ok / self.wall_s


def latency_env(median_s: float, p95_s: float, seed: int, concurrency: int) -> Environment:
    env = make("calculator")
    env.tools = [LatencyTool(t, median_s, p95_s, seed, concurrency) for t in env.tools]  # type: ignore[attr-defined]
    return env


async def rollout(
    scheduler: str, model: torch.nn.Module, fmt: ChatFormat, env: Environment,
    tasks: list[dict[str, Any]], config: RolloutConfig, sampling: SamplingParams, seed: int, gather_window_s: float,
) -> Result:
    generator = TransformersGenerator(model, pad_token_id=fmt.tokenizer.pad_token_id, gather_window_s=gather_window_s)
    lockstep = LockstepGenerator(generator, len(tasks)) if scheduler == "lockstep" else None
    engine = RolloutEngine(lockstep or generator, fmt, config, sampling)  # type: ignore[arg-type]
    start = time.perf_counter()
    try:
        groups = await engine.run(env, tasks, n=1, seed=seed, on_episode=lockstep.episode_done if lockstep else None)
    finally:
        await generator.close()
    wall = time.perf_counter() - start
    trajs = [t for g in groups for t in g.trajectories]
    ok = [t for t in trajs if t.ok]
    return Result(
        scheduler, wall, len(ok), len(trajs) - len(ok), sum(t.num_sampled for t in ok), sum(len(t.turns) for t in ok),
        generator.stats["batches"], lockstep.rounds if lockstep else 0, [t.completion_ids if t.ok else [] for t in trajs],
    )


Row = tuple[int, str, list[Result], list[Result]]  # episodes, latency label, lockstep repeats, engine repeats


def rate(runs: list[Result]) -> float:
    """Episodes per second over all repeats."""
    return sum(r.ok for r in runs) / sum(r.wall_s for r in runs)


def summary(rows: list[Row]) -> list[str]:
    """How much of its instant-tool throughput each scheduler keeps once tools take time."""
    instant = {(n, i): rate(runs) for n, label, *pair in rows if label == "none" for i, runs in enumerate(pair)}
    out = []
    for n, label, *pair in rows:
        if label != "none" and (n, 0) in instant:
            kept = [f"{runs[0].scheduler} {rate(runs) / instant[(n, i)]:.0%}" for i, runs in enumerate(pair)]
            out.append(f"- {n} episodes, tool latency {label}: throughput kept vs instant tools: {', '.join(kept)}")
    return out


def cpu_model() -> str:
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


def table(rows: list[Row]) -> str:
    """Totals over repeats (episodes / summed wall time); the speedup range is over repeats."""
    lines = [
        "| episodes | tool latency | scheduler | wall s (mean) | episodes/s | sampled tok/s | mean turns "
        "| generate batches (mean) | speedup (min–max) | same tokens |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, label, base, eng in rows:
        ratios = [e.episodes_per_s / b.episodes_per_s for b, e in zip(base, eng)]
        same = sum(a == b for a, b in zip(base[0].ids, eng[0].ids))
        for rs in (base, eng):
            wall = sum(r.wall_s for r in rs)
            cells = [
                str(n), label, rs[0].scheduler + (f" ({sum(r.errors for r in rs)} errors)" if any(r.errors for r in rs) else ""),
                f"{wall / len(rs):.1f}", f"{rate(rs):.2f}", f"{sum(r.sampled for r in rs) / wall:.0f}",
                f"{sum(r.turns for r in rs) / max(sum(r.ok for r in rs), 1):.2f}", f"{sum(r.batches for r in rs) / len(rs):.1f}",
                f"**{rate(eng) / rate(base):.2f}x** ({min(ratios):.2f}–{max(ratios):.2f})" if rs is eng else "1.00x",
                f"{same}/{n}" if rs is eng else "",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def append_results(path: Path, block: str) -> None:
    """Add ``block`` at the end of the section (created, with the file, if absent)."""
    text = path.read_text(encoding="utf-8") if path.exists() else HEADER
    if SECTION not in text:
        text = f"{text.rstrip()}\n\n{SECTION}\n\n{SECTION_INTRO}"
    start = text.index(SECTION) + len(SECTION)
    nxt = text.find("\n## ", start)
    end = len(text) if nxt < 0 else nxt + 1
    rest = "" if nxt < 0 else "\n" + text[end:]
    path.write_text(f"{text[:end].rstrip()}\n\n{block.rstrip()}\n{rest}", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, nargs="+", default=[64, 256], help="batch sizes to run")
    parser.add_argument("--latency-median", type=float, default=0.2, help="tool latency median, seconds")
    parser.add_argument("--latency-p95", type=float, default=1.0, help="tool latency 95th percentile, seconds")
    parser.add_argument("--seed", type=int, default=0, help="tasks, environment, sampling and latency seed")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each scheduler per setting (order alternates)")
    parser.add_argument("--gather-window", type=float, default=0.005, help="generator batching window, seconds")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                        help="torch threads (default: all cores but one, which the event loop needs)")
    parser.add_argument("--no-zero-latency", action="store_true", help="skip the instant-tool variant")
    parser.add_argument("--results", type=Path, default=RESULTS, help="markdown file to append to")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()

    load = os.getloadavg()
    started = datetime.datetime.now(datetime.timezone.utc)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = load_model("default", dtype=torch.float32, device="cpu")
    fmt = get_chat_format(load_tokenizer("default"))
    sampling = SamplingParams(temperature=args.temperature, seed=args.seed)
    config = RolloutConfig(
        max_context=model.config.max_position_embeddings,
        max_concurrent_episodes=max(args.episodes),
    )
    data = make("calculator").dataset("test")
    latencies = [(args.latency_median, args.latency_p95)] + ([] if args.no_zero_latency else [(0.0, 0.0)])

    async def run_all() -> list[Row]:
        warm = latency_env(0.0, 0.0, args.seed, 8)  # threads, template, allocator: not timed
        await rollout("engine", model, fmt, warm, [dict(data[i]) for i in range(8)], config, sampling, args.seed, args.gather_window)
        rows: list[Row] = []
        for median, p95 in latencies:
            label = f"median {median:g} s, p95 {p95:g} s" if median > 0 else "none"
            for n in args.episodes:
                tasks = [dict(data[i % len(data)]) for i in range(n)]
                runs: dict[str, list[Result]] = {"lockstep": [], "engine": []}
                for rep in range(args.repeats):  # alternate the order so drift in machine load hits both
                    for scheduler in ("lockstep", "engine") if rep % 2 == 0 else ("engine", "lockstep"):
                        env = latency_env(median, p95, args.seed, n)
                        r = await rollout(scheduler, model, fmt, env, tasks, config, sampling, args.seed, args.gather_window)
                        runs[scheduler].append(r)
                        print(f"{scheduler:>8} n={n:<4} latency={label}: {r.wall_s:.1f} s, {r.episodes_per_s:.2f} ep/s, "
                              f"{r.batches} batches, {r.rounds} rounds", file=sys.stderr)
                rows.append((n, label, runs["lockstep"], runs["engine"]))
        return rows

    rows = anyio.run(run_all)
    total = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()
    shared = load[0] > 1
    params = sum(p.numel() for p in model.parameters())
    mu = args.latency_median
    sigma = math.log(args.latency_p95 / mu) / Z95 if args.latency_p95 > mu > 0 else 0.0
    block = "\n".join([
        f"### {started:%Y-%m-%d %H:%M} UTC",
        "",
        f"- command: `{shlex.join(['python', *sys.argv])}` ({total:.0f} s in all)",
        f"- machine: {platform.platform()}, {cpu_model()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, torch {torch.__version__}, torch threads: {torch.get_num_threads()}",
        f"- load average at start (1/5/15 min): {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}"
        + (" — **shared machine**: other processes were using the CPU, absolute numbers are pessimistic" if shared else ""),
        f"- model: bundled default ({params / 1e6:.1f}M params, float32, CPU); temperature {args.temperature:g}, "
        f"seed {args.seed}; calculator test tasks; all episodes in flight at once; tool latency log-normal "
        f"(median {mu:g} s, sigma {sigma:.2f}); {args.repeats} repeat(s) per scheduler, order alternating",
        "",
        table(rows),
        "",
        *summary(rows),
    ])
    print(block)
    if not args.no_write:
        append_results(args.results, block)
        print(f"\nappended to {args.results}", file=sys.stderr)


if __name__ == "__main__":
    main()
