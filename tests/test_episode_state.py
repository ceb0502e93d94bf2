"""Per-episode state cannot leak: spawn() copies, check_env catches what leaks, eval and training see none.

The variants are in tests/stateful_envs.py: a list made in ``__init__``, a class attribute, a
stateful ``Tool`` object, the environment's own method as the tool, the injected ``state`` dict and
a TRL-style ``environment_factory``. Each tool call counts the entries of other episodes it saw
(the ``foreign`` reward component).
"""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from stateful_envs import VARIANTS, InitListEnv, MethodToolEnv, ToolObjectEnv

from agentrl import check_env, tool
from agentrl.cli.main import main
from agentrl.core.trajectory import read_jsonl
from agentrl.env.check import EnvCheckError
from agentrl.env.episode_copy import SpawnError
from agentrl.env.factory import FactoryEnvironment
from agentrl.environments.calculator import CalculatorEnv

HERE = Path(__file__).resolve().parent
SPEC = str(HERE / "stateful_envs.py")
CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2 + 3"}}}],
}


async def _interleave(env: Any, n: int) -> list[dict[str, float | None]]:
    """``n`` episodes reset, then each steps one call, round robin; their final reward components."""
    episodes = [env.spawn() for _ in range(n)]
    for i, e in enumerate(episodes):
        await e.reset(seed=i)
    for e in episodes:
        result = await e.step(CALL)
        assert result.tool_records[0].kind == "ok", result.tool_records[0]
    return [(await e.step({"role": "assistant", "content": "The answer is 5."})).info["rewards"] for e in episodes]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.__name__)
def test_each_spawned_episode_owns_its_tool_state(variant):
    components = anyio.run(_interleave, variant(num_train=50, num_test=10), 8)
    assert [c["calls"] for c in components] == [1.0] * 8
    assert [c["foreign"] for c in components] == [0.0] * 8


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.__name__)
def test_check_env_passes_every_variant(variant):
    check_env(variant(num_train=50, num_test=10))


@pytest.mark.parametrize("name", ["calculator", "search", "sokoban"])
def test_check_env_passes_the_built_in_environments(name):
    from agentrl import make

    check_env(make(name))


class ShallowSpawn(InitListEnv):
    """spawn() as it was before issue 41: a shallow copy."""

    def spawn(self):
        clone = copy.copy(self)
        clone._episode = None
        return clone


def test_check_env_fails_on_shared_mutable_state():
    with pytest.raises(EnvCheckError) as err:
        check_env(ShallowSpawn(num_train=50, num_test=10))
    assert "share the mutable env.seen" in str(err.value)


class ShallowMethods(MethodToolEnv):
    def spawn(self):
        clone = copy.copy(self)
        clone._episode = None
        return clone


def test_check_env_names_a_bound_method_tool_of_the_base_instance():
    with pytest.raises(EnvCheckError) as err:
        check_env(ShallowMethods(num_train=50, num_test=10))
    assert "tool 'calculator' is a bound method of the instance spawn() was called on" in str(err.value)


GLOBAL_SEEN: list[str] = []


@tool(name="calculator", injected=("state",))
def global_calculator(expression: str, state: dict[str, Any]) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: The expression, e.g. "12 * 7".
    """
    GLOBAL_SEEN.append(expression)
    return "5"


def test_check_env_fails_on_a_module_global_a_tool_writes():
    env = CalculatorEnv(num_train=50, num_test=10)
    env.tools = [global_calculator]
    with pytest.raises(EnvCheckError) as err:
        check_env(env)
    assert "(global test_episode_state.GLOBAL_SEEN), which a concurrent episode sees" in str(err.value)


def _closure_tool():
    seen: list[str] = []

    @tool(name="calculator")
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: The expression, e.g. "12 * 7".
        """
        seen.append(expression)
        return "5"

    return calculator


def test_check_env_fails_on_a_closure_a_tool_writes():
    env = CalculatorEnv(num_train=50, num_test=10)
    env.tools = [_closure_tool()]
    with pytest.raises(EnvCheckError) as err:
        check_env(env)
    assert "(closure seen), which a concurrent episode sees" in str(err.value)


class LockedEnv(CalculatorEnv):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lock = threading.Lock()


