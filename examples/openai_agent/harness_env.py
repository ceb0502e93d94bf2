"""Train ``agent.py``'s agent, unmodified, on the calculator's tasks with agentrl.

    agentrl train env=examples/openai_agent/harness_env.py:CalculatorAgentEnv advantage=turn
    agentrl eval  env=examples/openai_agent/harness_env.py:CalculatorAgentEnv model=runs/<run>/final

During rollouts each episode calls ``solve`` with an ``openai.AsyncOpenAI`` client whose requests
are answered by the policy being trained; agentrl records the exact tokens it sampled. The reward
is the calculator environment's own (``correct``, ``format``, per-turn ``progress``), computed
from the transcript, so the numbers compare with ``env=calculator`` (whose ``train_defaults``
also turn on guidance, which needs demonstrations a harness does not have).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from agentrl.env.harness import HarnessEnvironment
from agentrl.environments.calculator import CalculatorEnv

sys.path.insert(0, str(Path(__file__).parent))  # the agent's own module, as its authors ship it
from agent import solve  # noqa: E402


async def run(task: dict[str, Any], client: Any) -> None:
    await solve(client, task["question"])  # the reward functions read the transcript


class CalculatorAgentEnv(HarnessEnvironment):
    """The calculator's tasks and rewards around ``agent.solve``."""

    accuracy_reward = "correct"  # logged as accuracy / eval/accuracy, as for env=calculator

    def __init__(self, **calculator_args: Any) -> None:
        tasks = CalculatorEnv(**calculator_args)
        super().__init__(run, datasets=tasks, rewards=tasks.rewards, max_turns=tasks.max_turns)
