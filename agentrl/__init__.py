"""agentrl: train language models to use tools with reinforcement learning, inside environments."""

from agentrl.env.check import check_env
from agentrl.env.dispatch import ToolRecord, ToolResult, dispatch
from agentrl.env.environment import EnvError, Environment, Reward, ToolEnvironment
from agentrl.env.episode_copy import SpawnError
from agentrl.env.factory import FactoryEnvironment
from agentrl.env.registry import make, register, registered
from agentrl.env.tool import Tool, ToolDefinitionError, ToolError, tool

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``Trainer`` and ``TrainConfig`` load torch, accelerate and transformers: only when asked for."""
    if name == "Trainer":
        from agentrl.train.trainer import Trainer

        return Trainer
    if name == "TrainConfig":
        from agentrl.train.config import TrainConfig

        return TrainConfig
    raise AttributeError(f"module 'agentrl' has no attribute {name!r}")


__all__ = [
    "Environment",
    "EnvError",
    "FactoryEnvironment",
    "Reward",
    "SpawnError",
    "Tool",
    "ToolDefinitionError",
    "ToolEnvironment",
    "ToolError",
    "ToolRecord",
    "ToolResult",
    "TrainConfig",
    "Trainer",
    "check_env",
    "dispatch",
    "make",
    "register",
    "registered",
    "tool",
]
