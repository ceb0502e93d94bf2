"""Harness episodes: an agent loop on the real ``openai`` client, served by the endpoint, sampled by
the real bundled model through the rollout engine."""

from __future__ import annotations

import asyncio
import functools
import json

import anyio
import openai
import pytest

from agentrl.chat.base import ChatFormat
from agentrl.core.errors import ConfigError
from agentrl.env.harness import HarnessEnvironment, HarnessError, harness_reward
from agentrl.environments.calculator import CalculatorEnv, correct
from agentrl.generators.hf.generator import TransformersGenerator
from agentrl.generators.protocol import Generation, SamplingParams
from agentrl.rollout import RolloutConfig, RolloutEngine
from agentrl.rollout.engine import TurnRequest
from agentrl.tools.calculator import Calculator

TOOLS = [Calculator(max_ops=1).schema]


class Recording:
    """The transformers generator, plus a record of every request and what it sampled."""

    def __init__(self, inner: TransformersGenerator) -> None:
        self.inner = inner
        self.calls: list[tuple[list[int], Generation]] = []
        self.seeds: list[int | None] = []

    async def generate(self, prompt_ids, sampling):
        gen = await self.inner.generate(prompt_ids, sampling)
        self.calls.append((list(prompt_ids), gen))
        self.seeds.append(sampling.seed)
        return gen

    def __getattr__(self, name):
        return getattr(self.inner, name)


def engine_for(model, fmt, **cfg) -> RolloutEngine:
    gen = Recording(TransformersGenerator(model, pad_token_id=fmt.tokenizer.pad_token_id, gather_window_s=0.002))
    return RolloutEngine(gen, fmt, RolloutConfig(**cfg), SamplingParams(temperature=1.0, seed=1))


def run(engine: RolloutEngine, env, tasks, n=1):
    async def main():
        try:
            return await engine.run(env, tasks, n=n, seed=0)
        finally:
            await engine.generator.close()

    return anyio.run(main)


def calculate(expression: str) -> str:
    a, op, b = expression.split()
    x, y = float(a), float(b)
    value = {"+": x + y, "-": x - y, "*": x * y, "/": x / y if y else float("nan")}[op]
    return str(int(value)) if value == int(value) else str(value)


async def agent(task, client, max_turns: int = 4):
    """A plain OpenAI tool-calling loop (what a user already has)."""
    messages = [{"role": "user", "content": task["question"]}]
    for _ in range(max_turns):
        response = await client.chat.completions.create(model="any", messages=messages, tools=TOOLS)
        message = response.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            return correct(message.content or "", task["answer"])
        for call in message.tool_calls:
            try:
                result = calculate(json.loads(call.function.arguments)["expression"])
            except Exception as exc:
                result = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 0.0


def tasks(k: int) -> list[dict]:
    return list(CalculatorEnv().dataset("test"))[:k]


