"""The calculator tool's safe parser, the task generator and the reward."""

from __future__ import annotations

import random
from fractions import Fraction

import anyio
import pytest

from agentrl import dispatch, make
from agentrl.core.messages import ToolCall
from agentrl.core.records import ToolRecord
from agentrl.environments.calculator import correct, extract_answer, generate_tasks, well_formatted
from agentrl.tools.calculator import Calculator, CalculatorError, evaluate, format_number


@pytest.mark.parametrize(
    "expr, value",
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("-3 - -4", 1),
        ("2 ** 3 ** 2", 512),
        ("-2 ** 2", -4),
        ("7 / 2", Fraction(7, 2)),
        ("7 // 2", 3),
        ("7 % 4", 3),
        ("0.1 + 0.2", Fraction(3, 10)),
        ("  12*7 ", 84),
    ],
)
def test_evaluate(expr, value):
    assert evaluate(expr) == value


def test_evaluate_agrees_with_python_on_random_expressions():
    rng = random.Random(0)
    for _ in range(300):
        parts = [str(rng.randint(0, 50))]
        for _ in range(rng.randint(1, 4)):
            parts += [rng.choice(["+", "-", "*"]), str(rng.randint(0, 50))]
        expr = " ".join(parts)
        assert evaluate(expr) == eval(expr)  # noqa: S307 - trusted, generated digits and operators only


@pytest.mark.parametrize(
    "expr, message",
    [
        ("1 / 0", "division by zero"),
        ("5 % (2 - 2)", "division by zero"),
        ("__import__('os')", "cannot read"),
        ("2 +", "ends too early"),
        ("(1 + 2", "ends too early"),
        ("1 2", "unexpected '2'"),
        ("", "empty expression"),
        ("9 ** 9 ** 9", "exponent larger"),
        ("2 ** 0.5", "whole-number exponents"),
        ("9" * 70, "too large"),
        ("1+" * 150 + "1", "longer than"),
        ("((((((((((((((((((((((((((((((((((1))))))))))))))))))))))))))))))))))", "nested"),
    ],
)
def test_evaluate_refuses_clearly(expr, message):
    with pytest.raises(CalculatorError, match=message):
        evaluate(expr)


def test_format_number():
    assert format_number(Fraction(84)) == "84"
    assert format_number(Fraction(7, 2)) == "3.5"
    assert format_number(Fraction(1, 3)) == "0.3333333333"


def test_tool_one_operation_per_call():
    calc = Calculator(max_ops=1)
    results = anyio.run(
        dispatch,
        [ToolCall("calculator", {"expression": "3 + 4"}), ToolCall("calculator", {"expression": "3 + 4 * 2"}), ToolCall("calculator", {"expression": "1/0"})],
        {"calculator": calc},
    )
    assert [r.message["content"] for r in results] == [
        "7",
        "Error: this calculator does 1 operation per call; the expression has 2. Split it into steps.",
        "Error: division by zero",
    ]
    assert [r.record.kind for r in results] == ["ok", "error", "error"]


def test_tasks_are_seeded_and_solvable_step_by_step():
    a = generate_tasks(200, seed=5, difficulty=(1, 2, 3))
    assert a == generate_tasks(200, seed=5, difficulty=(1, 2, 3))
    assert {t["difficulty"] for t in a} == {1, 2, 3}
    for task in a:
        assert len(task["steps"]) == task["difficulty"]
        assert format_number(evaluate(task["expression"])) == task["answer"]
        value = evaluate(task["steps"][0], max_ops=1)
        for step in task["steps"][1:]:
            op, operand = step.split(" ")[1:]
            value = evaluate(f"{format_number(value)} {op} {operand}", max_ops=1)
        assert format_number(value) == task["answer"]


def test_reward_functions():
    assert extract_answer("The answer is -12.") == "-12"
    assert extract_answer("so 3 then 4") == "4"
    assert extract_answer("nothing") is None
    assert correct("The answer is 84.", "84") == 1.0
    assert correct("The answer is 84.0", "84") == 1.0
    assert correct("The answer is 85.", "84") == 0.0
    assert correct("", "84") == 0.0
    ok = ToolRecord("calculator", "ok", 0.0)
    bad = ToolRecord("calculator", "bad_json", 0.0)
    assert well_formatted("The answer is 3.", [ok]) == 1.0
    assert well_formatted("The answer is 3.", [ok, bad]) == 0.0
    assert well_formatted("3", [ok]) == 0.0
    assert well_formatted("The answer is 3.", []) == 0.0
    assert well_formatted("the answer is -3.5", [ok]) == 1.0
    assert well_formatted('The answer is 90"}}\n</tool_call>', [ok]) == 0.0, "leftover call syntax is not the answer as asked"
    assert correct('The answer is 90"}}\n</tool_call>', "90") == 1.0


def _call(expression: str) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}]}


