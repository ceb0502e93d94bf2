"""math_python: word problems that need real computation, solved with the sandboxed ``python`` tool.

Problems are generated from a seed with exact integer answers (counting primes, sums of multiples,
modular powers, compound growth rounded down, combinations, change and unit rates...). Numbers are
large enough that mental arithmetic is a poor bet and a short program is the natural move. The test
split comes from its own seed and every test question is removed from train. Rewards: see
``MathPythonEnv``. ``solution_program`` is a scripted solver (one short program per kind, read off
the question text), used to build a starting model's transcripts and to show every kind solvable.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from datasets import Dataset

from agentrl.env.environment import Reward, ToolEnvironment
from agentrl.environments.calculator import correct, well_formatted
from agentrl.tools.python import PythonTool

SPLIT_SEEDS = {"train": 11, "test": 12}
SYSTEM_PROMPT = (
    "Solve the problem. You can run Python with the python tool; each call is a fresh program, so print "
    "what you need. End with 'The answer is N.'"
)


def _primes_below(n: int) -> int:
    sieve = bytearray([1]) * n
    sieve[:2] = b"\x00\x00"
    for i in range(2, int(n**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(sieve[i * i :: i]))
    return sum(sieve)


def _count_primes(rng: random.Random) -> tuple[str, int]:
    n = rng.randint(200, 20000)
    return f"How many prime numbers are there below {n}?", _primes_below(n)


def _sum_multiples(rng: random.Random) -> tuple[str, int]:
    a, b = rng.sample(range(3, 14), 2)
    n = rng.randint(500, 100000)
    total = sum(k for k in range(n) if k % a == 0 or k % b == 0)
    return f"What is the sum of all positive whole numbers below {n} that are multiples of {a} or {b}?", total


def _mod_power(rng: random.Random) -> tuple[str, int]:
    base, exp, mod = rng.randint(2, 99), rng.randint(20, 500), rng.randint(7, 9973)
    return f"What is the remainder when {base} to the power {exp} is divided by {mod}?", pow(base, exp, mod)


def _compound(rng: random.Random) -> tuple[str, int]:
    start, pct, years = rng.randint(10, 900) * 100, rng.randint(2, 15), rng.randint(3, 20)
    value = Fraction(start) * Fraction(100 + pct, 100) ** years
    town = rng.choice(["Aldwick", "Brenton", "Corran", "Dunmore", "Elvaston", "Farrow"])
    text = f"The town of {town} has {start} people and grows by {pct}% every year. How many people live there after {years} years, rounded down to a whole number?"
    return text, math.floor(value)


def _choose(rng: random.Random) -> tuple[str, int]:
    n = rng.randint(12, 60)
    k = rng.randint(3, min(12, n - 2))
    return f"In how many ways can a committee of {k} be chosen from {n} people?", math.comb(n, k)


def _shopping(rng: random.Random) -> tuple[str, int]:
    items = rng.sample([("notebooks", 3, 9), ("pens", 1, 4), ("lamps", 17, 45), ("chairs", 25, 80), ("mugs", 4, 12)], 3)
    counts = [rng.randint(3, 47) for _ in items]
    prices = [rng.randint(lo, hi) for _, lo, hi in items]
    total = sum(c * p for c, p in zip(counts, prices))
    paid = (total // 100 + rng.randint(1, 5)) * 100
    parts = ", ".join(f"{c} {name} at ${p} each" for (name, _, _), c, p in zip(items, counts, prices))
    return f"A school buys {parts}. It pays with ${paid}. How many dollars of change does it get?", paid - total


def _digit_sum(rng: random.Random) -> tuple[str, int]:
    n = rng.randint(30, 200)
    return f"What is the sum of the digits of {n} factorial?", sum(int(d) for d in str(math.factorial(n)))


def _collatz(rng: random.Random) -> tuple[str, int]:
    n = rng.randint(27, 5000)
    steps, x = 0, n
    while x != 1:
        x = x // 2 if x % 2 == 0 else 3 * x + 1
        steps += 1
    return (
        f"Start at {n}. If the number is even, halve it; otherwise multiply it by 3 and add 1. How many steps does it take to reach 1?",
        steps,
    )


GENERATORS: dict[str, Callable[[random.Random], tuple[str, int]]] = {
    "primes": _count_primes,
    "multiples": _sum_multiples,
    "modpow": _mod_power,
    "compound": _compound,
    "choose": _choose,
    "shopping": _shopping,
    "digits": _digit_sum,
    "collatz": _collatz,
}


def generate_tasks(n: int, seed: int, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    tasks = []
    for _ in range(n):
        kind = rng.choice(kinds)
        question, answer = GENERATORS[kind](rng)
        tasks.append({"question": question, "answer": str(answer), "kind": kind})
    return tasks


# The scripted solver: the numbers of each kind's question, in the order they appear, and a short
# program that copies them (no arithmetic done outside the program, so a model imitating it only
# has to copy numbers).
QUESTION_PATTERNS: dict[str, re.Pattern[str]] = {
    "primes": re.compile(r"below (\d+)\?"),
    "multiples": re.compile(r"below (\d+) that are multiples of (\d+) or (\d+)\?"),
    "modpow": re.compile(r"when (\d+) to the power (\d+) is divided by (\d+)\?"),
    "compound": re.compile(r"has (\d+) people and grows by (\d+)% every year\. How many people live there after (\d+) years"),
    "choose": re.compile(r"committee of (\d+) be chosen from (\d+) people"),
    "shopping": re.compile(r"(\d+) \w+ at \$(\d+) each, (\d+) \w+ at \$(\d+) each, (\d+) \w+ at \$(\d+) each\. It pays with \$(\d+)\."),
    "digits": re.compile(r"digits of (\d+) factorial\?"),
    "collatz": re.compile(r"Start at (\d+)\."),
}
PROGRAMS: dict[str, Callable[..., str]] = {
    "primes": lambda n: f"print(sum(all(k % d for d in range(2, int(k ** 0.5) + 1)) for k in range(2, {n})))",
    "multiples": lambda n, a, b: f"print(sum(k for k in range({n}) if k % {a} == 0 or k % {b} == 0))",
    "modpow": lambda b, e, m: f"print(pow({b}, {e}, {m}))",
    "compound": lambda p, r, y: f"print({p} * (100 + {r}) ** {y} // 100 ** {y})",
    "choose": lambda k, n: f"import math\nprint(math.comb({n}, {k}))",
    "shopping": lambda c1, p1, c2, p2, c3, p3, paid: f"print({paid} - ({c1} * {p1} + {c2} * {p2} + {c3} * {p3}))",
    "digits": lambda n: f"import math\nprint(sum(int(d) for d in str(math.factorial({n}))))",
    "collatz": lambda n: f"n, s = {n}, 0\nwhile n != 1:\n    n = 3 * n + 1 if n % 2 else n // 2\n    s += 1\nprint(s)",
}


def solution_program(task: dict[str, Any]) -> str:
    """A short Python program that prints the task's answer, written from the question text alone."""
    kind = task["kind"]
    if kind not in QUESTION_PATTERNS:
        raise ValueError(f"math_python: no scripted solver for kind {kind!r}")
    match = QUESTION_PATTERNS[kind].search(task["question"])
    if match is None:
        raise ValueError(f"math_python: the {kind} question does not have the expected form: {task['question']!r}")
    return PROGRAMS[kind](*match.groups())


