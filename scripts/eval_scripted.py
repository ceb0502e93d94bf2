"""Play an environment's test split with a scripted policy through the real step loop.

Shows an environment is solvable (the reference policy) and what chance alone scores (random):
    python scripts/eval_scripted.py sokoban reference|random [n]
    python scripts/eval_scripted.py search reference [n]
    python scripts/eval_scripted.py math_python reference [n]
"""

from __future__ import annotations

import random
import statistics
import sys
from typing import Any

import anyio

import agentrl
from agentrl.environments.math_python import solution_program
from agentrl.environments.sokoban import MOVES, scripted_move


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


async def sokoban(env: Any, task: dict[str, Any], policy: str, rng: random.Random) -> float:
    await env.reset(task=task)
    total = 0.0
    while True:
        move = scripted_move(task, env.episode["state"]) if policy == "reference" else rng.choice(list(MOVES))
        _, reward, term, trunc, info = await env.step(call("move", direction=move))
        total += reward
        if term or trunc:
            return float(info["rewards"].get("solved") or 0.0)


async def search(env: Any, task: dict[str, Any], policy: str, rng: random.Random) -> float:
    await env.reset(task=task)
    for hop in task["hops"]:
        msgs, *_ = await env.step(call("search", query=hop))
        await env.step(call("open", doc_id=msgs[0]["content"].splitlines()[0].split(":")[0]))
    _, reward, *_ = await env.step({"role": "assistant", "content": f"The answer is {task['answer']}."})
    return reward


async def math_python(env: Any, task: dict[str, Any], policy: str, rng: random.Random) -> float:
    """The scripted solver's program, then its printed output as the answer."""
    await env.reset(task=task)
    msgs, *_ = await env.step(call("python", code=solution_program(task)))
    _, _, _, _, info = await env.step({"role": "assistant", "content": f"The answer is {msgs[0]['content'].strip()}."})
    return float(info["rewards"]["correct"])


def main() -> None:
    name, policy = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 50
    env = agentrl.make(name)
    play = {"sokoban": sokoban, "search": search, "math_python": math_python}[name]
    rng = random.Random(0)
    tasks = list(env.dataset("test"))[:n]

    async def run() -> list[float]:
        return [await play(env.spawn(), dict(t), policy, rng) for t in tasks]

    scores = anyio.run(run)
    print(f"{name} {policy}: success {statistics.fmean(scores):.2f} over {len(scores)} test tasks")


if __name__ == "__main__":
    main()
