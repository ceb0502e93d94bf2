"""What the harness endpoint costs: per-request overhead over the generator's own latency, and
episodes/s of the openai-client agent (examples/openai_agent) against the same agent as an Environment.

Overhead, per request: the time the harness's ``client.chat.completions.create`` took, minus the time
the generator's ``generate`` took for that request (timed in ``HarnessEnvironment.sample``, paired by
episode and turn). What is left is everything the harness path adds around sampling: the openai
client building the request and parsing the reply (pydantic), HTTP over loopback, the endpoint's
request checks and history match, the hand-over to the episode, and the engine's own per-turn work
(parse, bridge) that every environment pays too. Two generators:

* ``replay``: no model: each request sleeps ``--latency`` (asyncio) and returns the ids of a fixed
  calculator turn (a call, then after two tool results an answer), so the endpoint's CPU cost is
  measured without decoding competing for the cores.
* ``model``: the bundled model on ``TransformersGenerator``, started through ``run_with`` as train
  and eval do (decoding on the main thread, the event loop on a helper): the cost as a run sees it.

Episodes/s compares ``examples/openai_agent`` (``CalculatorAgentEnv``) with ``CalculatorEnv`` (the
same prompt, tool, rewards and turn limit; the engine runs its tool) on the same tasks, seeds and
generator.

    python benchmarks/harness_endpoint.py                 # 64 concurrent episodes, appends to RESULTS.md
    python benchmarks/harness_endpoint.py --episodes 16 --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "openai_agent"))

import agent as agent_module  # noqa: E402
from harness_env import CalculatorAgentEnv  # noqa: E402

from agentrl.chat import get_chat_format  # noqa: E402
from agentrl.compute.models import load_model, load_tokenizer  # noqa: E402
from agentrl.env.harness import HarnessEnvironment  # noqa: E402
from agentrl.environments.calculator import CalculatorEnv  # noqa: E402
from agentrl.generators import run_with  # noqa: E402
from agentrl.generators.hf.generator import TransformersGenerator  # noqa: E402
from agentrl.generators.protocol import Generation, SamplingParams  # noqa: E402
from agentrl.rollout import RolloutConfig, RolloutEngine  # noqa: E402


class Replay:
    """A generator without a model: a fixed latency, then a fixed calculator turn's ids."""

    def __init__(self, fmt: Any, latency_s: float) -> None:
        self.latency_s = latency_s
        call = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2 + 3"}}}
            ],
        }
        answer = {"role": "assistant", "content": "The answer is 5."}
        user = [{"role": "user", "content": "What is 2 + 3?"}]
        self.call_ids = fmt.assistant_ids(user, call, agent_module.TOOLS)
        self.answer_ids = fmt.assistant_ids(user, answer, agent_module.TOOLS)
        self.fmt = fmt

    async def generate(self, prompt_ids: list[int], sampling: Any) -> Generation:
        await asyncio.sleep(self.latency_s)
        ids = self.answer_ids if self.fmt.decode(prompt_ids[-40:]).count("</tool_response>") else self.call_ids
        return Generation(list(ids), [0.0] * len(ids), "stop")

    def begin_rollout(self) -> None: ...
    def end_rollout(self) -> None: ...
    def track_episodes(self, delta: int) -> None: ...
    def run_rollouts(self, rollouts: Any) -> Any:
        return rollouts()

    async def close(self) -> None: ...


class Timed(CalculatorAgentEnv):
    """The example's environment, timing each turn's generate call and the engine's work around it
    (from the request's arrival to the generate call, and from its return to ``step``)."""

    gen_s: dict[str, list[float]]
    client_s: dict[str, list[float]]
    engine_s: list[float]

    async def sample(self, turn: Any, generate: Any) -> Generation:
        arrived = self._ep.pending.at if self._ep.pending is not None else None

        async def timed(ids: list[int], sampling: Any) -> Generation:
            t0 = time.perf_counter()
            try:
                return await generate(ids, sampling)
            finally:
                self._generated = time.perf_counter()
                self.gen_s[self._ep.key].append(self._generated - t0)
                self._before = t0 - arrived if arrived is not None else 0.0

        return await super().sample(turn, timed)

    async def step(self, message: Any) -> Any:
        self.engine_s.append(self._before + time.perf_counter() - self._generated)
        return await super().step(message)


def timed_client(env: Timed, key: str, client: Any) -> Any:
    """Wraps ``client.chat.completions.create`` to record its duration (the agent is untouched)."""
    create = client.chat.completions.create

    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await create(*args, **kwargs)
        finally:
            env.client_s[key].append(time.perf_counter() - t0)

    client.chat.completions.create = wrapped
    return client


def harness_env(tasks_env: CalculatorEnv) -> Timed:
    env = Timed()
    env.gen_s, env.client_s, env.engine_s = defaultdict(list), defaultdict(list), []

    async def run(task: dict[str, Any], client: Any) -> None:
        key = str(client.base_url).rstrip("/").split("/")[-2]
        await agent_module.solve(timed_client(env, key, client), task["question"])

    HarnessEnvironment.__init__(env, run, datasets=tasks_env, rewards=tasks_env.rewards, max_turns=tasks_env.max_turns)
    return env