def play_steps_right(env, task: dict, check=None) -> tuple[str, float]:
    """Call the tool once per step of ``task``, each with the previous result as its left operand;
    returns the last result and the rewards summed. ``check(reward, info)`` sees each step."""
    value, total = None, 0.0
    for step in task["steps"]:
        if value is not None:
            step = value + step[step.index(" ") :]
        msgs, reward, term, _, info = env.step(_call(step))
        value, total = msgs[0]["content"], total + reward
        assert not term and not value.startswith("Error")
        if check is not None:
            check(reward, info)
    return value, total


def test_two_step_episode_scores_correct_format_and_progress_per_step():
    env = make("calculator", difficulty=2, format_weight=0.1, progress_weight=0.5).sync()
    task = next(t for t in env.dataset("test") if t["difficulty"] == 2)
    env.reset(task=task, seed=0)

    def check(reward, info):
        assert info["rewards"] == {"progress": 0.5} and reward == pytest.approx(0.25), "each right step earns its share, on its turn"

    value, total = play_steps_right(env, task, check)
    _, reward, term, _, info = env.step({"role": "assistant", "content": f"The answer is {value}."})
    assert term and info["rewards"] == {"progress": 0.0, "correct": 1.0, "format": 1.0} and reward == pytest.approx(1.1)
    assert total + reward == pytest.approx(1.6)
    env.close()


def test_progress_counts_steps_in_order_only():
    env = make("calculator", difficulty=2, progress_weight=0.5, format_weight=0.0).sync()
    task = next(t for t in env.dataset("test") if t["difficulty"] == 2)
    env.reset(task=task, seed=0)
    second = task["steps"][1]
    # the second step's expression first: its value is not the first step's, so nothing is earned
    _, reward, *_ = env.step(_call(second))
    assert reward == 0.0
    _, reward, term, _, info = env.step({"role": "assistant", "content": "The answer is 0."})
    assert term and info["rewards"]["correct"] == 0.0 and reward < 1, "a wrong answer stays below the pass threshold"
    env.close()


def test_parts_credits_each_operand_and_operator_the_next_step_needs():
    env = make("calculator", difficulty=2, parts_weight=0.25, progress_weight=0.0, format_weight=0.0).sync()
    task = {"question": "What is (13 + 48) - 96?", "answer": "-35", "expression": "(13 + 48) - 96", "difficulty": 2, "steps": ["13 + 48", "61 - 96"]}
    env.reset(task=task, seed=0)
    msgs, *_, info = env.step(_call("13 + 4"))  # two of three parts: 13 and +
    assert msgs[0]["content"] == "17" and info["rewards"] == {"parts": pytest.approx(2 / 6)}
    # the second call's left operand is the previous result (17), whatever it was; the right one 96
    *_, info = env.step(_call("96 - 17"))  # swapped: "-" does not commute, so only the operator
    assert info["rewards"] == {"parts": pytest.approx(1 / 6)}
    _, _, term, _, info = env.step({"role": "assistant", "content": "The answer is 79."})
    assert term and info["rewards"] == {"parts": 0.0, "correct": 0.0}, "parts are paid once, on the turn of the call"
    env.close()


def test_parts_reward_is_bounded_and_a_wrong_episode_stays_below_the_pass_threshold():
    from agentrl.environments.calculator import call_parts, parts

    assert call_parts("48 + 13", Fraction(13), "+", Fraction(48)) == 3, "+ commutes"
    assert call_parts("13 +", Fraction(13), "+", Fraction(48)) == 0 and call_parts(None, Fraction(1), "+", Fraction(2)) == 0
    steps = ["13 + 48", "61 - 96"]
    calls = [_call("13 + 48"), {"role": "tool", "content": "61"}, _call("61 - 96"), {"role": "tool", "content": "-35"}]
    extra = [_call("61 - 96"), {"role": "tool", "content": "-35"}]  # calls past the task's steps earn nothing
    assert parts(calls + extra, steps, {}) == pytest.approx(1.0)
    env = make("calculator", difficulty=2, parts_weight=0.25).sync()
    task = next(t for t in env.dataset("test") if t["difficulty"] == 2)
    env.reset(task=task, seed=0)
    _, total = play_steps_right(env, task)
    _, reward, *_ = env.step({"role": "assistant", "content": "The answer is 1234567."})
    assert total + reward == pytest.approx(0.5 + 0.25 + 0.2) and total + reward < 1, "every step and part right, the answer wrong"
    env.close()


def test_shaping_weights_that_could_pass_a_wrong_episode_are_refused():
    with pytest.raises(ValueError, match="must stay below 1"):
        make("calculator", format_weight=0.2, progress_weight=0.5, parts_weight=0.3)
    with pytest.raises(ValueError, match="must stay below 1"):
        make("calculator", format_weight=0.5)  # with the default progress_weight 0.5
    assert [r.name for r in make("calculator", parts_weight=0.29).rewards] == ["correct", "format", "progress", "parts"]
