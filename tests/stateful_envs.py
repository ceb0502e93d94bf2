"""Calculator environments whose tool keeps state, one per way a user writes stateful tools.

Each tool call appends its episode's id to the state it keeps and records, in the episode's own
``state`` dict, how many entries of *other* episodes it saw; the ``foreign`` reward (weight 0, so
training is unchanged) reports that count per episode. Before per-episode copies, every variant
but ``StateDictEnv`` saw other episodes' entries (issue 41).
"""

from __future__ import annotations

import uuid
from typing import Any

from agentrl import Reward, Tool, tool
from agentrl.env.factory import FactoryEnvironment
from agentrl.environments.calculator import CalculatorEnv, correct
from agentrl.tools.calculator import evaluate, format_number


def _record(seen: list[str], state: dict[str, Any]) -> None:
    me = state.setdefault("episode_id", uuid.uuid4().hex)
    seen.append(me)
    state["foreign"] = state.get("foreign", 0) + sum(1 for s in seen if s != me)
    state["calls"] = state.get("calls", 0) + 1


def foreign(state: dict[str, Any]) -> float:
    """Entries of other episodes this episode's tool calls saw."""
    return float(state.get("foreign", 0))


def calls(state: dict[str, Any]) -> float:
    """Tool calls that ran in this episode."""
    return float(state.get("calls", 0))


PROBES = [Reward(foreign, weight=0.0, name="foreign"), Reward(calls, weight=0.0, name="calls")]


def _calculate(expression: str) -> str:
    return format_number(evaluate(expression))


class _Probed(CalculatorEnv):
    """The calculator's tasks and rewards, plus the probes."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rewards = [*self.rewards, *PROBES]


@tool(name="calculator", injected=("env", "state"))
def env_list_calculator(expression: str, env: Any, state: dict[str, Any]) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: The expression, e.g. "12 * 7".
    """
    _record(env.seen, state)
    return _calculate(expression)


class InitListEnv(_Probed):
    """A list created in ``__init__``, written by a tool through the injected ``env``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[str] = []
        self.tools = [env_list_calculator]


class ClassAttrEnv(_Probed):
    """A class attribute list, written through the injected ``env``."""

    seen: list[str] = []

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tools = [env_list_calculator]


class RecordingCalculator(Tool):
    """A stateful ``Tool`` object: the list lives on the tool."""

    name = "calculator"
    injected = ("state",)

    def __init__(self) -> None:
        self.seen: list[str] = []

    def run(self, expression: str, state: dict[str, Any]) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: The expression, e.g. "12 * 7".
        """
        _record(self.seen, state)
        return _calculate(expression)


class ToolObjectEnv(_Probed):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tools = [RecordingCalculator()]


class MethodToolEnv(_Probed):
    """The environment's own method is the tool (the natural port of ``environment_factory``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[str] = []
        self.tools = [tool(self.calculator, name="calculator", injected=("state",))]

    def calculator(self, expression: str, state: dict[str, Any]) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: The expression, e.g. "12 * 7".
        """
        _record(self.seen, state)
        return _calculate(expression)


@tool(name="calculator", injected=("state",))
def state_calculator(expression: str, state: dict[str, Any]) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: The expression, e.g. "12 * 7".
    """
    _record(state.setdefault("seen", []), state)
    return _calculate(expression)


class StateDictEnv(_Probed):
    """The injected ``state`` dict: per episode by construction (the baseline)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tools = [state_calculator]


class Calc:
    """A TRL ``environment_factory``-style class: per-episode attributes, public methods as tools."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.me = uuid.uuid4().hex
        self.foreign = 0

    def reset(self, **task: Any) -> None:
        self.seen.clear()

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: The expression, e.g. "12 * 7".
        """
        self.seen.append(self.me)
        self.foreign += sum(1 for s in self.seen if s != self.me)
        return _calculate(expression)


def factory_foreign(environment: Calc) -> float:
    """Entries of other episodes the episode's object saw."""
    return float(environment.foreign)


def factory_calls(environment: Calc) -> float:
    """Tool calls that ran on the episode's object."""
    return float(len(environment.seen))


class FactoryEnv(FactoryEnvironment):
    """``FactoryEnvironment`` over ``Calc``, on the calculator's tasks."""

    def __init__(self, **kwargs: Any) -> None:
        calc = CalculatorEnv(**kwargs)
        super().__init__(
            Calc,
            datasets={"train": calc.dataset("train"), "test": calc.dataset("test")},
            rewards=[
                *calc.rewards,
                Reward(factory_foreign, weight=0.0, name="foreign"),
                Reward(factory_calls, weight=0.0, name="calls"),
            ],
            max_turns=calc.max_turns,
        )


VARIANTS = [InitListEnv, ClassAttrEnv, ToolObjectEnv, MethodToolEnv, StateDictEnv, FactoryEnv]
__all__ = ["VARIANTS", "correct"]