def computed(messages: list[dict[str, Any]], answer: str, state: dict[str, Any]) -> float:
    """Per-turn: 1 on the turn whose ``python`` output is first exactly the answer, else 0.

    Partial credit that tells a right program whose output was miscopied into the final answer from
    a wrong program; over an episode it sums to at most 1.
    """
    reached = any(m.get("role") == "tool" and str(m.get("content", "")).strip() == answer for m in messages)
    new = float(reached) - state.get("computed_paid", 0.0)
    state["computed_paid"] = float(reached)
    return max(0.0, new)


class MathPythonEnv(ToolEnvironment):
    """Word problems with exact integer answers and a sandboxed ``python`` tool.

    Rewards: ``correct`` (1 for the exact final answer), ``format`` (0.2: at least one call, every
    call well formed and the final message the answer statement alone; the calculator's, which keeps
    call syntax from decaying during RL) and the per-turn ``computed`` (0.5 on the turn whose program
    first printed the answer). A correct episode scores at least 1 and a wrong one below 1, so
    ``pass@1`` counts correct answers only.

    Args:
        kinds: problem families to draw from (default: all of ``GENERATORS``).
        num_train / num_test: split sizes.
        seed: offsets the split seeds, for a different but reproducible task set.
        max_turns: assistant turns before the episode is truncated.
        sandbox: keyword arguments for ``SandboxConfig`` (timeout_s, memory_mb, isolation, ...).
        format_weight: weight of the format reward (0 disables it).
        computed_weight: weight of the per-turn ``computed`` reward (0 disables it).
    """

    system_prompt = SYSTEM_PROMPT
    # The recipe of docs/environments.md ("A starting model and RL on it"): per-turn credit for the
    # per-turn ``computed`` reward, small batches (a step of 8 x 8 episodes with a sandbox run each),
    # room in a turn for the longest scripted program (~90 tokens).
    accuracy_reward = "correct"
    train_defaults = {
        "advantage": "turn",
        "max_steps": 60,
        "prompts_per_step": 8,
        "num_generations": 8,
        "rollout": {"max_tokens_per_turn": 128, "max_completion_tokens": 320, "max_context": 1024},
    }

    def __init__(
        self,
        kinds: tuple[str, ...] | list[str] | None = None,
        num_train: int = 5000,
        num_test: int = 200,
        seed: int = 0,
        max_turns: int = 4,
        sandbox: dict[str, Any] | None = None,
        format_weight: float = 0.2,
        computed_weight: float = 0.5,
    ) -> None:
        chosen = tuple(kinds) if kinds else tuple(GENERATORS)
        unknown = [k for k in chosen if k not in GENERATORS]
        if unknown:
            raise ValueError(f"math_python: unknown problem kinds {unknown}; choose from {sorted(GENERATORS)}")
        sandbox_options = {"timeout_s": 5.0, "memory_mb": 256, **(sandbox or {})}
        rewards = [Reward(correct, name="correct")]
        if format_weight:
            rewards.append(Reward(well_formatted, weight=format_weight, name="format"))
        if computed_weight:
            rewards.append(Reward(computed, weight=computed_weight, name="computed", per_turn=True))
        super().__init__(tools=[PythonTool(**sandbox_options)], rewards=rewards, max_turns=max_turns)
        self.kinds, self.num_train, self.num_test, self.seed = chosen, num_train, num_test, seed

    def load_dataset(self, split: str) -> Dataset:
        if split not in SPLIT_SEEDS:
            raise KeyError(f"math_python has splits {sorted(SPLIT_SEEDS)}, not {split!r}")
        test = generate_tasks(self.num_test, SPLIT_SEEDS["test"] + 1000 * self.seed, self.kinds)
        if split == "test":
            return Dataset.from_list(test)
        held_out = {t["question"] for t in test}
        train = generate_tasks(self.num_train + self.num_test, SPLIT_SEEDS["train"] + 1000 * self.seed, self.kinds)
        return Dataset.from_list([t for t in train if t["question"] not in held_out][: self.num_train])
