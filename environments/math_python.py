"""math_python: word problems that need real computation, solved with the sandboxed ``python`` tool.

Problems are generated from a seed with exact integer answers (counting primes, sums of multiples,
modular powers, compound growth rounded down, combinations, change and unit rates...). Numbers are
large enough that mental arithmetic is a poor bet and a short program is the natural move. The test
split comes from its own seed and every test question is removed from train. Reward: 1 for the
exact final answer ("The answer is N." or the last number of the final message).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from datasets import Dataset

from agentrl.env import Reward, ToolEnvironment
from agentrl.environments.calculator import correct
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


class MathPythonEnv(ToolEnvironment):
    """Word problems with exact integer answers and a sandboxed ``python`` tool.

    Args:
        kinds: problem families to draw from (default: all of ``GENERATORS``).
        num_train / num_test: split sizes.
        seed: offsets the split seeds, for a different but reproducible task set.
        max_turns: assistant turns before the episode is truncated.
        sandbox: keyword arguments for ``SandboxConfig`` (timeout_s, memory_mb, isolation, ...).
    """

    system_prompt = SYSTEM_PROMPT

    def __init__(
        self,
        kinds: tuple[str, ...] | list[str] | None = None,
        num_train: int = 5000,
        num_test: int = 200,
        seed: int = 0,
        max_turns: int = 4,
        sandbox: dict[str, Any] | None = None,
    ) -> None:
        chosen = tuple(kinds) if kinds else tuple(GENERATORS)
        unknown = [k for k in chosen if k not in GENERATORS]
        if unknown:
            raise ValueError(f"math_python: unknown problem kinds {unknown}; choose from {sorted(GENERATORS)}")
        sandbox_options = {"timeout_s": 5.0, "memory_mb": 256, **(sandbox or {})}
        super().__init__(tools=[PythonTool(**sandbox_options)], rewards=[Reward(correct, name="correct")], max_turns=max_turns)
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