def test_trajectory_tokens_are_the_sampled_tokens(model, fmt):
    env = HarnessEnvironment(agent, datasets=CalculatorEnv())
    engine = engine_for(model, fmt)
    groups = run(engine, env, tasks(6), n=2)
    trajs = [t for g in groups for t in g.trajectories]
    assert all(t.ok for t in trajs), [t.error for t in trajs]
    # Each request by its prompt and its seed (distinct per episode and turn).
    calls = {(tuple(prompt), seed): gen for (prompt, gen), seed in zip(engine.generator.calls, engine.generator.seeds)}
    assert len(calls) == len(engine.generator.calls) == sum(len(t.turns) for t in trajs)
    multi = 0
    for t in trajs:
        [sample] = t.samples
        assert t.splits == 0
        for turn in t.turns:
            prompt = sample.ids[: len(sample.prompt_ids) + turn.start]
            gen = calls[
                tuple(prompt), engine._seed(t, turn.index)
            ]  # the generator was sent exactly the episode's ids so far...
            sampled = sample.completion_ids[turn.start : turn.start + turn.num_sampled]
            assert sampled == gen.token_ids  # ...and the trajectory holds exactly what it sampled
            assert sample.logprobs[turn.start : turn.start + turn.num_sampled] == gen.logprobs
            assert sample.loss_mask[turn.start : turn.start + turn.num_sampled] == [1] * turn.num_sampled
        assert sum(sample.loss_mask) == sum(turn.num_sampled for turn in t.turns)
        assert [turn.bridge for turn in t.turns[:-1]] == ["proven"] * (len(t.turns) - 1)
        multi += len(t.turns) > 1
        # The tool results the harness computed are what the model saw next.
        for turn in t.turns[:-1]:
            assert [m["role"] for m in turn.env_messages] == ["tool"] * len(turn.message.get("tool_calls", []))
            args = [c["function"]["arguments"] for c in turn.message["tool_calls"]]
            assert [r.kind for r in turn.tool_records] == ["ok" if isinstance(a, dict) else "bad_json" for a in args]
        assert t.reward == t.rewards["harness"] == correct(t.turns[-1].message["content"], t.task["answer"])
        assert t.finish_reason == "stop"
    assert multi >= 6  # the bundled model calls the tool, so most episodes have tool turns to bridge
    assert env.stats["requests"] == len(calls)


async def editing_agent(task, client):
    """Asks a follow-up after the first reply, but edits the question it re-sends."""
    messages = [{"role": "user", "content": task["question"]}]
    first = await client.chat.completions.create(model="any", messages=messages)
    messages.append(first.choices[0].message)
    messages[0] = {"role": "user", "content": task["question"] + " Think again."}
    messages.append({"role": "user", "content": "Are you sure?"})
    await client.chat.completions.create(model="any", messages=messages)
    return 0.0


async def following_agent(task, client):
    messages = [{"role": "user", "content": task["question"]}]
    first = await client.chat.completions.create(model="any", messages=messages)
    messages += [first.choices[0].message, {"role": "user", "content": "Are you sure?"}]
    await client.chat.completions.create(model="any", messages=messages)
    return 0.0


def test_a_rewritten_history_is_a_counted_split_not_a_drifted_sample(model, fmt):
    engine = engine_for(model, fmt, max_tokens_per_turn=24)
    env = HarnessEnvironment(editing_agent)
    [group] = run(engine, env, tasks(1))
    [t] = group.trajectories
    assert t.ok, t.error
    assert t.splits == 1 and len(t.samples) == 2 and env.stats["splits"] == 1
    assert t.turns[0].bridge.startswith("split: ")
    (p1, g1), (p2, g2) = engine.generator.calls
    assert t.samples[0].prompt_ids == p1 and t.samples[0].completion_ids == g1.token_ids
    # The second sample starts from a fresh render of exactly what the harness sent.
    sent = [
        {"role": "user", "content": t.task["question"] + " Think again."},
        t.turns[0].message,
        {"role": "user", "content": "Are you sure?"},
    ]
    if g1.finish_reason == "stop":
        assert t.samples[1].prompt_ids == p2 == fmt.render(sent)
        assert t.samples[1].completion_ids == g2.token_ids
    # The unedited follow-up is bridged in token space: one sample.
    engine = engine_for(model, fmt, max_tokens_per_turn=24)
    [group] = run(engine, HarnessEnvironment(following_agent), tasks(1))
    [t] = group.trajectories
    if t.turns[0].finish_reason == "stop":
        assert t.splits == 0 and len(t.samples) == 1 and t.turns[0].bridge == "proven"


def scripted(fmt: ChatFormat, replies: list[dict]):
    """A turn source that writes ``replies`` as the ids the model would sample (the engine's demonstrated-turn path)."""

    async def turn(req: TurnRequest) -> Generation:
        reply = replies[sum(m["role"] == "assistant" for m in req.messages)]
        ids = fmt.assistant_ids(req.messages, reply, req.tools, prompt_ids=req.ids)
        return Generation(ids, [0.0] * len(ids), "stop")

    return turn