def rollout(
    generator: Any, fmt: Any, env: Any, tasks: list[dict[str, Any]], concurrency: int
) -> tuple[list[Any], float]:
    engine = RolloutEngine(
        generator, fmt, RolloutConfig(max_concurrent_episodes=concurrency), SamplingParams(temperature=1.0, seed=1)
    )

    async def main() -> tuple[list[Any], float]:
        t0 = time.perf_counter()
        groups = await engine.run(env, tasks, n=1, seed=0)
        return [g.trajectories[0] for g in groups], time.perf_counter() - t0

    generator.begin_rollout()
    try:
        return run_with(generator, main)
    finally:
        generator.end_rollout()


def overheads(env: Timed) -> list[float]:
    out = []
    for key, client in env.client_s.items():
        gen = env.gen_s.get(key, [])
        out += [c - g for c, g in zip(client, gen)]
    return out


def row(name: str, env: Timed, episodes: int, wall: float) -> str:
    ov = overheads(env)
    gen = [g for v in env.gen_s.values() for g in v]
    own = env.endpoint_seconds()
    engine = env.engine_s
    ms = lambda v: f"{v * 1000:.2f}"  # noqa: E731
    return (
        f"| {name} | {episodes} | {len(ov)} | {ms(statistics.mean(gen))} | {ms(statistics.mean(ov))} | {ms(pct(ov, 0.5))} | "
        f"{ms(pct(ov, 0.95))} | {ms(statistics.mean(own))} | {ms(pct(own, 0.5))} | {ms(pct(own, 0.95))} | "
        f"{ms(statistics.mean(engine))} | {ms(statistics.mean(ov) - statistics.mean(own) - statistics.mean(engine))} | {episodes / wall:.2f} |"
    )


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.05, help="the replay generator's latency per request (s)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    fmt = get_chat_format(load_tokenizer("default"))
    tasks_env = CalculatorEnv()
    tasks = list(tasks_env.dataset("test"))[: args.episodes]
    lines: list[str] = []

    def report(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    # 1. Overhead with the replay generator: the endpoint's own cost.
    env = harness_env(tasks_env)
    trajs, wall = rollout(Replay(fmt, args.latency), fmt, env, tasks, args.episodes)
    assert all(t.ok for t in trajs), [t.error for t in trajs if not t.ok][:3]
    report(row(f"replay ({args.latency * 1000:.0f} ms)", env, args.episodes, wall))

    # 2. The same with the bundled model, and the same agent as an Environment.
    torch.manual_seed(0)
    model = load_model("default", dtype=torch.float32, device="cpu")
    generator = TransformersGenerator(model, pad_token_id=fmt.tokenizer.pad_token_id)
    env = harness_env(tasks_env)
    trajs, wall_h = rollout(generator, fmt, env, tasks, args.episodes)
    assert all(t.ok for t in trajs), [t.error for t in trajs if not t.ok][:3]
    report(row("bundled model", env, args.episodes, wall_h))
    turns_h = sum(len(t.turns) for t in trajs)
    reward_h = statistics.mean(t.reward for t in trajs)
    trajs_e, wall_e = rollout(generator, fmt, CalculatorEnv(), tasks, args.episodes)
    turns_e = sum(len(t.turns) for t in trajs_e)
    reward_e = statistics.mean(t.reward for t in trajs_e)
    same = sum(a.samples[0].ids == b.samples[0].ids for a, b in zip(trajs, trajs_e))
    report("")
    report("| agent | episodes/s | turns | mean reward | wall s |")
    report("|---|---|---|---|---|")
    report(
        f"| examples/openai_agent (HarnessEnvironment) | {args.episodes / wall_h:.2f} | {turns_h} | {reward_h:.3f} | {wall_h:.1f} |"
    )
    report(
        f"| CalculatorEnv (Environment) | {args.episodes / wall_e:.2f} | {turns_e} | {reward_e:.3f} | {wall_e:.1f} |"
    )
    report(f"episodes with identical token sequences under both: {same} of {args.episodes}")

    if not args.no_write:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        load = os.getloadavg()[0]
        head = (
            f"\n### {stamp}, this {os.cpu_count()}-core CPU ({platform.processor() or platform.machine()}; load {load:.1f} at the end), "
            f"torch {torch.__version__}, at {commit}\n\n`python benchmarks/{Path(__file__).name} {shlex.join(sys.argv[1:])}`\n\n"
            "| generator | concurrent episodes | requests | generate ms (mean) | client-seen overhead ms (mean) | p50 | p95 | "
            "endpoint's own ms (mean) | p50 | p95 | engine's per-turn work ms (mean) | the rest: openai client, loopback, loop ms (mean) | episodes/s |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
        )
        results = ROOT / "benchmarks" / "RESULTS.md"
        text = results.read_text()
        section = (
            "## Harness endpoint: overhead per request, and the openai-client agent against an Environment (issue 46)\n"
        )
        if section not in text:
            text += "\n" + section
        results.write_text(text.rstrip("\n") + "\n" + head + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
