"""The built-in environments beyond calculator: registered, check_env clean, seeded disjoint splits,
and solvable (a scripted policy through the real step loop reaches full reward)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import agentrl
from agentrl.environments.math_python import GENERATORS, MathPythonEnv
from agentrl.environments.search import SearchEnv, normalize
from agentrl.environments.sokoban import Board, SokobanEnv, scripted_move, solve


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


def answer(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


@pytest.fixture(scope="module")
def envs() -> dict[str, Any]:
    return {
        "math_python": MathPythonEnv(num_train=300, num_test=50),
        "sokoban": SokobanEnv(num_train=200, num_test=30),
        "search": SearchEnv(num_test=40),
    }


@pytest.mark.parametrize("name", ["math_python", "sokoban", "search"])
def test_registered_check_env_clean_and_splits_disjoint(envs: dict[str, Any], name: str) -> None:
    assert name in agentrl.registered()
    assert agentrl.env.registry.resolve(name) is type(envs[name])
    env = envs[name]
    agentrl.check_env(env)
    train, test = env.dataset("train"), env.dataset("test")
    assert len(train) > 0 and len(test) > 0
    key = "board" if name == "sokoban" else "question"
    assert not set(train[key]) & set(test[key])
    again = type(env)(**({"num_train": 300, "num_test": 50} if name == "math_python" else {"num_train": 200, "num_test": 30} if name == "sokoban" else {"num_test": 40}))
    assert again.dataset("test")[key] == test[key], "splits must be reproducible from the seed"
    with pytest.raises(KeyError, match="splits"):
        env.dataset("validation")


def test_math_python_answers_are_exact_and_the_python_tool_solves_them(envs: dict[str, Any]) -> None:
    env = envs["math_python"]
    assert set(env.dataset("test")["kind"]) <= set(GENERATORS)
    task = next(t for t in env.dataset("test") if t["kind"] == "primes")
    n = int(task["question"].split("below ")[1].rstrip("?"))
    code = f"print(sum(all(k % d for d in range(2, int(k**0.5) + 1)) for k in range(2, {n})))"

    async def go() -> tuple[str, float]:
        e = env.spawn()
        await e.reset(task=dict(task))
        msgs, r1, term, _, _ = await e.step(call("python", code=code))
        assert not term and r1 == 0.5  # the per-turn `computed` reward: the program printed the answer
        result = msgs[0]["content"].strip()
        _, reward, term, _, info = await e.step(answer(f"The answer is {result}."))
        assert term and info["rewards"] == {"correct": 1.0, "format": 1.0, "computed": 0.0}
        return result, reward

    result, reward = anyio.run(go)
    assert result == task["answer"] and reward == pytest.approx(1.2)
    with pytest.raises(ValueError, match="unknown problem kinds"):
        MathPythonEnv(kinds=["poetry"])


def test_sokoban_levels_are_solvable_and_rewards_come_per_turn(envs: dict[str, Any]) -> None:
    env = envs["sokoban"]
    for task in env.dataset("test"):
        assert len(solve(Board.parse(task["board"])) or []) == task["optimal"] > 0

    async def play(task: dict[str, Any]) -> tuple[float, list[float], dict[str, Any]]:
        e = env.spawn()
        await e.reset(task=task)
        rewards = []
        while True:
            _, r, term, trunc, info = await e.step(call("move", direction=scripted_move(task, e.episode["state"])))
            rewards.append(r)
            if term or trunc:
                return sum(rewards), rewards, info

    task = max(env.dataset("test"), key=lambda t: t["optimal"])
    total, per_turn, info = anyio.run(play, dict(task))
    assert info["rewards"]["solved"] == 1.0 and len(per_turn) == task["optimal"]
    assert per_turn[-1] > 1.0 and all(r < 0.5 for r in per_turn[:-1])  # the final push carries progress + solved

    async def bump() -> tuple[str, float, bool]:
        e = env.spawn()
        await e.reset(task=dict(task))
        msgs, r, term, _, _ = await e.step(call("move", direction="sideways"))
        return msgs[0]["content"], r, term

    text, r, term = anyio.run(bump)
    # A bad move ends the episode unsolved: its step cost, the format penalty and the turns it did not play.
    assert "unknown direction" in text and term and r == pytest.approx(-0.02 * env.max_turns - 0.2)


def test_search_questions_need_two_articles_and_are_answerable(envs: dict[str, Any]) -> None:
    env = envs["search"]
    docs = {d["title"]: d for d in env.corpus.docs}
    for q in env.dataset("test"):
        first, second = (docs[h] for h in q["hops"])
        assert normalize(q["answer"]) not in normalize(first["text"]), q
        assert q["hops"][0] not in second["text"], q
        assert normalize(q["answer"]) in normalize(second["text"]), q

    async def solve_by_hand(q: dict[str, Any]) -> float:
        e = env.spawn()
        await e.reset(task=dict(q))
        searches = 0
        for hop in q["hops"]:
            msgs, *_ = await e.step(call("search", query=hop))
            searches += 1
            doc_id = msgs[0]["content"].splitlines()[0].split(":")[0]
            await e.step(call("open", doc_id=doc_id))
        assert searches >= 2
        _, reward, *_ = await e.step(answer(f"The answer is {q['answer']}."))
        return reward

    rewards = [anyio.run(solve_by_hand, dict(q)) for q in list(env.dataset("test"))[:10]]
    assert rewards == [1.0] * 10
