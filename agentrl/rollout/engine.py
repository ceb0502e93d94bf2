"""The multi-turn rollout engine: episodes as independent asyncio tasks, token in / token out.

Each episode runs as its own task under one anyio task group, capped by a limiter. An episode
awaits the generator for its turn and the environment for its tools; while it waits, every other
episode keeps going, so one episode's tool latency overlaps the others' generation (no lockstep).

Token fidelity: the ids sent to the generator are always the episode's own ids so far — the
sampled ids exactly as sampled plus the tokens the chat format's bridge proved. The loss mask is
1 only on sampled ids. When the bridge cannot prove a prefix, the episode is split: a new sample
starts from a fresh render of the conversation, and the split is counted.

Budget overflow policy: if the environment's reply (with the next assistant header) would not fit
in the context or completion budget, it is not appended (the turn is rolled back to the end of the
last sampled token), the episode ends with ``finish_reason="context"`` / ``"max_tokens"`` and
``truncated=True``, and the environment scores it with ``finish()``. Nothing is cut mid-message,
so the model never trains on a context it would not see at inference.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

if sys.version_info < (3, 11):  # anyio brings the backport there
    from exceptiongroup import BaseExceptionGroup

from agentrl.chat.base import BridgeResult, ChatFormat
from agentrl.core.step import StepResult
from agentrl.core.trajectory import Sample, Trajectory, TrajectoryGroup, Turn
from agentrl.env.environment import Environment, RewardError
from agentrl.generators.config import SamplingConfig
from agentrl.generators.protocol import Generation, Generator, SamplingParams
from agentrl.rollout.config import RolloutConfig


@dataclass(frozen=True)
class TurnRequest:
    """What the next assistant turn is produced from: the episode's environment and messages so far,
    the tool schemas, the token ids so far and this turn's sampling (``max_tokens`` is its budget)."""

    env: Environment
    chat_format: ChatFormat
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    ids: list[int]
    sampling: SamplingParams


TurnSource = Callable[[TurnRequest], Awaitable[Generation]]


