"""Coming from TRL: ``GRPOTrainer`` and ``GRPOConfig`` with TRL's names, over agentrl's trainer.

A TRL GRPO script ports by changing ``from trl import GRPOConfig, GRPOTrainer`` to
``from agentrl.trl import GRPOConfig, GRPOTrainer`` (docs/from_trl.md).
"""

from agentrl.trl.config import TRL_NAMES, GRPOConfig
from agentrl.trl.trainer import GRPOTrainer

__all__ = ["GRPOConfig", "GRPOTrainer", "TRL_NAMES"]
