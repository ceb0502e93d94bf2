"""The rollout engine shared by training and evaluation."""
from agentrl.rollout.engine import RolloutConfig, RolloutEngine
from agentrl.rollout.metrics import rollout_metrics

__all__ = ["RolloutConfig", "RolloutEngine", "rollout_metrics"]
