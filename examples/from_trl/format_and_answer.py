"""TRL's single-turn GRPO recipe (a conversational dataset, a format reward and a correctness
reward with TRL's batched signature), ported to agentrl by its import line (docs/from_trl.md).

    python examples/from_trl/format_and_answer.py
"""

import os
import random
import re

from datasets import Dataset

from agentrl.trl import GRPOConfig, GRPOTrainer


def make_dataset(n: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        rows.append({"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b)})
    return Dataset.from_list(rows)


def format_reward(completions, **kwargs):
    """1.0 for a final message that is exactly "The answer is N."."""
    pattern = re.compile(r"^The answer is -?\d+\.$")
    return [1.0 if pattern.match(c[0]["content"].strip()) else 0.0 for c in completions]


def correctness_reward(completions, answer, **kwargs):
    """1.0 when the last number of the completion is the answer."""
    rewards = []
    for c, a in zip(completions, answer):
        numbers = re.findall(r"-?\d+", c[0]["content"])
        rewards.append(1.0 if numbers and numbers[-1] == a else 0.0)
    return rewards


training_args = GRPOConfig(
    output_dir=os.environ.get("OUTPUT_DIR", "runs/from_trl_format"),
    learning_rate=5e-4,
    lr_scheduler_type="constant",
    per_device_train_batch_size=32,
    num_generations=8,
    max_completion_length=48,
    temperature=1.0,
    max_steps=int(os.environ.get("MAX_STEPS", 30)),
    logging_steps=1,
    report_to="none",
)
trainer = GRPOTrainer(
    model=os.environ.get("MODEL", "default"),
    reward_funcs=[format_reward, correctness_reward],
    args=training_args,
    train_dataset=make_dataset(512, seed=1),
)
trainer.train()
