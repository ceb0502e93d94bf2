"""agentrl: train language models to use tools with reinforcement learning, inside environments."""

from agentrl.check import check_env
from agentrl.dispatch import ToolRecord, ToolResult, dispatch
from agentrl.env import Environment, EnvError, Reward, ToolEnvironment
from agentrl.registry import make, register, registered
from agentrl.tool import Tool, ToolDefinitionError, ToolError, tool

__version__ = "0.1.0"

__all__ = [
    "Environment",
    "EnvError",
    "Reward",
    "Tool",
    "ToolDefinitionError",
    "ToolEnvironment",
    "ToolError",
    "ToolRecord",
    "ToolResult",
    "check_env",
    "dispatch",
    "make",
    "register",
    "registered",
    "tool",
]
