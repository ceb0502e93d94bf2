"""Environments in gym vocabulary, async first.

``Environment`` is the protocol the rollout engine drives: ``reset(task, seed)`` gives the first
messages, ``step(assistant_message)`` gives the environment's reply, a reward and the episode
flags. ``ToolEnvironment`` implements both for the common case — a task dataset, tools and reward
functions — so most environments only declare those. One instance runs one episode at a time;
``spawn()`` makes another with its own copy of every mutable attribute (``agentrl.env.episode_copy``):
only the datasets, the tools' concurrency limits and what a class lists in ``shared`` are common.
"""

from __future__ import annotations

import copy
import inspect
import math
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.core.errors import AgentrlError, UserError
from agentrl.core.messages import Message, ParsedResponse
from agentrl.core.records import ToolRecord
from agentrl.core.step import StepResult
from agentrl.env.batched import BatchedReward, group_arguments, is_batched
from agentrl.env.episode_copy import per_episode_copy
from agentrl.env.replay import run_tools
from agentrl.env.tool import Tool, as_tool


class EnvError(AgentrlError, RuntimeError):
    """Misuse of an environment (step before reset, step after the end, bad task...)."""


class RewardError(UserError, RuntimeError):
    """A reward function raised: a bug in the user's reward, stopped with its name (or counted, when asked)."""

    def __init__(self, name: str, exc: BaseException) -> None:
        self.reward_name = name
        text = " ".join(str(exc).split())[:300]
        super().__init__(f"reward {name!r} raised {type(exc).__name__}: {text}" if text else f"reward {name!r} raised {type(exc).__name__}")


@dataclass
class Reward:
    """A named, weighted reward function.

    ``fn`` may be sync or async and declares the keyword arguments it wants among: ``messages``
    (the whole conversation), ``completion`` (text of the last assistant message), ``task`` (the
    dataset row), ``state`` (the episode's scratch dict), ``turn``, ``tool_records``, or any column
    of the task by name. It returns a float, or None when it does not apply (skipped, not zero).
    ``per_turn=True`` evaluates it after every step instead of once at the end of the episode.
    """

    fn: Callable[..., float | None | Awaitable[float | None]]
    weight: float = 1.0
    name: str = ""
    per_turn: bool = False

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"Reward fn must be callable, got {type(self.fn).__name__}")
        self.name = self.name or getattr(self.fn, "__name__", "reward")
        params = inspect.signature(self.fn).parameters.values()
        self._takes_all = any(p.kind is p.VAR_KEYWORD for p in params)
        self._wanted = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}

    async def __call__(self, context: dict[str, Any]) -> float | None:
        kwargs = context if self._takes_all else {k: v for k, v in context.items() if k in self._wanted}
        missing = self._wanted - set(context)
        if missing and not self._takes_all:
            raise TypeError(f"reward {self.name!r} asks for {sorted(missing)}, which neither the episode nor the task provides")
        value = self.fn(**kwargs)
        if inspect.isawaitable(value):
            value = await value
        if value is None:
            return None
        value = float(value)
        return None if math.isnan(value) else value


def reward_context(
    task: dict[str, Any], messages: list[Message], state: dict[str, Any], turn: int, tool_records: list[Any]
) -> dict[str, Any]:
    """The keyword arguments a reward function may ask for (see ``Reward``)."""
    last = next((m for m in reversed(messages) if m.get("role") == "assistant"), {})
    return {
        **task,
        "messages": messages,
        "completion": last.get("content") or "",
        "task": task,
        "state": state,
        "turn": turn,
        "tool_records": tool_records,
    }


async def score(
    rewards: Sequence[Reward], context: dict[str, Any], *, per_turn: bool, episode: bool
) -> tuple[float, dict[str, float | None]]:
    """Weighted total and components of the per-turn and/or per-episode rewards for ``context``.

    The one place rewards are weighted; ``Environment.score`` calls it with the episode's own context.
    """
    components: dict[str, float | None] = {}
    total = 0.0
    for r in rewards:
        if isinstance(r, BatchedReward):  # scored with the whole group (score_group)
            continue
        if (per_turn and r.per_turn) or (episode and not r.per_turn):
            try:
                value = await r(context)
            except Exception as exc:  # the user's reward, not the infrastructure: stopped (or counted) by name
                raise RewardError(r.name, exc) from exc
            components[r.name] = value
            if value is not None:
                total += r.weight * value
    return total, components


