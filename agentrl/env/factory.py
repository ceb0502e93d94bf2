"""One object per episode from a factory, its public methods as the tools (TRL's ``environment_factory``).

A class such as::

    class Counter:
        def __init__(self):
            self.total = 0

        def reset(self, **task) -> str | None:   # optional; called with the task's columns
            self.total = 0

        def add(self, n: int) -> int:
            '''Add n to the running total and return it.

            Args:
                n: The number to add.
            '''
            self.total += n
            return self.total

becomes an environment with ``FactoryEnvironment(Counter, datasets={"train": ds}, rewards=[...])``.
Every episode calls the factory, so its attributes are its own; the tools of an episode are bound
to that episode's object and share only their concurrency limits with the other episodes. Rewards
may ask for ``environment`` (the episode's object) besides the usual arguments.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.core.messages import Message
from agentrl.env.environment import EnvError, Reward, ToolEnvironment
from agentrl.env.episode_copy import per_episode_copy
from agentrl.env.tool import FunctionTool, Tool


def public_methods(obj: Any) -> list[str]:
    """The names of ``obj``'s methods the model may call: public, defined on its class, not ``reset``."""
    names = []
    for name in dir(type(obj)):
        if name.startswith("_") or name == "reset":
            continue
        if inspect.isfunction(inspect.getattr_static(type(obj), name)):
            names.append(name)
    return names


class FactoryEnvironment(ToolEnvironment):
    """Episodes on fresh objects of ``environment_factory`` (a class or any zero-argument callable).

    ``reset(**task)`` of the object, when it has one, runs at the start of each episode with the
    task's columns it accepts; a string it returns is appended to the last user message (as TRL does).
    """

    shared = ("environment_factory",)

    def __init__(
        self,
        environment_factory: Callable[[], Any],
        datasets: dict[str, Any] | None = None,
        rewards: Sequence[Reward | Callable[..., Any]] | None = None,
        system_prompt: str | None = None,
        max_turns: int | None = None,
        tools: Sequence[Tool | Callable[..., Any]] = (),
    ) -> None:
        if not callable(environment_factory):
            raise EnvError(
                f"environment_factory must be a class or a callable returning an object, got {type(environment_factory).__name__}"
            )
        self.environment_factory = environment_factory
        self._instance = environment_factory()
        methods = [FunctionTool(getattr(self._instance, name), name=name) for name in public_methods(self._instance)]
        if not methods and not tools:
            raise EnvError(f"{_name(environment_factory)} has no public methods to offer as tools")
        super().__init__(
            tools=[*methods, *tools],
            rewards=rewards,
            datasets=datasets,
            system_prompt=system_prompt,
            max_turns=max_turns,
        )

    @property
    def instance(self) -> Any:
        """This episode's object (the one its tools are bound to)."""
        return self._instance

    def spawn(self) -> FactoryEnvironment:
        fresh = self.environment_factory()
        self.__dict__.setdefault("_dataset_cache", {})
        # The memo maps the prototype to the fresh object: the copied tools are bound to it.
        return per_episode_copy(self, {id(self._instance): fresh}, reset={"_episode": None})

    async def reset(
        self, task: dict[str, Any] | None = None, seed: int | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        messages, info = await super().reset(task, seed)
        hook = getattr(self._instance, "reset", None)
        if callable(hook):
            out = hook(**_accepted(hook, self._episode["task"]))
            if inspect.isawaitable(out):
                out = await out
            if isinstance(out, str) and out:
                for record in (messages, self._episode["messages"]):
                    _append_to_last_user(record, out)
        return messages, info

    def reward_context(self) -> dict[str, Any]:
        return {**super().reward_context(), "environment": self._instance}


def _accepted(fn: Callable[..., Any], task: dict[str, Any]) -> dict[str, Any]:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return dict(task)
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in task.items() if k in names}


def _append_to_last_user(messages: list[Message], text: str) -> None:
    for m in reversed(messages):
        if m.get("role") == "user":
            m["content"] = f"{m.get('content') or ''}{text}"
            return
    messages.append({"role": "user", "content": text})


def _name(obj: Any) -> str:
    return getattr(obj, "__qualname__", type(obj).__name__)
