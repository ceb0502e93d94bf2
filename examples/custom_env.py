"""Write your own environment: a tool, a task dataset, a reward. (README shows this file.)"""

from datasets import Dataset

import agentrl
from agentrl import ToolEnvironment, tool


@tool
def reverse(text: str) -> str:
    """Reverse a piece of text.

    Args:
        text: The text to reverse.
    """
    return text[::-1]


def exact(completion: str, target: str) -> float:
    return float(completion.strip() == target)


class ReverseEnv(ToolEnvironment):
    tools = [reverse]
    rewards = [exact]
    max_turns = 3

    def load_dataset(self, split):
        words = ["agent", "reward", "policy", "token"] if split == "train" else ["gradient"]
        return Dataset.from_list([{"question": f"Reverse '{w}'.", "target": w[::-1]} for w in words])


if __name__ == "__main__":
    env = ReverseEnv()
    agentrl.check_env(env)
    with env.sync() as s:  # gym-style, no await needed
        messages, info = s.reset(seed=0)
        word = info["task"]["target"][::-1]
        call = {"type": "function", "function": {"name": "reverse", "arguments": {"text": word}}}
        tool_messages, *_ = s.step({"role": "assistant", "content": "", "tool_calls": [call]})
        _, reward, terminated, truncated, _ = s.step({"role": "assistant", "content": tool_messages[0]["content"]})
        print(messages[-1]["content"], "->", tool_messages[0]["content"], "reward", reward)