def as_reward(obj: Reward | BatchedReward | Callable[..., Any] | tuple[Callable[..., Any], float]) -> Reward | BatchedReward:
    """A ``Reward`` (one episode's arguments), or a ``BatchedReward`` for a function with TRL's
    batched signature (``prompts``, ``completions``, ``completion_ids``: lists over the group)."""
    if isinstance(obj, Reward | BatchedReward):
        return obj
    fn, weight = (obj[0], float(obj[1])) if isinstance(obj, tuple) else (obj, 1.0)
    return BatchedReward(fn, weight=weight) if callable(fn) and is_batched(fn) else Reward(fn, weight=weight)


async def score_group(rewards: Sequence[Reward | BatchedReward], tasks: list[dict[str, Any]], messages: list[list[Message]],
                      completion_ids: list[list[int]], environments: list[Any] | None = None) -> list[tuple[float, dict[str, float | None]]]:  # fmt: skip
    """Weighted total and components of the batched rewards for each episode of one group."""
    batched = [r for r in rewards if isinstance(r, BatchedReward)]
    out: list[tuple[float, dict[str, float | None]]] = [(0.0, {}) for _ in tasks]
    if not batched or not tasks:
        return out
    arguments = group_arguments(tasks, messages, completion_ids, environments)
    for r in batched:
        try:
            values = await r(arguments, len(tasks))
        except Exception as exc:  # the user's reward: stopped (or counted) by name, as per-episode ones
            raise RewardError(r.name, exc) from exc
        for k, value in enumerate(values):
            total, components = out[k]
            components[r.name] = value
            out[k] = (total + (r.weight * value if value is not None else 0.0), components)
    return out


