"""The calculator environment: arithmetic questions answered with a calculator tool.

Tasks are generated from a seed. Difficulty ``d`` means ``d`` operations, e.g. level 1
"What is 37 + 45?", level 2 "What is (37 + 45) * 3?". With ``max_ops_per_call=1`` (the default)
the tool does one operation per call, so a level-``d`` task needs ``d`` calls. The test split is
generated from its own seed and every test question is removed from train, so training never
sees it. Rewards: see ``CalculatorEnv``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from datasets import Dataset

from agentrl.core.records import MALFORMED
from agentrl.env.environment import Reward, ToolEnvironment
from agentrl.tools.calculator import Calculator, format_number

ANSWER_RE = re.compile(r"answer is\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
# The whole final message as asked: "The answer is N." and nothing else (no call syntax left over).
ANSWER_ONLY_RE = re.compile(r"\s*(?:the )?answer is\s*-?\d+(?:\.\d+)?\s*\.?\s*", re.IGNORECASE)
NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")
CALL_RE = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*([-+*/])\s*(-?\d+(?:\.\d+)?)\s*")
QUESTION_FORMS = ("What is {}?", "Compute {}.", "Calculate {}.")
SPLIT_SEEDS = {"train": 1, "test": 2}


def extract_answer(text: str) -> str | None:
    """The number after "answer is", else the last number in the text."""
    match = ANSWER_RE.search(text or "")
    if match:
        return match.group(1)
    numbers = NUMBER_RE.findall(text or "")
    return numbers[-1] if numbers else None


def correct(completion: str, answer: str) -> float:
    """1.0 when the final message's answer equals the task's answer exactly."""
    found = extract_answer(completion)
    if found is None:
        return 0.0
    try:
        return float(Fraction(found) == Fraction(answer))
    except (ValueError, ZeroDivisionError):
        return 0.0


def well_formatted(completion: str, tool_records: list[Any]) -> float:
    """1.0 when at least one tool call was made, none was malformed, and the final message is the
    answer statement alone. "Alone" matters: during RL the model learns to end its answer with the
    tail of a tool call (``The answer is 90"}}</tool_call>``); ``correct`` still finds the number,
    so without this check the stray syntax is rewarded whenever the number is right and the
    well-formed rate decays (benchmarks/RESULTS.md, issue 18)."""
    if not tool_records or any(r.kind in MALFORMED for r in tool_records):
        return 0.0
    return float(ANSWER_ONLY_RE.fullmatch(completion or "") is not None)


def step_values(steps: Sequence[str]) -> list[Fraction]:
    """The value after each of a task's steps ("37 + 45", "82 * 3", ...)."""
    values = []
    for step in steps:
        a, op, b = step.split(" ")
        x, y = Fraction(a), Fraction(b)
        values.append({"+": x + y, "-": x - y, "*": x * y, "/": x / y}[op])
    return values


def _number(text: Any) -> Fraction | None:
    try:
        return Fraction(str(text).strip())
    except (ValueError, ZeroDivisionError):
        return None


def progress(messages: list[dict[str, Any]], steps: Sequence[str], state: dict[str, Any]) -> float:
    """Per-turn: the share of the task's steps newly reached by this turn's tool results.

    A step counts when a tool result equals its value, in order (so ``(a op b) op c`` counts its
    second step only after its first). Over an episode the values sum to the share of steps done:
    partial credit that tells a right first call from a wrong one when the final answer is wrong.
    """
    values = step_values(steps)
    done = 0
    for m in messages:
        if m.get("role") == "tool" and done < len(values) and _number(m.get("content", "")) == values[done]:
            done += 1
    new = done - state.get("progress_paid", 0)
    state["progress_paid"] = done
    return new / max(1, len(values))


def _calls(messages: list[dict[str, Any]]) -> list[list[Any]]:
    """Each tool call of the episode in order, as [its ``expression`` argument or None, the tool's
    reply or None]."""
    calls: list[list[Any]] = []
    answered = 0
    for m in messages:
        if m.get("role") == "assistant":
            for call in m.get("tool_calls") or []:
                args = (call.get("function") or {}).get("arguments")
                calls.append([args.get("expression") if isinstance(args, dict) else None, None])
        elif m.get("role") == "tool" and answered < len(calls):
            calls[answered][1] = m.get("content")
            answered += 1
    return calls


def call_parts(expression: Any, left: Fraction | None, op: str, right: Fraction) -> int:
    """How many of a call's three parts (left operand, operator, right operand) are the expected
    ones; ``+`` and ``*`` also count with the operands swapped."""
    match = CALL_RE.fullmatch(expression) if isinstance(expression, str) else None
    if match is None:
        return 0
    a, got_op, b = _number(match.group(1)), match.group(2), _number(match.group(3))
    straight = (a == left) + (got_op == op) + (b == right)
    swapped = (b == left) + (got_op == op) + (a == right) if op in "+*" else 0
    return max(straight, swapped)


def parts(messages: list[dict[str, Any]], steps: Sequence[str], state: dict[str, Any]) -> float:
    """Per-turn: credit for each part of each call that is what the next step needs, made this turn.

    Call ``k`` should be step ``k``: the question's operands for the first call; for a later one,
    the previous call's result as its left operand (whatever that result was), then the operator
    and the operand the question gives for step ``k``. Each part right earns a third of the
    step's share (``1 / len(steps)``), so an episode earns at most 1. Where the final answer is
    rarely right (the second call of a two-call task), this tells a sample that copied the
    question's last operand from one that did not (benchmarks/RESULTS.md, issue 18).
    """
    calls = _calls(messages)
    total = 0
    for k, (expression, _) in enumerate(calls[: len(steps)]):
        a, op, b = steps[k].split(" ")
        left = _number(a) if k == 0 else _number(calls[k - 1][1])
        total += call_parts(expression, left, op, Fraction(b))
    new = total - state.get("parts_paid", 0)
    state["parts_paid"] = total
    return new / (3 * max(1, len(steps)))


def make_task(rng: random.Random, difficulty: int) -> dict[str, Any]:
    """A task of ``difficulty`` operations, built left to right so each step is one tool call."""
    value = Fraction(rng.randint(2, 99))
    text = str(value)
    steps: list[str] = []
    for i in range(difficulty):
        op = rng.choice("+-*/")
        if op == "/":
            divisors = [d for d in range(2, 13) if value % d == 0 and value != d]
            if not divisors or value <= 0:
                op = rng.choice("+-*")
        if op == "+":
            operand = rng.randint(2, 99)
        elif op == "-":
            operand = rng.randint(2, 99)
        elif op == "*":
            operand = rng.randint(2, 12) if abs(value) > 99 else rng.randint(2, 20)
        else:
            operand = rng.choice(divisors)
        expression = f"{format_number(value)} {op} {operand}"
        value = {"+": value + operand, "-": value - operand, "*": value * operand, "/": value / operand}[op]
        steps.append(expression)
        text = f"{text} {op} {operand}" if i == 0 else f"({text}) {op} {operand}"
    return {
        "question": rng.choice(QUESTION_FORMS).format(text),
        "answer": format_number(value),
        "expression": text,
        "difficulty": difficulty,
        "steps": steps,
    }


def generate_tasks(n: int, seed: int, difficulty: Sequence[int]) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    levels = list(difficulty)
    return [make_task(rng, rng.choice(levels)) for _ in range(n)]


class CalculatorEnv(ToolEnvironment):
    """Arithmetic with a calculator tool.

    Rewards: ``correct`` (1 for the exact final answer), ``format`` (0.2: every call well formed
    and the answer stated as asked; without it the call syntax decays during RL, see
    benchmarks/RESULTS.md) and the per-turn ``progress`` (0.5 spread over the steps: partial
    credit for each intermediate value the tool returned, in order). A correct episode scores at
    least 1 and a wrong one below 1, so ``pass@1`` and ``accuracy`` count correct answers only
    (shaping weights that sum to 1 or more are refused).
    ``train_defaults`` (benchmarks/RESULTS.md, "Learning efficiency"): per-turn credit
    (``advantage=turn``) uses the per-turn progress reward; guidance (the ideal episode in every
    group, at 4x the advantage weight) and training on one- to three-call tasks
    (``train_difficulty=[1, 2, 3]``, while the test split stays the shipped one- and two-call
    tasks) teach the second and third call that sampling alone almost never finds, and let a
    learning rate of 5e-4 keep the call syntax; 90 steps fit 15 minutes on two CPU cores. The
    learning rate and step count (``bundled_train_defaults``) apply to the bundled model only.

    Args:
        difficulty: operation counts to draw tasks from (1 = one call ... 3 = three calls).
        train_difficulty: the train split's levels when they differ from the test split's (for
            example ``[1, 2, 3]`` to train on three-call tasks too, with a curriculum over
            ``difficulty``, while the test split stays the shipped one); test questions are
            removed from train either way.
        max_ops_per_call: operations the tool accepts per call (None = any expression).
        num_train / num_test: split sizes.
        seed: offsets the split seeds, for a different but reproducible task set.
        format_weight: weight of the format reward (0 disables it).
        progress_weight: weight of the per-turn progress reward (the share of the task's steps
            whose values the tool returned, in order; 0 disables it).
        parts_weight: weight of the per-turn ``parts`` reward (each call's left operand, operator
            and right operand scored against what the next step needs; 0 disables it).
        max_turns: assistant turns before the episode is truncated.
        system_prompt: a system message opening every episode (None: none; the bundled model was
            trained without one).
    """

    accuracy_reward = "correct"
    train_defaults = {
        "advantage": "turn",
        "guidance": {"enabled": True, "keep": "above_mean", "weight": 4.0},
        "env_args": {"train_difficulty": [1, 2, 3]},
    }
    # tuned on the bundled 3M model: 5e-4 would wreck a pretrained model's weights (docs/training.md)
    bundled_train_defaults = {"max_steps": 90, "learning_rate": 5e-4}

    def __init__(
        self,
        difficulty: Sequence[int] | int = (1, 2),
        max_ops_per_call: int | None = 1,
        num_train: int = 20000,
        num_test: int = 500,
        seed: int = 0,
        format_weight: float = 0.2,
        max_turns: int = 6,
        progress_weight: float = 0.5,
        parts_weight: float = 0.0,
        train_difficulty: Sequence[int] | int | None = None,
        system_prompt: str | None = None,
    ) -> None:
        if format_weight + progress_weight + parts_weight >= 1:
            raise ValueError(
                f"format_weight + progress_weight + parts_weight must stay below 1, the correct answer's reward, so that a wrong "
                f"episode scores below 1 and pass@1 counts correct answers only; got {format_weight} + {progress_weight} + {parts_weight}"
            )
        levels = _levels(difficulty, "difficulty")
        train_levels = levels if train_difficulty is None else _levels(train_difficulty, "train_difficulty")
        rewards = [Reward(correct, weight=1.0, name="correct")]
        if format_weight:
            rewards.append(Reward(well_formatted, weight=format_weight, name="format"))
        if progress_weight:
            rewards.append(Reward(progress, weight=progress_weight, name="progress", per_turn=True))
        if parts_weight:
            rewards.append(Reward(parts, weight=parts_weight, name="parts", per_turn=True))
        super().__init__(tools=[Calculator(max_ops=max_ops_per_call)], rewards=rewards, max_turns=max_turns, system_prompt=system_prompt)
        self.levels, self.train_levels = levels, train_levels
        self.num_train, self.num_test, self.seed = num_train, num_test, seed

    async def demonstrate(self) -> dict[str, Any] | None:
        """The next turn of the ideal episode: call step ``k`` with the previous call's result as its
        left operand (as the bundled model's supervised data does), then state the last result."""
        ep = self.episode
        if ep is None:
            return None
        steps = ep["task"]["steps"]
        results = [m.get("content", "") for m in ep["messages"] if m.get("role") == "tool"]
        k = len(results)
        if k >= len(steps):
            return {"role": "assistant", "content": f"The answer is {results[-1].strip()}." if results else ""}
        expression = steps[k] if k == 0 else results[-1].strip() + steps[k][steps[k].index(" ") :]
        call = {"type": "function", "id": f"call_{k}", "function": {"name": "calculator", "arguments": {"expression": expression}}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}

    def load_dataset(self, split: str) -> Dataset:
        if split not in SPLIT_SEEDS:
            raise KeyError(f"calculator has splits {sorted(SPLIT_SEEDS)}, not {split!r}")
        test = generate_tasks(self.num_test, SPLIT_SEEDS["test"] + 1000 * self.seed, self.levels)
        if split == "test":
            return Dataset.from_list(test)
        held_out = {t["question"] for t in test} | {t["expression"] for t in test}
        train = generate_tasks(2 * self.num_train + self.num_test, SPLIT_SEEDS["train"] + 1000 * self.seed, self.train_levels)
        train = [t for t in train if t["question"] not in held_out and t["expression"] not in held_out]
        return Dataset.from_list(train[: self.num_train])


def _levels(value: Sequence[int] | int, name: str) -> tuple[int, ...]:
    levels = (value,) if isinstance(value, int) else tuple(value)
    if not levels or any(not isinstance(d, int) or d < 1 or d > 6 for d in levels):
        raise ValueError(f"{name} must be levels between 1 and 6, got {value!r}")
    return levels
