"""Train an agent you already have: an environment whose episode is your own OpenAI-client code.

``HarnessEnvironment(run)`` turns ``async def run(task, client) -> reward`` (or ``run(task,
endpoint)`` for code that builds its own client from ``endpoint.base_url`` / ``endpoint.api_key``)
into an ``Environment`` the rollout engine drives like any other. The inversion of control lives
here: ``reset`` starts the harness and waits for its first chat request (its messages and tools
open the episode); the engine samples the turn with its own token path (render, generator, parse);
``step`` answers the harness's pending request with the parsed reply and waits for its next
request, whose new messages (tool results, a user turn) are the environment's answer, bridged by
the engine in token space. A request whose history is not the episode's history plus new messages
(the harness edited, dropped or re-sent messages) is returned as a rewritten history: the engine
starts a new sample from it and counts a split, so nothing is ever silently re-tokenised. The
harness returning ends the episode; its return value and the environment's reward functions (on
the transcript) score it.

Failures stay in their episode: a harness that raises, hangs (no request or return within
``request_timeout_s``; the whole run within ``episode_timeout_s``), changes its tools, or sends
requests the endpoint refuses ends with a recorded error or gets an OpenAI-shaped 400 it may
recover from. A harness that blocks the event loop (a synchronous sleep or HTTP call inside
``async def``) blocks every episode: that one cannot be caught from inside the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import inspect
import json
import random
import secrets
import time
import traceback
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentrl.core.errors import AgentrlError, ConfigError
from agentrl.core.messages import Message, ParsedResponse
from agentrl.core.records import ToolRecord
from agentrl.core.step import StepResult
from agentrl.env.environment import EnvError, Environment, Reward, as_reward, reward_context
from agentrl.env.harness_http import LoopbackServer, error_body
from agentrl.env.harness_openai import ChatRequest, RequestError, canonical, completion, parse_request
from agentrl.env.harness_openai import _message as wire_to_message

if TYPE_CHECKING:
    from agentrl.generators.protocol import Generation
    from agentrl.rollout.engine import TurnRequest

MODEL_NAME = "agentrl-policy"
RUN_ARGS = ("task", "client", "endpoint", "seed")


class HarnessError(AgentrlError, RuntimeError):
    """A harness episode that cannot go on: the harness raised, hung, or broke the protocol."""


@dataclass(frozen=True)
class Endpoint:
    """Where one episode's harness sends its chat requests (OpenAI-compatible, loopback only)."""

    base_url: str
    api_key: str
    model: str = MODEL_NAME

    def client(self, **kwargs: Any) -> Any:
        """An ``openai.AsyncOpenAI`` for this episode: no retries (a retry re-sends a turn, which
        costs a split) and no client-side timeout (the episode's own limits bound it)."""
        try:
            import openai
        except ImportError:
            raise ConfigError(
                "a harness that takes `client` needs the openai package (pip install openai); "
                "or take `endpoint` and build your own client"
            ) from None
        if kwargs.get("http_client", ...) is None:
            del kwargs["http_client"]
        return openai.AsyncOpenAI(
            base_url=self.base_url, api_key=self.api_key, **{"max_retries": 0, "timeout": None, **kwargs}
        )


@dataclass
class _Request:
    """A request the harness is waiting on, and where its answer goes."""

    chat: ChatRequest
    answer: asyncio.Future[tuple[int, dict[str, Any]]]
    at: float


@dataclass
class _Episode:
    """One episode's state; owned by the environment instance that runs it (never shared)."""

    key: str
    task: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    inbox: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)
    pending: _Request | None = None
    harness: asyncio.Task[Any] | None = None
    tools: list[dict[str, Any]] | None = None
    history: list[tuple[Any, ...]] = field(default_factory=list)  # canonical messages, as the harness sees them
    transcript: list[Message] = field(default_factory=list)  # the conversation as the model saw it
    calls: list[tuple[str, str, bool]] = field(default_factory=list)  # (id, name, well formed) of the last reply
    records: list[ToolRecord] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    usage: tuple[int, int] = (0, 0)
    stopped_on: str | None = None  # the stop string the last turn was cut at
    turn: int = 0
    done: bool = False