class Environment:
    """The protocol. Subclass it directly for anything ``ToolEnvironment`` does not fit."""

    max_turns: int = 10
    tools: Sequence[Tool] = ()
    rewards: Sequence[Reward] = ()
    # `agentrl train` settings this environment was tuned with, applied where the user sets nothing
    # (e.g. {"advantage": "turn", "max_steps": 120}); config.json records what a run used.
    train_defaults: dict[str, Any] = {}
    # the reward component that says whether an episode succeeded (1) or not (0): logged as
    # ``accuracy`` in training and ``eval/accuracy`` in its evaluations (None: none is)
    accuracy_reward: str | None = None
    # the part of those tuned on agentrl's bundled model (a 3M-parameter model: a learning rate and
    # step count that would wreck a pretrained one), applied only with model.path="default"
    bundled_train_defaults: dict[str, Any] = {}
    # Attributes every concurrent episode uses as the same object (read-only data, a client, a pool);
    # everything else mutable is copied per episode by ``spawn()``. Subclasses add names; bases' stay.
    shared: tuple[str, ...] = ("train_defaults", "bundled_train_defaults", "_datasets", "_dataset_cache")

    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI-style schemas of the tools, as chat templates render them."""
        return [t.schema for t in self.tools]

    def dataset(self, split: str = "train") -> Any:
        """The task dataset of ``split`` (a ``datasets.Dataset``)."""
        raise NotImplementedError(f"{type(self).__name__} has no task dataset")

    async def reset(self, task: dict[str, Any] | None = None, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode: the opening messages and an info dict. Every environment implements it."""
        raise NotImplementedError(f"{type(self).__name__} must implement reset(task, seed)")

    async def step(self, message: Message | ParsedResponse) -> StepResult:
        """Answer one assistant turn. Every environment implements it."""
        raise NotImplementedError(f"{type(self).__name__} must implement step(message)")

    async def sample(self, turn: Any, generate: Callable[..., Awaitable[Any]]) -> Any:
        """Draw the next assistant turn: ``generate(turn.ids, turn.sampling)``, the policy's generator.

        ``turn`` is the engine's ``TurnRequest``. An environment whose client sets per-turn limits
        (``HarnessEnvironment``: a request's ``max_tokens`` and ``stop``) narrows them here; the
        tokens still come from ``generate`` and go into the episode unchanged.
        """
        return await generate(turn.ids, turn.sampling)

    async def finish(self) -> tuple[float, dict[str, float | None]]:
        """Score an episode that the engine cut short (token or context budget).

        Returns (reward, components) for the episode as it stands; the default scores nothing.
        """
        return 0.0, {}

    async def close(self) -> None:
        """Release per-episode resources (sandboxes, connections)."""

    async def demonstrate(self) -> Message | None:
        """The assistant message an expert would send next in the running episode, or None.

        Optional. ``guidance.enabled`` (agentrl/rollout/guidance.py) plays one demonstrated episode per
        group through the same token path as the sampled ones and trains on it where it beats
        every sample: the way a skill the model never samples right (the calculator's two-call
        tasks) can still be learned. Called after ``reset`` and after each ``step``; the default
        has no demonstrations.
        """
        return None

    # -- rewards: one path for the environment's own and for rewards added by a trainer -------------

    def reward_context(self) -> dict[str, Any]:
        """The running episode as reward functions see it (see ``Reward``); environments that score
        through ``score`` implement it (``ToolEnvironment`` does)."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its episode to reward functions (reward_context)")

    async def score(self, *, per_turn: bool, episode: bool) -> tuple[float, dict[str, float | None]]:
        """Weighted total and components of ``self.rewards`` on the running episode.

        ``per_turn``: the rewards marked ``per_turn`` (after every step); ``episode``: the others (once,
        when the episode ends). Components are unweighted values, None where a reward did not apply.
        """
        if not self.rewards:
            return 0.0, {}
        return await score(self.rewards, self.reward_context(), per_turn=per_turn, episode=episode)

    async def score_group(self, episodes: list[tuple[list[Message], list[int], Environment]], task: dict[str, Any]) -> list[tuple[float, dict[str, float | None]]]:
        """Weighted total and components of the batched rewards (TRL's signature) in ``self.rewards``
        for each episode of one finished group: ``(messages, completion ids, the episode's
        environment)`` per episode. Called once per group by the rollout engine; nothing by default."""
        environments = [getattr(e, "instance", e) for _, _, e in episodes]
        return await score_group(getattr(self, "rewards", ()), [task] * len(episodes), [m for m, _, _ in episodes],
                                 [ids for _, ids, _ in episodes], environments)  # fmt: skip

    def with_rewards(self, extra: Sequence[Reward | BatchedReward]) -> Environment:
        """A copy of this environment that also scores ``extra`` (same tools and datasets).

        The added rewards go through ``score`` with the real episode (``state``, ``tool_records``...),
        so the environment must implement ``reward_context``.
        """
        if not extra:
            return self
        if type(self).reward_context is Environment.reward_context:
            raise EnvError(f"{type(self).__name__} cannot take extra rewards: it does not implement reward_context()")
        names = [r.name for r in self.rewards]
        clash = sorted({r.name for r in extra} & set(names))
        if clash:
            raise EnvError(f"extra reward name(s) {clash} already used by {type(self).__name__}'s rewards")
        clone = copy.copy(self)
        clone.rewards = [*self.rewards, *extra]
        return clone

    def spawn(self) -> Environment:
        """A fresh instance for a concurrent episode, owning its state.

        Every mutable attribute (of the instance, of its class, of its tools) is deep-copied, and
        tools that are bound methods of this instance are bound to the copy; datasets, the tools'
        concurrency limiters and the names listed in ``shared`` stay common. An attribute that
        cannot be copied raises ``SpawnError`` naming it (create it in ``reset`` or list it in ``shared``).
        """
        self.__dict__.setdefault("_dataset_cache", {})  # created once here, so every copy shares it
        return per_episode_copy(self, {})

    def sync(self) -> Any:
        """A blocking wrapper for scripts and notebooks (``reset``/``step`` without ``await``)."""
        from agentrl.env.sync import SyncEnvironment

        return SyncEnvironment(self)


class ToolEnvironment(Environment):
    """Tasks + tools + rewards. The assistant calls tools until it answers without a call.

    Subclasses usually set ``tools``, ``rewards`` and implement ``load_dataset(split)`` and maybe
    ``prompt(task)``; everything can also be passed to ``__init__``.
    """

    system_prompt: str | None = None
    tools: Sequence[Tool] = ()
    rewards: Sequence[Reward] = ()
    _episode: dict[str, Any] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Class-level ``tools = [fn, ...]`` and ``rewards = [fn, ...]`` are normalised once here."""
        super().__init_subclass__(**kwargs)
        if "tools" in cls.__dict__:
            cls.tools = [as_tool(t) for t in cls.__dict__["tools"]]
        if "rewards" in cls.__dict__:
            cls.rewards = [as_reward(r) for r in cls.__dict__["rewards"]]

    def __init__(
        self,
        tools: Sequence[Tool | Callable[..., Any]] | None = None,
        rewards: Sequence[Reward | Callable[..., Any]] | None = None,
        datasets: dict[str, Any] | None = None,
        system_prompt: str | None = None,
        max_turns: int | None = None,
    ) -> None:
        if tools is not None:
            self.tools = [as_tool(t) for t in tools]
        if rewards is not None:
            self.rewards = [as_reward(r) for r in rewards]
        if datasets is not None:
            self._datasets = dict(datasets)
        if system_prompt is not None:
            self.system_prompt = system_prompt
        if max_turns is not None:
            self.max_turns = max_turns
        self._episode = None

    # -- declarations (class attributes, overrides, or __init__ arguments) ------------------------

    def load_dataset(self, split: str) -> Any:
        datasets = self.__dict__.get("_datasets")
        if not datasets:
            raise NotImplementedError(f"{type(self).__name__} needs load_dataset(split) or datasets={{split: Dataset}}")
        if split not in datasets:
            raise KeyError(f"{type(self).__name__} has no {split!r} split; it has {sorted(datasets)}")
        return datasets[split]

    def prompt(self, task: dict[str, Any]) -> list[Message]:
        """The opening messages of an episode. Default: system prompt + the task's ``prompt`` or ``question``."""
        text = task.get("prompt", task.get("question"))
        if isinstance(text, list):
            return copy.deepcopy(text)
        if not isinstance(text, str):
            raise EnvError(f"{type(self).__name__}: task has no 'prompt' or 'question' text; override prompt(task)")
        messages: list[Message] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": text})
        return messages

    def dataset(self, split: str = "train") -> Any:
        cache = self.__dict__.setdefault("_dataset_cache", {})
        if split not in cache:
            cache[split] = self.load_dataset(split)
        return cache[split]

    # -- the episode ----------------------------------------------------------------------------

    async def reset(self, task: dict[str, Any] | None = None, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        rng = random.Random(seed)
        if task is None:
            data = self.dataset("train")
            if len(data) == 0:
                raise EnvError(f"{type(self).__name__}: the train split is empty")
            task = dict(data[rng.randrange(len(data))])
        elif not isinstance(task, dict):
            raise EnvError(f"{type(self).__name__}.reset: task must be a dict (a dataset row), got {type(task).__name__}")
        messages = self.prompt(dict(task))
        self._episode = {
            "task": dict(task),
            "messages": copy.deepcopy(messages),
            "turn": 0,
            "state": {},
            "tool_records": [],
            "done": False,
            "rng": rng,
        }
        self.rng = rng
        return copy.deepcopy(messages), {"task": dict(task), "tools": self.tool_schemas()}

    async def step(self, message: Message | ParsedResponse) -> StepResult:
        ep = self._episode
        if ep is None:
            raise EnvError(f"{type(self).__name__}.step called before reset")
        if ep["done"]:
            raise EnvError(f"{type(self).__name__}.step called after the episode ended; call reset")
        if isinstance(message, ParsedResponse):
            message = message.to_message()
        if not isinstance(message, dict) or message.get("role") != "assistant":
            raise EnvError("step expects the assistant message (a dict with role 'assistant')")
        ep["messages"].append(copy.deepcopy(message))
        ep["turn"] += 1

        new_messages: list[Message] = []
        records: list[ToolRecord] = []
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list | tuple):  # a malformed entry is one bad call, answered as such
            calls = [calls]
        if calls:
            tool_map = {t.tool_name: t for t in self.tools}
            injected = {"state": ep["state"], "task": ep["task"], "env": self}
            for result in await run_tools(calls, tool_map, injected, ep["task"], ep["messages"]):  # recorded/replayed when a tape is active
                new_messages.append(result.message)
                records.append(result.record)
            ep["messages"].extend(copy.deepcopy(new_messages))
            ep["tool_records"].extend(records)
        terminated = not calls
        truncated = not terminated and ep["turn"] >= self.max_turns
        ep["done"] = terminated or truncated

        reward, components = await self.score(per_turn=True, episode=ep["done"])
        info = {"rewards": components, "tool_records": records, "turn": ep["turn"]}
        return StepResult(new_messages, reward, terminated, truncated, info, rewards=components, tool_records=records)

    async def finish(self) -> tuple[float, dict[str, float | None]]:
        ep = self._episode
        if ep is None or ep["done"]:
            return 0.0, {}
        ep["done"] = True
        return await self.score(per_turn=False, episode=True)

    def reward_context(self) -> dict[str, Any]:
        ep = self._episode
        if ep is None:
            raise EnvError(f"{type(self).__name__}: no episode to score (call reset first)")
        return reward_context(ep["task"], ep["messages"], ep["state"], ep["turn"], ep["tool_records"])

    @property
    def episode(self) -> dict[str, Any] | None:
        """The running episode's record (task, messages, turn, state, tool records)."""
        return self._episode

    def spawn(self) -> ToolEnvironment:
        self.__dict__.setdefault("_dataset_cache", {})
        return per_episode_copy(self, {}, reset={"_episode": None})
