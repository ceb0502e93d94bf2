"""Built-in reusable tools (installed as ``agentrl.tools``)."""

from agentrl.tools.calculator import Calculator, CalculatorError, evaluate

__all__ = ["Calculator", "CalculatorError", "evaluate"]
