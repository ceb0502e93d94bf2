"""math_python's scripted solver (the one scripts/train_default_model.py --env math_python learns
from) and its rewards, through the real environment and sandbox."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentrl.environments.math_python import GENERATORS, MathPythonEnv, computed, generate_tasks, solution_program

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "train_default_model.py"


def load_script() -> Any:
    spec = importlib.util.spec_from_file_location("train_default_model", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def call(code: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "python", "arguments": {"code": code}}}]}


def test_the_start_model_scripts_solver_gets_every_kind_right_through_the_environment() -> None:
    env = MathPythonEnv(num_train=200, num_test=50)
    tasks = []
    for i, kind in enumerate(GENERATORS):
        # the hardest-to-compute end of each kind too: three tasks per kind from two seeds
        tasks += generate_tasks(2, 100 + i, (kind,)) + [next(t for t in env.dataset("test") if t["kind"] == kind)]
    convos = load_script().math_conversations(env, tasks)  # raises when a program's output is not the answer
    assert len(convos) == len(tasks) == 3 * len(GENERATORS)
    for task, convo in zip(tasks, convos):
        roles = [m["role"] for m in convo]
        assert roles == ["system", "user", "assistant", "tool", "assistant"], roles
        assert convo[1]["content"] == task["question"]
        assert convo[2]["tool_calls"][0]["function"]["arguments"]["code"] == solution_program(task)
        assert convo[3]["content"].strip() == task["answer"]
        assert convo[4]["content"] == f"The answer is {task['answer']}."


def test_a_solved_episode_scores_correct_format_and_computed_and_a_miscopy_scores_below_one() -> None:
    env = MathPythonEnv(num_train=50, num_test=20)
    task = dict(env.dataset("test")[0])

    async def play(code: str, final: str) -> tuple[float, float, dict[str, Any]]:
        e = env.spawn()
        await e.reset(task=dict(task))
        _, r1, *_ = await e.step(call(code))
        _, r2, term, _, info = await e.step({"role": "assistant", "content": final})
        assert term
        return r1, r2, info["rewards"]

    right = solution_program(task)
    r1, r2, _ = anyio.run(play, right, f"The answer is {task['answer']}.")
    assert (r1, r2) == (0.5, pytest.approx(1.2))
    wrong_digit = str(int(task["answer"]) + 1)
    r1, r2, parts = anyio.run(play, right, f"The answer is {wrong_digit}.")  # right program, miscopied answer
    assert r1 == 0.5 and r2 == pytest.approx(0.2) and parts["correct"] == 0.0 and r1 + r2 < 1.0
    r1, r2, parts = anyio.run(play, "print(1)", f"The answer is {task['answer']}.")  # a lucky guess is still correct
    assert r1 == 0.0 and parts["correct"] == 1.0
    r1, r2, parts = anyio.run(play, right, f'The answer is {task["answer"]}."}}}}</tool_call>')  # stray call syntax
    assert parts == {"correct": 1.0, "format": 0.0, "computed": 0.0}


def test_computed_pays_once_per_episode_and_needs_the_exact_output() -> None:
    state: dict[str, Any] = {}
    msgs = [{"role": "user", "content": "q"}, {"role": "tool", "content": "12\n"}]
    assert computed(msgs, "123", state) == 0.0  # a prefix of the answer is not the answer
    msgs.append({"role": "tool", "content": " 123\n"})
    assert computed(msgs, "123", state) == 1.0
    msgs.append({"role": "tool", "content": "123"})
    assert computed(msgs, "123", state) == 0.0  # printing it again earns nothing more


def test_rewards_can_be_switched_off_and_the_solver_rejects_bad_questions() -> None:
    env = MathPythonEnv(num_train=10, num_test=5, format_weight=0, computed_weight=0)
    assert [r.name for r in env.rewards] == ["correct"]
    with pytest.raises(ValueError, match="no scripted solver"):
        solution_program({"kind": "poetry", "question": "?"})
    with pytest.raises(ValueError, match="expected form"):
        solution_program({"kind": "modpow", "question": "What is the remainder of nothing?"})


def test_the_script_needs_an_output_folder_for_math_python() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--env", "math_python"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--out is required with --env math_python" in done.stderr


def test_a_malformed_call_costs_the_format_reward_even_when_the_answer_is_right() -> None:
    env = MathPythonEnv(num_train=50, num_test=20)
    task = dict(env.dataset("test")[1])

    async def play() -> dict[str, Any]:
        e = env.spawn()
        await e.reset(task=dict(task))
        bad = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "python", "arguments": {"program": "print(1)"}}}]}
        msgs, *_ = await e.step(bad)
        assert "code" in msgs[0]["content"]  # the tool message names the missing argument
        await e.step(call(solution_program(task)))
        _, _, term, _, info = await e.step({"role": "assistant", "content": f"The answer is {task['answer']}."})
        assert term
        return info["rewards"]

    assert anyio.run(play) == {"correct": 1.0, "format": 0.0, "computed": 0.0}
