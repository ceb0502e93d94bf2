"""The rollout engine shared by training and evaluation."""
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.engine import RolloutEngine
from agentrl.rollout.metrics import rollout_metrics

__all__ = ["RolloutConfig", "RolloutEngine", "rollout_metrics"]
