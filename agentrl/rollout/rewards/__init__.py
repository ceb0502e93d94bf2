"""Rewards that ask a model: a Hugging Face sequence-classification reward model, and an LLM judge.

Both are plain ``Reward`` functions (``as_reward()``), so an environment lists them beside its
rule-based rewards and they go through the same scoring path.
"""

from agentrl.rollout.rewards.judge import JudgeReward, parse_score
from agentrl.rollout.rewards.reward_model import RewardModel

__all__ = ["JudgeReward", "RewardModel", "parse_score"]
