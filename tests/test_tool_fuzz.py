"""Fuzz: a hostile tool set through ``ToolEnvironment.step`` never raises (issue 17).

Tools that raise every kind of exception (BaseExceptions included), hang (sync and async), return
huge, deeply nested, non-JSON or hostile ``str`` values, plus malformed calls, mixed at random into
turns. Each step must answer every call with exactly one capped ``tool`` message, in order. Hung
calls time out after a few tens of milliseconds, so the whole run takes seconds.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import anyio
import pytest

from agentrl import ToolEnvironment, tool
from agentrl.env.tool import ToolError

CAP = 500
MARKER_ROOM = 60  # "\n[... output truncated: N more characters]"
RELEASE = threading.Event()


class LyingStr(str):
    def __str__(self) -> str:
        raise KeyboardInterrupt("hostile __str__")

    def __len__(self) -> int:
        return -1

    def __iter__(self):
        raise SystemExit("hostile __iter__")


class HugeLen(str):
    def __len__(self) -> int:
        return 10**30


class BadExc(Exception):
    def __str__(self) -> str:
        return LyingStr("nested lie")


class WorseExc(Exception):
    def __str__(self) -> str:
        raise GeneratorExit


class Opaque:
    def __str__(self) -> str:
        raise RuntimeError("opaque")

    def __repr__(self) -> str:
        raise RuntimeError("opaque")


def _deep(n: int, kind: str) -> Any:
    out: Any = []
    for _ in range(n):
        out = [out] if kind == "list" else {"k": out}
    return out


def _behaviour(kind: str, rng: random.Random) -> Any:
    if kind == "ok":
        return "fine"
    if kind == "huge":
        return "h" * rng.choice([CAP + 1, 100_000, 3_000_000])
    if kind == "deep_list":
        return _deep(rng.choice([900, 5000, 50_000]), "list")
    if kind == "deep_dict":
        return _deep(rng.choice([900, 5000, 50_000]), "dict")
    if kind == "lying_str":
        return LyingStr("L" * rng.randint(0, 2 * CAP))
    if kind == "huge_len":
        return HugeLen("x")
    if kind == "opaque":
        return Opaque()
    if kind == "weird_types":
        return rng.choice([b"bytes", {1, 2}, 1 + 2j, float("nan"), float("inf"), 10**5000, {"k": Opaque()}, {(1, 2): 3}, [LyingStr("a")], object, print])
    if kind == "tool_error":
        raise ToolError(rng.choice(["short", "t" * 1_000_000, LyingStr("x"), Opaque()]))
    if kind == "bad_exc":
        raise rng.choice([BadExc(), WorseExc(), RuntimeError("r" * 2_000_000), RecursionError("deep"), MemoryError()])
    if kind == "base_exc":
        raise rng.choice([SystemExit(3), KeyboardInterrupt(), GeneratorExit(), asyncio.CancelledError(), StopIteration(), BaseException("base")])
    raise AssertionError(kind)


KINDS = ["ok", "huge", "deep_list", "deep_dict", "lying_str", "huge_len", "opaque", "weird_types", "tool_error", "bad_exc", "base_exc"]


def make_tools(rng: random.Random) -> list:
    def sync_tool(kind: str) -> Any:
        """A sync tool that misbehaves as asked.

        Args:
            kind: The misbehaviour.
        """
        if kind == "hang":
            RELEASE.wait()
        return _behaviour(kind, rng)

    async def async_tool(kind: str) -> Any:
        """An async tool that misbehaves as asked.

        Args:
            kind: The misbehaviour.
        """
        if kind == "hang":
            await anyio.sleep(3600)
        if kind == "swallow_cancel":
            try:
                await anyio.sleep(3600)
            except BaseException:  # swallows our timeout once, then returns garbage
                return Opaque()
        return _behaviour(kind, rng)

    return [
        tool(sync_tool, timeout=0.05, max_output_chars=CAP, max_concurrency=4),
        tool(async_tool, timeout=0.05, max_output_chars=CAP, max_concurrency=4),
    ]


def random_call(rng: random.Random, i: int) -> Any:
    name = rng.choice(["sync_tool", "async_tool", "async_tool", "sync_tool", "missing", "x" * 5000])
    kind = rng.choice([*KINDS, "hang", "swallow_cancel"])
    roll = rng.random()
    if roll < 0.05:
        return rng.choice([None, "not a call", 42, ["list"], {"function": "string"}, {"function": {"name": None}}])
    if roll < 0.10:
        return {"id": f"c{i}", "function": {"name": name, "arguments": rng.choice(["{bad json", "[" * 5000, "", "null", '{"kind": 1}'])}}
    if roll < 0.13:
        return {"id": f"c{i}", "function": {"name": name, "arguments": {"kind": kind, "extra": 1}}}
    return {"type": "function", "id": f"c{i}", "function": {"name": name, "arguments": {"kind": kind}}}


async def fuzz(steps: int, seed: int) -> int:
    rng = random.Random(seed)
    env = ToolEnvironment(tools=make_tools(rng), datasets={"train": [{"question": "q"}]}, max_turns=10**9)
    answered = 0
    await env.reset(task={"question": "q"}, seed=seed)
    for _ in range(steps):
        calls = [random_call(rng, i) for i in range(rng.randint(1, 6))]
        if rng.random() < 0.02:
            calls = rng.choice(["a string", {"function": {"name": "sync_tool"}}])  # not a list at all
        message = {"role": "assistant", "content": "", "tool_calls": calls}
        messages, reward, terminated, truncated, info = await env.step(message)
        expected = len(calls) if isinstance(calls, list) else 1
        assert len(messages) == expected == len(info["tool_records"])
        for msg, call in zip(messages, calls if isinstance(calls, list) else [calls]):
            assert msg["role"] == "tool" and type(msg["content"]) is str
            assert len(msg["content"]) <= CAP + MARKER_ROOM
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                assert msg.get("tool_call_id") == call["id"]
        answered += len(messages)
    return answered


def test_hostile_tool_set_never_makes_step_raise():
    RELEASE.clear()
    try:
        t0 = time.perf_counter()
        answered = anyio.run(fuzz, 150, 0)
        assert answered > 300
        assert time.perf_counter() - t0 < 60  # bounded: every hang is cut at 0.05 s
    finally:
        RELEASE.set()


@pytest.mark.slow
def test_hostile_tool_set_soak():
    RELEASE.clear()
    try:
        for seed in range(2, 12):
            anyio.run(fuzz, 1000, seed)
    finally:
        RELEASE.set()