def test_parallel_tool_calls_round_trip(model, fmt):
    seen: list = []

    async def parallel_agent(task, client):
        messages = [{"role": "user", "content": "What are 2 + 3 and 4 * 5?"}]
        while True:
            message = (
                (await client.chat.completions.create(model="any", messages=messages, tools=TOOLS)).choices[0].message
            )
            seen.append(message)
            messages.append(message)
            if not message.tool_calls:
                return 1.0
            for call in reversed(message.tool_calls):  # answered in any order, matched by id
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call.id,
                        "content": calculate(json.loads(call.function.arguments)["expression"]),
                    }
                )

    two = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2 + 3"}}},
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "4 * 5"}}},
        ],
    }
    done = {"role": "assistant", "content": "They are 5 and 20."}
    engine = engine_for(model, fmt)
    env = HarnessEnvironment(parallel_agent)

    async def main():
        return await engine.run_episode(env, {"question": "q"}, 0, turns=scripted(fmt, [two, done]))

    t = anyio.run(main)
    assert t.ok, t.error
    first = seen[0]
    assert first.tool_calls is not None and [json.loads(c.function.arguments) for c in first.tool_calls] == [
        {"expression": "2 + 3"},
        {"expression": "4 * 5"},
    ]
    assert len({c.id for c in first.tool_calls}) == 2
    turn = t.turns[0]
    assert turn.bridge == "proven" and [r.kind for r in turn.tool_records] == ["ok", "ok"]
    assert [m["content"] for m in turn.env_messages] == ["20", "5"]
    assert [m["name"] for m in turn.env_messages] == ["calculator", "calculator"]
    assert seen[1].content == "They are 5 and 20." and t.reward == 1.0
    # One sample: the transcript's render is the trajectory's token sequence.
    assert fmt.decode(t.samples[0].ids) == fmt.render_text(t.messages, TOOLS, add_generation_prompt=False).rstrip("\n")


def test_64_concurrent_harness_episodes(model, fmt):
    env = HarnessEnvironment(functools.partial(agent, max_turns=2), datasets=CalculatorEnv())
    engine = engine_for(model, fmt, max_concurrent_episodes=64, max_tokens_per_turn=40)
    batch = tasks(64)
    groups = run(engine, env, batch)
    trajs = [g.trajectories[0] for g in groups]
    assert all(t.ok for t in trajs), [t.error for t in trajs if not t.ok]
    # Each episode is its own conversation: its own question, never another's turns.
    assert [t.messages[0]["content"] for t in trajs] == [task["question"] for task in batch]
    assert all(t.splits == 0 for t in trajs)
    assert env.stats["requests"] == sum(len(t.turns) for t in trajs) == len(engine.generator.calls)
    own = env.endpoint_seconds()  # the server's own time per request, the wait for sampling left out
    assert len(own) == env.stats["requests"] and all(0 <= s < 5 for s in own)


async def hanging_agent(task, client):
    await client.chat.completions.create(model="any", messages=[{"role": "user", "content": task["question"]}])
    await asyncio.sleep(3600)


async def crashing_agent(task, client):
    await client.chat.completions.create(model="any", messages=[{"role": "user", "content": task["question"]}])
    raise KeyError("the harness's own bug")


async def silent_agent(task, client):
    await asyncio.sleep(3600)


