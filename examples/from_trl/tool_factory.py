"""TRL's ``environment_factory`` recipe (one object per episode whose methods are the tools, its
state read by a reward through ``environments``), ported to agentrl by its import line
(docs/from_trl.md).

    python examples/from_trl/tool_factory.py
"""

import os
import random
import re

from datasets import Dataset

from agentrl.trl import GRPOConfig, GRPOTrainer


class CalculatorTools:
    """Per-episode state: the calls this episode made."""

    def reset(self, **kwargs):
        self.calls = []

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: The expression, e.g. "12 * 7".
        """
        self.calls.append(expression)
        match = re.fullmatch(r"\s*(-?\d+)\s*([-+*])\s*(-?\d+)\s*", expression)
        if not match:
            return "Error: write one operation, like 12 + 7"
        a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
        return str({"+": a + b, "-": a - b, "*": a * b}[op])


def make_dataset(n: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        rows.append({"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b)})
    return Dataset.from_list(rows)


def correctness_reward(completions, answer, **kwargs):
    """1.0 when the final message's last number is the answer."""
    rewards = []
    for c, a in zip(completions, answer):
        numbers = re.findall(r"-?\d+", c[-1]["content"] or "")
        rewards.append(1.0 if numbers and numbers[-1] == a else 0.0)
    return rewards


def used_tool_reward(environments, **kwargs):
    """0.2 for an episode that called the calculator at least once (read from its own object)."""
    return [0.2 if env.calls else 0.0 for env in environments]


training_args = GRPOConfig(
    output_dir=os.environ.get("OUTPUT_DIR", "runs/from_trl_tools"),
    learning_rate=1e-4,
    adam_beta2=0.99,
    lr_scheduler_type="constant",
    per_device_train_batch_size=64,
    num_generations=8,
    max_completion_length=160,
    temperature=0.7,
    max_tool_calling_iterations=4,
    max_steps=int(os.environ.get("MAX_STEPS", 30)),
    logging_steps=1,
    report_to="none",
)
trainer = GRPOTrainer(
    model=os.environ.get("MODEL", "default"),
    reward_funcs=[correctness_reward, used_tool_reward],
    args=training_args,
    train_dataset=make_dataset(512, seed=1),
    environment_factory=CalculatorTools,
)
trainer.train()