class _Hub:
    """What the episodes of one environment share on purpose: the run's token, one loopback server per
    event loop (started by the first episode on it, closed with the last), the routing table, and
    counters. Everything here is touched from the event loop only."""

    def __init__(self, max_body_bytes: int) -> None:
        self.token = secrets.token_urlsafe(24)
        self.max_body_bytes = max_body_bytes
        self.servers: dict[asyncio.AbstractEventLoop, list[Any]] = {}  # loop -> [server, episodes using it, its start]
        self.episodes: dict[str, _Episode] = {}
        self.http_clients: dict[asyncio.AbstractEventLoop, Any] = {}
        self.own_s: deque[float] = deque(maxlen=100_000)
        self.stats: Counter[str] = Counter()

    async def acquire(self) -> int:
        loop = asyncio.get_running_loop()
        entry = self.servers.get(loop)
        if entry is None:  # the first episode on this loop starts the server; the others wait for it
            server = LoopbackServer(self.token, self.handle, self.max_body_bytes, self.own_s)
            entry = self.servers[loop] = [server, 0, loop.create_task(server.start())]
        entry[1] += 1
        try:
            await asyncio.shield(entry[2])
        except BaseException:
            await self.release(loop)
            raise
        return entry[0].port

    async def release(self, loop: asyncio.AbstractEventLoop) -> None:
        """One episode on ``loop`` ended; the last one closes its server (at once when ``loop`` has
        already ended, as when a check ran ``reset`` under a short-lived ``anyio.run``)."""
        entry = self.servers.get(loop)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del self.servers[loop]
        http = self.http_clients.pop(loop, None)
        if loop is not asyncio.get_running_loop():
            with contextlib.suppress(Exception):
                entry[0].abandon()
            return
        await entry[0].close()
        if http is not None:
            with contextlib.suppress(Exception):
                await http.aclose()

    def http_client(self) -> Any:
        """One connection pool per loop for the clients agentrl builds: creating an HTTP client costs
        ~0.15 s of CPU (it loads the CA store), paid once instead of once per episode."""
        loop = asyncio.get_running_loop()
        if loop not in self.http_clients:
            try:
                import openai
            except ImportError:  # Endpoint.client says what to install
                return None
            self.http_clients[loop] = openai.DefaultAsyncHttpxClient()
        return self.http_clients[loop]

    async def handle(self, key: str, route: str, body: bytes) -> tuple[int, dict[str, Any], float]:
        """(status, JSON body, seconds spent waiting for the episode's answer) for one request."""
        ep = self.episodes.get(key)
        if ep is None or ep.done:
            return 404, error_body("no running episode has this key (it ended, or never existed)", "episode_not_found"), 0.0
        if route == "models":
            return 200, {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "agentrl"}]}, 0.0
        self.stats["requests"] += 1
        try:
            chat = parse_request(json.loads(body))
        except (ValueError, RecursionError) as exc:
            self.stats["rejected"] += 1
            if isinstance(exc, RequestError):
                return exc.status, exc.body(), 0.0
            return 400, error_body(f"the body is not JSON: {exc}"), 0.0
        if ep.pending is not None:
            self.stats["rejected"] += 1
            return 409, error_body(
                "this episode already has a request in flight: one conversation, one request at a time"
            ), 0.0
        answer: asyncio.Future[tuple[int, dict[str, Any]]] = ep.loop.create_future()
        ep.pending = _Request(chat, answer, time.perf_counter())
        ep.inbox.put_nowait(("request", ep.pending))
        t0 = time.perf_counter()
        status, payload = await answer
        return status, payload, time.perf_counter() - t0