def test_hung_and_crashing_harnesses_end_their_episode_with_a_recorded_error(model, fmt):
    engine = engine_for(model, fmt, max_tokens_per_turn=24)
    batch = tasks(2)

    async def main():
        envs = {
            "hung": HarnessEnvironment(hanging_agent, request_timeout_s=0.5),
            "silent": HarnessEnvironment(silent_agent, request_timeout_s=0.5),
            "crash": HarnessEnvironment(crashing_agent),
            "slow_whole": HarnessEnvironment(hanging_agent, request_timeout_s=60, episode_timeout_s=1.0),
            "good": HarnessEnvironment(following_agent),
        }
        out = {}
        try:
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    for name, env in envs.items():

                        async def one(name=name, env=env):
                            out[name] = await engine.run(env, batch)

                        tg.start_soon(one)
        finally:
            await engine.generator.close()
        return out, envs

    out, envs = anyio.run(main)
    trajs = {name: [g.trajectories[0] for g in groups] for name, groups in out.items()}
    assert all(t.ok for t in trajs["good"])
    for t in trajs["hung"]:
        assert t.finish_reason == "error" and "request_timeout_s=0.5" in t.error and "hung" in t.error
    for t in trajs["silent"]:
        assert "its first request" in t.error
    for t in trajs["crash"]:
        assert "raised KeyError" in t.error and "own bug" in t.error and len(t.turns) == 1
    for t in trajs["slow_whole"]:
        assert "episode_timeout_s=1" in t.error
    assert envs["crash"].stats["harness_errors"] == 2 and envs["hung"].stats["timeouts"] == 2


def test_refused_requests_are_openai_errors_the_harness_can_recover_from(model, fmt):
    errors: list[str] = []

    async def clumsy_agent(task, client):
        messages = [{"role": "user", "content": task["question"]}]
        for bad in (
            {"stream": True},
            {"n": 2},
            {"tool_choice": "required", "tools": TOOLS},
            {"frequency_penalty": 0.5},
        ):
            try:
                await client.chat.completions.create(model="any", messages=messages, **bad)
            except openai.BadRequestError as exc:
                errors.append(exc.message)
        try:
            await client.chat.completions.create(model="any", messages=[{"role": "wizard", "content": "x"}])
        except openai.BadRequestError as exc:
            errors.append(exc.message)
        r = await client.chat.completions.create(model="any", messages=messages, max_tokens=8)
        return 0.5 if r.choices[0].message.role == "assistant" else 0.0

    engine = engine_for(model, fmt)
    env = HarnessEnvironment(clumsy_agent)
    [group] = run(engine, env, tasks(1))
    [t] = group.trajectories
    assert len(errors) == 5 and env.stats["rejected"] == 5
    assert (
        "stream" in errors[0] and "n=2" in errors[1] and "tool_choice" in errors[2] and "frequency_penalty" in errors[3]
    )
    assert "role" in errors[4]
    assert t.ok and len(t.turns) == 1 and t.turns[0].num_sampled <= 8


async def post(url: str, body: bytes, token: str | None, method: str = "POST") -> tuple[int, dict]:
    """One raw HTTP/1.1 request (the stdlib only), so the server is tested at the byte level."""
    rest = url.split("://", 1)[1]
    host, path = rest.split("/", 1)
    reader, writer = await asyncio.open_connection(*host.split(":"))
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    writer.write(
        f"{method} /{path} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
    )
    if len(body) < 1024 * 1024:  # a body over the limit is refused from its headers: never sent
        writer.write(body)
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, payload = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


def test_access_token_body_limit_and_unknown_episodes(model, fmt):
    results: dict = {}

    async def probing_agent(task, endpoint):
        url = endpoint.base_url + "/chat/completions"
        body = json.dumps({"model": "x", "messages": [{"role": "user", "content": "hi"}]}).encode()
        results["no_token"] = (await post(url, body, None))[0]
        results["bad_token"] = (await post(url, body, "nope"))[0]
        results["too_big"] = (await post(url, b"x" * (2 * 1024 * 1024), endpoint.api_key))[0]
        other = url.replace(endpoint.base_url.split("/")[4], "not-an-episode")
        results["unknown"] = (await post(other, body, endpoint.api_key))[0]
        results["garbage"] = (await post(url, b"{not json", endpoint.api_key))[0]
        results["models"] = (await post(endpoint.base_url + "/models", b"", endpoint.api_key, "GET"))[1]["data"][0][
            "id"
        ]
        assert endpoint.base_url.startswith("http://127.0.0.1:")
        status, reply = await post(url, body, endpoint.api_key)
        results["ok"] = status, reply.get("object"), reply["choices"][0]["message"]["role"] if status == 200 else reply
        return 1.0

    engine = engine_for(model, fmt)
    env = HarnessEnvironment(probing_agent, max_body_mb=1)
    [group] = run(engine, env, tasks(1))
    assert group.trajectories[0].ok, group.trajectories[0].error
    assert results == {
        "no_token": 401,
        "bad_token": 401,
        "too_big": 413,
        "unknown": 404,
        "garbage": 400,
        "models": "agentrl-policy",
        "ok": (200, "chat.completion", "assistant"),
    }