class RolloutEngine:
    """Runs episodes of an environment against a generator through one chat format."""

    def __init__(
        self,
        generator: Generator,
        chat_format: ChatFormat,
        config: RolloutConfig | None = None,
        sampling: SamplingConfig | None = None,
    ) -> None:
        self.generator = generator
        self.chat_format = chat_format
        self.config = config or RolloutConfig()
        self.sampling = sampling or SamplingConfig()
        self.events: list[tuple[str, int, int]] = []  # (kind, episode, turn) in order, for tests and debugging
        self.record_events = False

    async def run(
        self,
        env: Environment,
        tasks: list[dict[str, Any]],
        n: int = 1,
        seed: int | None = 0,
        on_episode: Callable[[Trajectory], None] | None = None,
    ) -> list[TrajectoryGroup]:
        """``n`` episodes for each task; group ``g`` uses environment seed ``seed + g``.

        ``on_episode`` is called as each episode ends (progress bars, streaming writers).
        """
        limiter = anyio.CapacityLimiter(self.config.max_concurrent_episodes)
        groups = [
            TrajectoryGroup(task=dict(task), seed=None if seed is None else seed + g, trajectories=[None] * n)  # type: ignore[list-item]
            for g, task in enumerate(tasks)
        ]

        # A generator that batches concurrent requests waits for the next request of every episode
        # that will send one: counted from the start (the first to arrive must not go alone), at
        # most the limiter's capacity, one fewer as each ends once no episode waits to start.
        track = self.generator.track_episodes
        capacity = self.config.max_concurrent_episodes
        unfinished = len(groups) * n
        expected = min(unfinished, capacity)
        if expected:
            track(expected)

        def finished() -> None:
            nonlocal unfinished, expected
            unfinished -= 1
            if expected and unfinished < capacity:
                expected -= 1
                track(-1)

        left = [n] * len(groups)  # episodes of each group still running
        spawned: list[list[Environment | None]] = [[None] * n for _ in groups]

        async def one(g: int, i: int) -> None:
            async with limiter:
                try:
                    traj, spawned[g][i] = await self._run(env, groups[g].task, groups[g].seed, g, i, None)
                finally:
                    finished()
            groups[g].trajectories[i] = traj
            left[g] -= 1
            if left[g] == 0:  # the group is complete: rewards that see all of it (TRL's batched ones)
                await self._score_group(env, groups[g], spawned[g])
                spawned[g] = []
            if on_episode is not None:
                on_episode(traj)

        try:
            async with anyio.create_task_group() as tg:
                for g in range(len(groups)):
                    for i in range(n):
                        tg.start_soon(one, g, i)
        except BaseExceptionGroup as group:  # a reward raised (reward_errors=raise): that error, not the group
            found = reward_error_in(group)
            if found is None:
                raise
            raise found from None
        finally:
            if expected:  # cancelled: episodes that never started leave the count too
                track(-expected)
        return groups

    async def run_episode(
        self, base_env: Environment, task: dict[str, Any], seed: int | None, group: int = 0, index: int = 0, turns: TurnSource | None = None
    ) -> Trajectory:
        """One episode. Infrastructure failures are recorded on the trajectory, never raised.

        ``turns``: where the assistant turns come from (None: the generator, sampling).
        """
        return (await self._run(base_env, task, seed, group, index, turns))[0]

    async def _run(
        self, base_env: Environment, task: dict[str, Any], seed: int | None, group: int, index: int, turns: TurnSource | None
    ) -> tuple[Trajectory, Environment]:
        """``run_episode``, also returning the episode's (closed) environment for group scoring."""
        traj = Trajectory(task=dict(task), seed=seed, group=group, index=index)
        start = time.perf_counter()
        env = base_env.spawn()
        try:
            await self._episode(env, traj, turns or self._sample)
        except RewardError as exc:  # the user's reward raised: stop the run by default, else drop and count it
            if self.config.reward_errors == "raise":
                await _close_quietly(env)
                raise
            traj.error = str(exc)
            traj.finish_reason = "reward_error"
        except Exception as exc:  # generator or environment failure: drop this episode only
            traj.error = f"{type(exc).__name__}: {exc}"
            traj.finish_reason = "error"
        finally:
            try:
                await env.close()
            except Exception as exc:
                traj.error = traj.error or f"close failed: {type(exc).__name__}: {exc}"
        traj.duration_s = time.perf_counter() - start
        return traj, env

    async def _score_group(self, base_env: Environment, group: TrajectoryGroup, envs: list[Environment | None]) -> None:
        """Add the group-level rewards to each finished episode (and to its last turn, as ``finish`` does)."""
        scorer = getattr(base_env, "score_group", None)
        done = [(t, e) for t, e in zip(group.trajectories, envs) if t.ok and e is not None]
        if scorer is None or not done:
            return
        try:
            scores = await scorer([(t.messages, t.completion_ids, e) for t, e in done], group.task)
        except RewardError as exc:
            if self.config.reward_errors == "raise":
                raise
            for t, _ in done:
                t.error, t.finish_reason = str(exc), "reward_error"
            return
        for (t, _), (reward, components) in zip(done, scores):
            if components:
                _add_episode_score(t, reward, components)

    async def _sample(self, turn: TurnRequest) -> Generation:
        sample = getattr(turn.env, "sample", None)  # the environment may narrow a turn (a harness's max_tokens, stop)
        if sample is None:  # a duck-typed environment without Environment's default
            return await self.generator.generate(turn.ids, turn.sampling)
        return await sample(turn, self.generator.generate)

    async def _episode(self, env: Environment, traj: Trajectory, turns: TurnSource) -> None:
        cfg, fmt = self.config, self.chat_format
        messages, _info = await env.reset(task=traj.task, seed=traj.seed)
        tools = env.tool_schemas() or None
        traj.messages = list(messages)
        sample = Sample(prompt_ids=fmt.render(messages, tools))
        traj.samples.append(sample)
        max_turns = cfg.max_turns or getattr(env, "max_turns", None) or 10
        used = 0  # completion tokens (sampled + environment) across samples

        for turn_index in range(max_turns):
            limits = {
                "length": cfg.max_tokens_per_turn,
                "max_tokens": cfg.max_completion_tokens - used,
                "context": cfg.max_context - len(sample.ids),
            }
            binding = min(limits, key=limits.__getitem__)
            budget = limits[binding]
            if budget < 1:
                await self._cut(env, traj, binding)
                return
            sampling = SamplingParams.of(self.sampling, max_tokens=budget, stop_token_ids=list(fmt.stop_token_ids), seed=self._seed(traj, turn_index))
            self._event("generate", traj, turn_index)
            t0 = time.perf_counter()
            gen = await turns(TurnRequest(env, fmt, traj.messages, tools, sample.ids, sampling))
            gen_s = time.perf_counter() - t0
            self._event("generated", traj, turn_index)
            start = len(sample.completion_ids)
            sample.extend(list(gen.token_ids), sampled=True, logprobs=list(gen.logprobs))
            used += len(gen.token_ids)

            parsed = await fmt.aparse(gen.token_ids, tools)  # schemas type untyped (XML) arguments; long ones off the loop
            message = parsed.to_message()
            for k, call in enumerate(message.get("tool_calls", [])):
                call.setdefault("id", f"call_{turn_index}_{k}")
            turn = Turn(
                index=turn_index,
                message=message,
                num_sampled=len(gen.token_ids),
                finish_reason=gen.finish_reason,
                parse_issues=[{"kind": i.kind, "detail": i.detail} for i in parsed.issues],
                generation_s=gen_s,
                sample=len(traj.samples) - 1,
                start=start,
            )
            traj.turns.append(turn)
            traj.messages.append(message)
            if gen.finish_reason != "stop":  # cut mid-turn: nothing sensible to send the environment
                await self._cut(env, traj, binding if gen.finish_reason == "length" else gen.finish_reason)
                return

            t0 = time.perf_counter()
            step = StepResult.of(await env.step(message))
            new, reward, terminated, truncated = step.messages, step.reward, step.terminated, step.truncated
            turn.env_s = time.perf_counter() - t0
            turn.env_messages = list(new)
            turn.tool_records = list(step.tool_records)
            turn.reward = float(reward)
            turn.rewards = dict(step.rewards)
            traj.reward += float(reward)
            _add_components(traj.rewards, turn.rewards)
            if terminated or truncated:
                traj.finish_reason = "stop" if terminated else "max_turns"
                traj.truncated = bool(truncated and not terminated)
                traj.messages.extend(new)
                return

            if step.history is not None:  # the environment rewrote the conversation: no bridge can prove it
                traj.messages = list(step.history)
                bridge = BridgeResult(None, "the environment rewrote the conversation")
            else:
                bridge = fmt.bridge(traj.messages, new, sample.ids, tools)
                traj.messages.extend(new)
            if bridge.proven:
                env_ids = list(bridge.ids or [])
                turn.bridge = "proven"
            else:
                traj.splits += 1
                turn.bridge = f"split: {bridge.reason}"
                env_ids = []
                sample = Sample(prompt_ids=fmt.render(traj.messages, tools))
                traj.samples.append(sample)
            if len(sample.ids) + len(env_ids) >= cfg.max_context:
                await self._rollback(env, traj, sample, "context")
                return
            if used + len(env_ids) >= cfg.max_completion_tokens:
                await self._rollback(env, traj, sample, "max_tokens")
                return
            sample.extend(env_ids, sampled=False)
            turn.num_env_tokens = len(env_ids)
            used += len(env_ids)
        await self._cut(env, traj, "max_turns")

    async def _rollback(self, env: Environment, traj: Trajectory, sample: Sample, reason: str) -> None:
        """The environment's reply does not fit: end the episode after the last sampled token."""
        if not sample.completion_ids and len(traj.samples) > 1:
            traj.samples.pop()  # a split sample that never got a sampled token
        await self._cut(env, traj, reason)

    async def _cut(self, env: Environment, traj: Trajectory, reason: str) -> None:
        reward, components = await env.finish()
        _add_episode_score(traj, reward, components)
        traj.finish_reason = reason
        traj.truncated = True

    def _seed(self, traj: Trajectory, turn: int) -> int | None:
        """Distinct, reproducible sampling seeds per episode and turn when a base seed is set."""
        base = self.sampling.seed
        if base is None:
            return None
        return (base * 1_000_003 + (traj.seed or 0) * 10_007 + traj.index * 101 + turn) % (2**63)

    def _event(self, kind: str, traj: Trajectory, turn: int) -> None:
        if self.record_events:
            self.events.append((kind, traj.group * 100_000 + traj.index, turn))


def _add_episode_score(traj: Trajectory, reward: float, components: dict[str, float | None]) -> None:
    """An episode-level score onto the episode and its last turn (per-turn credit sees it there)."""
    traj.reward += float(reward)
    _add_components(traj.rewards, components)
    if traj.turns:
        traj.turns[-1].reward += float(reward)
        _add_components(traj.turns[-1].rewards, components)


def _add_components(total: dict[str, float | None], new: dict[str, float | None]) -> None:
    for name, value in new.items():
        if value is None:
            total.setdefault(name, None)
        else:
            total[name] = (total.get(name) or 0.0) + value


async def _close_quietly(env: Environment) -> None:
    try:
        await env.close()
    except Exception:  # the reward's error is the one to report
        pass


def reward_error_in(group: BaseException) -> RewardError | None:
    """The ``RewardError`` inside a task group's ``ExceptionGroup``, so it stops a run as itself."""
    if isinstance(group, RewardError):
        return group
    for exc in getattr(group, "exceptions", ()):
        found = reward_error_in(exc)
        if found is not None:
            return found
    return None
