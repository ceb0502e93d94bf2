"""unit_convert: convert between units with a ``convert`` tool (an example third-party environment)."""

from __future__ import annotations

import random
import re
from typing import Any

from datasets import Dataset

from agentrl import ToolEnvironment, tool

FACTORS = {("km", "m"): 1000, ("m", "cm"): 100, ("kg", "g"): 1000, ("h", "min"): 60, ("min", "s"): 60}


@tool
def convert(value: float, from_unit: str, to_unit: str) -> str:
    """Convert a value between units (km, m, cm, kg, g, h, min, s).

    Args:
        value: The number to convert.
        from_unit: The unit it is in.
        to_unit: The unit wanted.
    """
    if (from_unit, to_unit) in FACTORS:
        return f"{value * FACTORS[(from_unit, to_unit)]:g}"
    if (to_unit, from_unit) in FACTORS:
        return f"{value / FACTORS[(to_unit, from_unit)]:g}"
    raise ValueError(f"cannot convert {from_unit} to {to_unit}")


def correct(completion: str, answer: str) -> float:
    """1.0 when the last number of the final message is the answer."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", completion or "")
    return float(bool(numbers) and float(numbers[-1]) == float(answer))


class UnitConvertEnv(ToolEnvironment):
    tools = [convert]
    rewards = [correct]
    max_turns = 3
    system_prompt = "Use the convert tool, then give the number alone."

    def load_dataset(self, split: str) -> Dataset:
        if split not in ("train", "test"):
            raise KeyError(f"unit_convert has splits ['test', 'train'], not {split!r}")
        rng = random.Random({"train": 1, "test": 2}[split])
        rows: list[dict[str, Any]] = []
        for _ in range(200 if split == "train" else 20):
            (a, b), value = rng.choice(list(FACTORS)), rng.randint(2, 90)
            rows.append({"question": f"How many {b} are {value} {a}?", "answer": f"{value * FACTORS[(a, b)]:g}"})
        return Dataset.from_list(rows)