class HarnessEnvironment(Environment):
    """An environment whose episode is ``run``, an agent loop written against an OpenAI-compatible API.

    Args:
        run: ``async def run(task, client)`` (an ``openai.AsyncOpenAI`` for this episode) or
            ``run(task, endpoint)`` (an :class:`Endpoint`); ``seed`` may be asked for too. Returns
            a number (the reward), a dict (named components; its ``"reward"`` is the total, else
            their sum), or None (the reward functions alone score the episode).
        datasets: the tasks, ``{split: Dataset}``, or an environment whose ``dataset(split)`` to use.
        rewards: reward functions scored on the transcript (as ``ToolEnvironment``'s: ``messages``,
            ``completion``, ``task``, ``tool_records``, ``state`` (``state["result"]`` is what
            ``run`` returned), task columns); added to the harness's own reward.
        request_timeout_s: how long the harness may take to send its next request (or return)
            after an answer, and its first request after the start.
        episode_timeout_s: the most one run may take in all.
        finish_timeout_s: how long a harness whose episode the engine cut short (token budget,
            max_turns) gets to return after its request is refused.
        max_turns: assistant turns before the engine cuts the episode.
        max_body_mb: the largest request body the endpoint reads.
    """

    # One loopback server (the hub) answers every episode, each under its own key; the harness
    # function, its argument names and the reward functions hold no episode state. Each episode's
    # own state is ``_ep``, created in ``reset``.
    shared = ("_hub", "_wants", "rewards", "run")

    def __init__(
        self,
        run: Callable[..., Awaitable[Any]],
        datasets: dict[str, Any] | Environment | None = None,
        rewards: Sequence[Reward | Callable[..., Any]] = (),
        request_timeout_s: float = 120.0,
        episode_timeout_s: float = 900.0,
        finish_timeout_s: float = 10.0,
        max_turns: int = 20,
        max_body_mb: float = 8.0,
    ) -> None:
        if not inspect.iscoroutinefunction(run) and not inspect.iscoroutinefunction(type(run).__call__):
            raise ConfigError(
                f"HarnessEnvironment: run must be an async function (async def run(task, client)), got {run!r:.100}"
            )
        params = inspect.signature(run).parameters
        unknown = [
            p
            for p, v in params.items()
            if p not in RUN_ARGS and v.default is v.empty and v.kind not in (v.VAR_KEYWORD, v.VAR_POSITIONAL)
        ]
        if unknown:
            raise ConfigError(f"HarnessEnvironment: run asks for {unknown}; it may take {list(RUN_ARGS)} by name")
        for name, value in (
            ("request_timeout_s", request_timeout_s),
            ("episode_timeout_s", episode_timeout_s),
            ("finish_timeout_s", finish_timeout_s),
            ("max_body_mb", max_body_mb),
        ):
            if not value > 0:
                raise ConfigError(f"HarnessEnvironment: {name} must be positive, got {value!r}")
        if "client" in params:
            try:
                import openai  # noqa: F401
            except ImportError:
                raise ConfigError("HarnessEnvironment: run takes `client`, an openai.AsyncOpenAI, but the openai package is not installed "
                                  "(pip install openai); or take `endpoint` and build your own client") from None
        self.run = run
        self._wants = {p for p in params if p in RUN_ARGS} | (
            set(RUN_ARGS) - {"client"} if any(v.kind is v.VAR_KEYWORD for v in params.values()) else set()
        )
        self._datasets = datasets
        self.rewards = [as_reward(r) for r in rewards]
        self.request_timeout_s, self.episode_timeout_s, self.finish_timeout_s = (
            request_timeout_s,
            episode_timeout_s,
            finish_timeout_s,
        )
        self.max_turns = max_turns
        self._hub = _Hub(int(max_body_mb * 1024 * 1024))
        self._ep: _Episode | None = None

    # -- tasks -------------------------------------------------------------------------------------

    def dataset(self, split: str = "train") -> Any:
        if isinstance(self._datasets, Environment):
            return self._datasets.dataset(split)
        if not self._datasets:
            raise NotImplementedError(f"{type(self).__name__} was given no datasets")
        if split not in self._datasets:
            raise KeyError(f"{type(self).__name__} has no {split!r} split; it has {sorted(self._datasets)}")
        return self._datasets[split]

    def endpoint_seconds(self) -> list[float]:
        """The endpoint's own time per request (the most recent 100,000): from the request read to
        its answer written, less the time the episode took to sample the answer."""
        return list(self._hub.own_s)

    @property
    def stats(self) -> dict[str, int]:
        """Counts over every episode of this environment: requests, rejected (answered with an
        error), splits (rewritten histories), ignored sampling fields, harness errors and timeouts."""
        return dict(self._hub.stats)

    def tool_schemas(self) -> list[dict[str, Any]]:
        return list(self._ep.tools or []) if self._ep is not None else []

    # -- the episode --------------------------------------------------------------------------------

    async def reset(
        self, task: dict[str, Any] | None = None, seed: int | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        if task is None:  # gym-style reset(seed=...): a task drawn from the train split, as ToolEnvironment does
            data = self.dataset("train")
            task = dict(data[random.Random(seed).randrange(len(data))])
        if not isinstance(task, dict):
            raise HarnessError(f"{type(self).__name__}.reset needs a task (a dataset row), got {task!r:.100}")
        if self._ep is not None:  # reset again without close: end the running episode first
            await self.close()
        ep = _Episode(key=secrets.token_urlsafe(12), task=dict(task), loop=asyncio.get_running_loop())
        port = await self._hub.acquire()
        self._ep = ep  # from here on close() releases the server
        self._hub.episodes[ep.key] = ep
        endpoint = Endpoint(f"http://127.0.0.1:{port}/ep/{ep.key}/v1", self._hub.token)
        kwargs: dict[str, Any] = {"task": copy.deepcopy(ep.task), "seed": seed, "endpoint": endpoint}
        if "client" in self._wants:
            kwargs["client"] = endpoint.client(http_client=self._hub.http_client())
        ep.harness = asyncio.ensure_future(self._drive({k: v for k, v in kwargs.items() if k in self._wants}, ep))
        kind, request = await self._next(ep, "its first request")
        if kind != "request":
            raise HarnessError("the harness returned without sending a chat request")
        ep.tools = request.chat.tools
        ep.history = [canonical(m) for m in request.chat.messages]
        ep.transcript = copy.deepcopy(request.chat.messages)
        return copy.deepcopy(request.chat.messages), {"task": dict(task), "tools": self.tool_schemas()}

    async def _drive(self, kwargs: dict[str, Any], ep: _Episode) -> None:
        """Run the harness; its end (a value or an exception) is the inbox's last event."""
        try:
            value = await asyncio.wait_for(self.run(**kwargs), self.episode_timeout_s)
        except asyncio.TimeoutError:
            ep.inbox.put_nowait(
                ("error", HarnessError(f"the harness ran past episode_timeout_s={self.episode_timeout_s:g} s"))
            )
        except Exception as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
            at = f" (at {where[0].filename}:{where[0].lineno})" if where else ""
            ep.inbox.put_nowait(
                ("error", HarnessError(f"the harness raised {type(exc).__name__}: {str(exc)[:500]}{at}"))
            )
        else:
            ep.inbox.put_nowait(("done", value))

    async def _next(self, ep: _Episode, what: str) -> tuple[str, Any]:
        try:
            kind, value = await asyncio.wait_for(ep.inbox.get(), self.request_timeout_s)
        except asyncio.TimeoutError:
            self._hub.stats["timeouts"] += 1
            raise HarnessError(
                f"the harness sent neither {what} nor returned within request_timeout_s={self.request_timeout_s:g} s (hung?)"
            ) from None
        if kind == "error":
            self._hub.stats["harness_errors"] += 1
            raise value
        return kind, value

    async def sample(self, turn: TurnRequest, generate: Callable[..., Awaitable[Generation]]) -> Generation:
        """The pending request's ``max_tokens`` (within the engine's budget) and ``stop`` strings.

        Temperature, top_p and seed stay the run's: the trainer recomputes log-probs under its own
        sampling settings, and a harness's fixed seed would make every sample of a group the same.
        Cutting at a stop string after sampling is exact: the tokens kept were drawn as they would
        have been had sampling stopped there.
        """
        ep = self._episode()
        chat = ep.pending.chat if ep.pending is not None else None
        sampling = turn.sampling
        if chat is not None:
            for name in ("temperature", "top_p", "seed"):
                value = getattr(chat, name)
                if value is not None and value != getattr(sampling, name):
                    self._hub.stats[f"ignored_{name}"] += 1
            if chat.max_tokens is not None and chat.max_tokens < sampling.max_tokens:
                sampling = sampling.model_copy(update={"max_tokens": chat.max_tokens})
        gen = await generate(turn.ids, sampling)
        ep.stopped_on = None
        if chat is not None and chat.stop:
            gen = self._cut_at_stop(gen, chat.stop, turn.chat_format, ep)
        ep.usage = (len(turn.ids), len(gen.token_ids))
        return gen

    @staticmethod
    def _cut_at_stop(gen: Generation, stops: list[str], fmt: Any, ep: _Episode) -> Generation:
        ids = list(gen.token_ids)
        if not any(s in fmt.decode(ids) for s in stops):
            return gen
        lo, hi = 1, len(ids)  # the shortest prefix whose text holds a stop string
        while lo < hi:
            mid = (lo + hi) // 2
            if any(s in fmt.decode(ids[:mid]) for s in stops):
                hi = mid
            else:
                lo = mid + 1
        text = fmt.decode(ids[:lo])
        ep.stopped_on = min((s for s in stops if s in text), key=text.index)
        return dataclasses.replace(gen, token_ids=ids[:lo], logprobs=list(gen.logprobs[:lo]), finish_reason="stop")

    async def step(self, message: Message | ParsedResponse) -> StepResult:
        ep = self._episode()
        if isinstance(message, ParsedResponse):
            message = message.to_message()
        request = ep.pending
        if request is None or ep.done:
            raise EnvError(f"{type(self).__name__}.step called with no request of the harness waiting (after the episode ended?)")
        shown = dict(message)
        if ep.stopped_on is not None:  # the API leaves the stop string out of the reply
            shown["content"] = (shown.get("content") or "").split(ep.stopped_on, 1)[0]
        reply = completion(shown, "stop", request.chat.model or MODEL_NAME, *ep.usage)
        wire = reply["choices"][0]["message"]
        ep.pending = None
        ep.turn += 1
        ep.history.append(canonical(wire_to_message(wire, 0)))
        ep.transcript.append(copy.deepcopy(message))
        ep.calls = [(c["id"], c["function"]["name"], _well_formed(c)) for c in wire.get("tool_calls", [])]
        request.answer.set_result((200, reply))
        replied = time.perf_counter()

        kind, value = await self._next(ep, "its next request")
        if kind == "done":
            return await self._end(ep, value)
        nxt: _Request = value
        if nxt.chat.tools != ep.tools:
            raise HarnessError(
                "the harness changed its tools mid-episode: the tool schemas are part of every sample's prompt, so an episode keeps one set"
            )
        sent = nxt.chat.messages
        n = len(ep.history)
        suffix = sent[n:]
        if (
            len(sent) > n
            and all(canonical(m) == h for m, h in zip(sent, ep.history))
            and not any(m["role"] == "assistant" for m in suffix)
        ):
            new = [self._named(m) for m in suffix]
            records = self._tool_records(new, nxt.at - replied)
            ep.history.extend(canonical(m) for m in suffix)
            ep.transcript.extend(copy.deepcopy(new))
            ep.records.extend(records)
            reward, components = await self.score(per_turn=True, episode=False)
            return StepResult(new, reward, False, False, {"turn": ep.turn}, rewards=components, tool_records=records)
        self._hub.stats["splits"] += 1  # edited, dropped or re-sent messages: a new sample from what was sent
        ep.history = [canonical(m) for m in sent]
        ep.transcript = copy.deepcopy(sent)
        reward, components = await self.score(per_turn=True, episode=False)
        return StepResult(
            [],
            reward,
            False,
            False,
            {"turn": ep.turn, "rewritten": True},
            rewards=components,
            history=copy.deepcopy(sent),
        )

    def _named(self, m: Message) -> Message:
        """A tool message with its call's name (templates that show tool names read it)."""
        if m["role"] == "tool" and "name" not in m:
            name = next((c[1] for c in self._episode().calls if c[0] == m.get("tool_call_id")), None)
            if name is not None:
                return {**m, "name": name}
        return m

    def _tool_records(self, new: list[Message], latency: float) -> list[ToolRecord]:
        """One record per call of the last reply: what the harness's tool messages say happened."""
        ep = self._episode()
        known = {t["function"]["name"] for t in ep.tools or []}
        answered = {m.get("tool_call_id") for m in new if m["role"] == "tool"}
        records = []
        for call_id, name, ok in ep.calls:
            if call_id not in answered:
                records.append(
                    ToolRecord(name, "error", latency, call_id, "the harness sent no tool message for this call")
                )
            elif not ok:
                records.append(
                    ToolRecord(name, "bad_json", latency, call_id, "the call's arguments were not a JSON object")
                )
            elif name not in known:
                records.append(ToolRecord(name, "unknown_tool", latency, call_id, "not among the request's tools"))
            else:
                records.append(ToolRecord(name, "ok", latency, call_id))
        return records

    async def _end(self, ep: _Episode, value: Any) -> StepResult:
        ep.done = True
        reward, components = await self._final_score(ep, value)
        return StepResult([], reward, True, False, {"turn": ep.turn, "result": value}, rewards=components)

    async def _final_score(
        self, ep: _Episode, value: Any, *, returned: bool = True
    ) -> tuple[float, dict[str, float | None]]:
        """The harness's own reward plus the reward functions' (per-turn ones included: this is the last turn)."""
        ep.state["result"] = value
        own: dict[str, float | None] = {}
        total = 0.0
        if returned:
            total, own = harness_reward(value, has_rewards=bool(self.rewards))
        fn_total, fn_components = await self.score(per_turn=True, episode=True)
        clash = sorted(set(own) & set(fn_components))
        if clash:
            raise HarnessError(
                f"the harness returned reward component(s) {clash} that the environment's reward functions also name"
            )
        return total + fn_total, {**own, **fn_components}

    async def finish(self) -> tuple[float, dict[str, float | None]]:
        """The engine cut the episode (token budget, context, max_turns): refuse the waiting request,
        give the harness ``finish_timeout_s`` to return, and score what there is."""
        ep = self._ep
        if ep is None or ep.done:
            return 0.0, {}
        ep.done = True
        refusal = (
            400,
            error_body(
                "the episode's token budget or turn limit is spent: agentrl ended it", "context_length_exceeded"
            ),
        )
        if ep.pending is not None and not ep.pending.answer.done():
            ep.pending.answer.set_result(refusal)
            ep.pending = None
        deadline = time.perf_counter() + self.finish_timeout_s
        while True:
            try:
                kind, value = await asyncio.wait_for(ep.inbox.get(), max(0.0, deadline - time.perf_counter()))
            except asyncio.TimeoutError:
                kind, value = "gone", None
            if kind == "request":  # the harness tried again: the episode is over
                value.answer.set_result(refusal)
                ep.pending = None
                continue
            if kind != "done":  # it raised on the refusal or did not return: the reward functions alone score it
                return await self._final_score(ep, None, returned=False)
            return await self._final_score(ep, value, returned=value is not None or not self.rewards)

    async def close(self) -> None:
        ep, self._ep = self._ep, None
        if ep is None:
            return
        ep.done = True
        self._hub.episodes.pop(ep.key, None)
        if ep.loop is asyncio.get_running_loop():  # an episode whose loop has ended has nothing left to stop
            if ep.pending is not None and not ep.pending.answer.done():
                ep.pending.answer.set_result((503, error_body("the episode ended", "episode_ended")))
            if ep.harness is not None and not ep.harness.done():
                ep.harness.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(asyncio.shield(ep.harness), 1.0)
        await self._hub.release(ep.loop)

    def reward_context(self) -> dict[str, Any]:
        ep = self._episode()
        return reward_context(ep.task, ep.transcript, ep.state, ep.turn, ep.records)

    def _episode(self) -> _Episode:
        if self._ep is None:
            raise EnvError(f"{type(self).__name__}: no running episode (call reset first)")
        return self._ep

    def spawn(self) -> HarnessEnvironment:
        clone = copy.copy(self)
        clone._ep = None
        return clone


def _well_formed(call: dict[str, Any]) -> bool:
    try:
        return isinstance(json.loads(call["function"]["arguments"]), dict)
    except (ValueError, TypeError, RecursionError):
        return False


def harness_reward(value: Any, has_rewards: bool) -> tuple[float, dict[str, float | None]]:
    """A harness's return value as (total, components); raises ``HarnessError`` on anything else."""
    if value is None:
        if not has_rewards:
            raise HarnessError(
                "the harness returned None and the environment has no reward functions: nothing scores the episode"
            )
        return 0.0, {}
    if isinstance(value, bool | int | float):
        return _finite(value, "the harness's reward"), {"harness": float(value)}
    if isinstance(value, dict):
        components: dict[str, float | None] = {}
        for key, v in value.items():
            if v is not None and not isinstance(v, bool | int | float):
                raise HarnessError(f"the harness returned a dict whose {key!r} is {type(v).__name__}, not a number")
            components[str(key)] = None if v is None else _finite(v, f"the harness's {key!r}")
        if "reward" in components:
            total = components.pop("reward") or 0.0
        else:
            total = sum(v for v in components.values() if v is not None)
        return total, components
    raise HarnessError(
        f"the harness returned {type(value).__name__} ({value!r:.100}): return a number, a dict of numbers, or None"
    )


def _finite(value: Any, what: str) -> float:
    out = float(value)
    if out != out or out in (float("inf"), float("-inf")):
        raise HarnessError(f"{what} is {out}, not a finite number")
    return out