def test_max_tokens_cuts_the_episode_and_the_harness_is_told(model, fmt):
    seen: list = []

    async def capped_agent(task, client):
        try:
            await client.chat.completions.create(
                model="any", messages=[{"role": "user", "content": task["question"]}], max_tokens=1
            )
        except openai.BadRequestError as exc:
            seen.append(exc.code)
        return {"tried": 1.0, "reward": 0.25}

    engine = engine_for(model, fmt)
    [group] = run(engine, HarnessEnvironment(capped_agent), tasks(1))
    [t] = group.trajectories
    assert t.ok and t.turns[0].num_sampled == 1 and t.truncated and t.finish_reason in ("length", "max_tokens")
    assert seen == ["context_length_exceeded"] and t.reward == 0.25 and t.rewards["tried"] == 1.0


def test_stop_strings_cut_the_reply_where_the_api_would(model, fmt):
    replies: list = []

    async def stopping_agent(task, client):
        r = await client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": task["question"]}], tools=TOOLS, stop=["calculator"]
        )
        replies.append(r.choices[0])
        return 0.0

    engine = engine_for(model, fmt)
    groups = run(engine, HarnessEnvironment(stopping_agent), tasks(4))
    calls = {tuple(prompt): gen for prompt, gen in engine.generator.calls}
    cut = 0
    for t in (g.trajectories[0] for g in groups):
        assert t.ok, t.error
        gen = calls[tuple(t.samples[0].prompt_ids)]
        sampled = t.samples[0].completion_ids
        if "calculator" in fmt.decode(gen.token_ids):  # cut right after the token that completes the stop string
            cut += 1
            assert sampled == gen.token_ids[: len(sampled)] and len(sampled) < len(gen.token_ids)
            assert "calculator" in fmt.decode(sampled) and "calculator" not in fmt.decode(sampled[:-1])
        else:
            assert sampled == gen.token_ids
    assert cut >= 2  # the bundled model writes its call's name nearly always
    assert all("calculator" not in (r.message.content or "") and r.finish_reason == "stop" for r in replies)


def test_rewards_from_the_transcript_and_from_the_harness():
    assert harness_reward(1, False) == (1.0, {"harness": 1.0})
    assert harness_reward({"a": 1.0, "b": 0.5}, False) == (1.5, {"a": 1.0, "b": 0.5})
    assert harness_reward({"reward": 2.0, "a": 1.0}, False) == (2.0, {"a": 1.0})
    for bad in ("1", [1.0], float("nan"), {"a": "x"}):
        with pytest.raises(HarnessError):
            harness_reward(bad, False)
    with pytest.raises(HarnessError, match="no reward functions"):
        harness_reward(None, False)
    assert harness_reward(None, True) == (0.0, {})


def test_transcript_rewards_score_the_episode(model, fmt):
    async def quiet_agent(task, client):
        await agent(task, client)
        return None

    def answered(completion: str, answer: str) -> float:
        return correct(completion, answer)

    engine = engine_for(model, fmt)
    groups = run(engine, HarnessEnvironment(quiet_agent, datasets=CalculatorEnv(), rewards=[answered]), tasks(3))
    for t in (g.trajectories[0] for g in groups):
        assert t.ok and "harness" not in t.rewards
        assert t.rewards["answered"] == correct(t.messages[-1]["content"], t.task["answer"]) == t.reward