def test_what_cannot_be_copied_is_refused_by_name_and_can_be_declared_shared():
    env = LockedEnv(num_train=50, num_test=10)
    with pytest.raises(
        SpawnError,
        match=r"LockedEnv\.lock \(lock\) cannot be copied for each concurrent episode.*`shared = \(\.\.\.\)`",
    ):
        env.spawn()

    class SharedLock(LockedEnv):
        shared = ("lock",)

    env = SharedLock(num_train=50, num_test=10)
    assert env.spawn().lock is env.lock
    assert env.spawn().train_defaults is env.train_defaults  # a base class's shared names stay shared


def test_tool_copies_share_limits_datasets_stay_shared():
    env = ToolObjectEnv(num_train=50, num_test=10)
    data = env.dataset("train")
    a, b = env.spawn(), env.spawn()
    assert a.tools[0] is not b.tools[0] and a.tools[0].seen is not b.tools[0].seen
    assert a.tools[0].thread_budget() is b.tools[0].thread_budget() is env.tools[0].thread_budget()

    async def limiters():
        return a.tools[0].limiter(), b.tools[0].limiter()

    la, lb = anyio.run(limiters)
    assert la is lb
    assert a.dataset("train") is b.dataset("train") is data


def test_a_factory_builds_one_object_per_episode():
    made = []

    class Counter:
        def __init__(self) -> None:
            self.total = 0
            made.append(self)

        def reset(self, question: str) -> str:
            self.total = 0
            return " (start from 0)"

        def add(self, n: int) -> int:
            """Add n to the running total.

            Args:
                n: The number to add.
            """
            self.total += n
            return self.total

    data = CalculatorEnv(num_train=20, num_test=5).dataset("test")
    env = FactoryEnvironment(Counter, datasets={"train": data}, rewards=[lambda environment: float(environment.total)])
    assert [t.tool_name for t in env.tools] == ["add"]

    async def run():
        a, b = env.spawn(), env.spawn()
        ma, _ = await a.reset(seed=0)
        await b.reset(seed=1)
        call = {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"n": 2}}}],
        }
        await a.step(call)
        await b.step(call)
        out = await a.step(call)
        done = await a.step({"role": "assistant", "content": "4"})
        return ma, out, done, a, b

    messages, out, done, a, b = anyio.run(run)
    assert messages[-1]["content"].endswith(" (start from 0)")
    assert out.messages[0]["content"] == "4" and done.reward == 4.0
    assert a.instance is not b.instance and b.instance.total == 2 and len(made) == 3


def _eval_sightings(variant: str, n: int, out: Path) -> tuple[float, float]:
    """``agentrl eval`` of ``n`` concurrent episodes: (tool calls that ran, other episodes' entries seen)."""
    assert (
        main(
            [
                "eval",
                f"env={SPEC}:{variant}",
                "env_args.num_train=100",
                "model=default",
                f"n={n}",
                "sampling.temperature=1.0",
                f"output={out}",
            ]
        )
        == 0
    )
    trajs = read_jsonl(out / "results.jsonl")
    assert len(trajs) == n and all(t.error is None for t in trajs)
    return sum(t.rewards["calls"] for t in trajs), sum(t.rewards["foreign"] for t in trajs)


@pytest.mark.parametrize("variant", ["InitListEnv", "FactoryEnv"])
def test_concurrent_eval_sees_no_other_episodes_state(variant, tmp_path):
    calls, foreign = _eval_sightings(variant, 16, tmp_path / "eval")
    assert calls >= 8 and foreign == 0  # the bundled model calls the calculator in most episodes


@pytest.mark.slow
@pytest.mark.parametrize("variant", [v.__name__ for v in VARIANTS])
def test_a_64_episode_concurrent_eval_sees_no_other_episodes_state(variant, tmp_path):
    calls, foreign = _eval_sightings(variant, 64, tmp_path / "eval")
    print(f"{variant}: {calls:.0f} tool calls, {foreign:.0f} entries of other episodes seen")
    assert calls >= 32 and foreign == 0


def test_training_episodes_see_no_other_episodes_state(tmp_path):
    run = tmp_path / "run"
    argv = [
        "train",
        f"env={SPEC}:MethodToolEnv",
        "env_args.num_train=200",
        "model=default",
        "max_steps=2",
        "prompts_per_step=2",
        "num_generations=4",
        f"output_dir={run}",
    ]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) == 2
    assert all(r["reward/calls"] > 0 for r in rows)
    assert all(r["reward/foreign"] == 0 for r in rows)