def test_bad_harness_definitions_are_config_errors():
    def sync(task, client):
        return 1.0

    async def odd(task, client, budget):
        return 1.0

    with pytest.raises(ConfigError, match="async"):
        HarnessEnvironment(sync)
    with pytest.raises(ConfigError, match="budget"):
        HarnessEnvironment(odd)
    with pytest.raises(ConfigError, match="request_timeout_s"):
        HarnessEnvironment(agent, request_timeout_s=0)


def test_the_server_lives_as_long_as_its_episodes():
    """No model: reset and step by hand, as the engine does; a second reset ends the first episode."""

    async def main():
        env = HarnessEnvironment(following_agent, request_timeout_s=5)
        messages, _ = await env.reset({"question": "What is 2 + 3?"})
        assert messages == [{"role": "user", "content": "What is 2 + 3?"}] and len(env._hub.servers) == 1
        env._ep.usage = (10, 3)
        step = await env.step({"role": "assistant", "content": "5"})
        assert step.messages == [{"role": "user", "content": "Are you sure?"}] and not step.terminated
        await env.reset({"question": "again"})  # the first episode is closed, its harness cancelled
        assert len(env._hub.episodes) == 1 and env._hub.servers[asyncio.get_running_loop()][1] == 1
        await env.close()
        assert not env._hub.servers and not env._hub.episodes and not env._hub.http_clients

    anyio.run(main)


def test_the_wire_shape_of_replies_and_requests():
    from agentrl.env.harness_openai import RequestError, canonical, completion, parse_request

    turn = {
        "role": "assistant",
        "content": "",
        "reasoning_content": "think",
        "tool_calls": [
            {
                "id": "call_0_0",
                "type": "function",
                "function": {"name": "calculator", "arguments": {"expression": "2 + 3"}},
            }
        ],
    }
    reply = completion(turn, "stop", "m", 7, 5)
    wire = reply["choices"][0]["message"]
    assert reply["choices"][0]["finish_reason"] == "tool_calls" and reply["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 5,
        "total_tokens": 12,
    }
    assert wire == {
        "role": "assistant",
        "content": None,
        "reasoning_content": "think",
        "tool_calls": [
            {
                "id": "call_0_0",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "2 + 3"}'},
            }
        ],
    }
    # Sent back re-serialised (other key order, no reasoning, SDK extras): the same message.
    back = {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": [
            {
                "id": "call_0_0",
                "type": "function",
                "function": {"arguments": '{ "expression":"2 + 3" }', "name": "calculator"},
            }
        ],
    }
    [parsed] = parse_request({"messages": [back]}).messages
    assert canonical(parsed) == canonical(turn)
    edited = {
        **back,
        "tool_calls": [
            {
                "id": "call_0_0",
                "type": "function",
                "function": {"arguments": '{"expression": "2 + 4"}', "name": "calculator"},
            }
        ],
    }
    assert canonical(parse_request({"messages": [edited]}).messages[0]) != canonical(turn)
    request = parse_request(
        {
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
            ],
            "stop": "x",
            "max_completion_tokens": 9,
        }
    )
    assert (
        request.messages == [{"role": "system", "content": "ab"}] and request.stop == ["x"] and request.max_tokens == 9
    )
    for bad, param in (
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "wat": 1}, "wat"),
    ):
        with pytest.raises(RequestError) as err:
            parse_request(bad)
        assert err.value.param == param


def test_reset_under_short_lived_loops_as_the_preflight_check_does():
    """`agentrl train`'s preflight resets the environment under one `anyio.run` per task and never closes
    it: each reset must release what the episode of an ended loop held (a KeyError before)."""
    env = HarnessEnvironment(following_agent, request_timeout_s=5)
    for i in range(2):
        messages, _ = anyio.run(functools.partial(env.reset, task={"question": f"q{i}"}, seed=i))
        assert messages == [{"role": "user", "content": f"q{i}"}]
    assert len(env._hub.servers) == 1  # the first loop's server is gone, the second's held by its episode
    anyio.run(env.close)
    assert not env._hub.servers and not env._hub.episodes
