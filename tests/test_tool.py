"""@tool / Tool: schemas, validation, and every failure kind becoming a readable tool message."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Literal

import anyio
import pytest
from transformers.utils import get_json_schema

from agentrl import Tool, ToolDefinitionError, dispatch, tool
from agentrl.core.messages import ToolCall


def add(a: int, b: float = 1.5) -> float:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def search(query: str, k: int = 3, mode: Literal["fast", "exact"] = "fast", tags: list[str] | None = None) -> list[str]:
    """Search a corpus.

    Args:
        query: What to look for.
        k: How many results.
        mode: Search mode.
        tags: Optional tags to filter on.
    """
    return [query] * k


@pytest.mark.parametrize("fn", [add, search])
def test_schema_agrees_with_transformers_get_json_schema(fn):
    ours = tool(fn).schema
    theirs = get_json_schema(fn)
    # Only difference, by design: get_json_schema adds a non-OpenAI "return" entry, which chat
    # templates would otherwise render to the model; we drop it.
    theirs["function"].pop("return", None)
    assert ours == theirs


def test_schema_shape_and_async_tool():
    @tool
    async def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: The key.
        """
        return key

    schema = lookup.schema
    assert schema["type"] == "function"
    assert schema["function"]["name"] == "lookup"
    assert schema["function"]["parameters"]["required"] == ["key"]
    assert lookup.is_async


def test_injected_arguments_are_hidden_and_filled():
    @tool(injected=("state",))
    def remember(fact: str, state: dict) -> str:
        """Remember a fact.

        Args:
            fact: The fact.
            state: Episode state (injected).
        """
        state.setdefault("facts", []).append(fact)
        return "ok"

    assert list(remember.schema["function"]["parameters"]["properties"]) == ["fact"]
    state: dict = {}
    [res] = anyio.run(dispatch, [ToolCall("remember", {"fact": "sky"})], {"remember": remember}, {"state": state})
    assert res.record.kind == "ok" and state == {"facts": ["sky"]}
    # The model cannot smuggle the hidden argument in.
    [res] = anyio.run(dispatch, [ToolCall("remember", {"fact": "x", "state": {}})], {"remember": remember}, {"state": state})
    assert res.record.kind == "bad_args" and "state" in res.message["content"]


def test_definition_errors_are_clear():
    def undocumented(x: int) -> int:
        """Does something.

        Args:
            x: a number
        """
        return x

    def no_hint(x) -> int:  # type: ignore[no-untyped-def]
        """Does something.

        Args:
            x: a number
        """
        return x

    def no_doc(x: int) -> int:
        return x

    tool(undocumented)  # fine
    for fn in (no_hint, no_doc):
        with pytest.raises(ToolDefinitionError, match=fn.__name__):
            tool(fn)
    with pytest.raises(ToolDefinitionError, match="injected"):
        tool(undocumented, injected=("missing",))


def test_validation_coerces_and_rejects():
    t = tool(add)
    assert t.validate({"a": "3"}) == {"a": 3, "b": 1.5}
    with pytest.raises(Exception):
        t.validate({"a": "three"})
    with pytest.raises(Exception):
        t.validate({"a": 1, "c": 2})


class Counter(Tool):
    """A stateful, configurable tool."""

    name = "counter"

    def __init__(self, step: int) -> None:
        self.step = step
        self.total = 0

    def run(self, times: int) -> int:
        """Increase the counter.

        Args:
            times: How many steps to add.
        """
        self.total += self.step * times
        return self.total


def test_tool_subclass():
    c = Counter(step=2)
    assert c.schema["function"]["name"] == "counter"
    [res] = anyio.run(dispatch, [{"type": "function", "function": {"name": "counter", "arguments": '{"times": 3}'}}], {"counter": c})
    assert res.message["content"] == "6" and res.record.kind == "ok"


# -- failure kinds ---------------------------------------------------------------------------


def boom(x: int) -> str:
    """Always fails.

    Args:
        x: Ignored.
    """
    raise RuntimeError("disk on fire")


def sleepy(seconds: float) -> str:
    """Sleeps in a thread.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "awake"


async def async_sleepy(seconds: float) -> str:
    """Sleeps asynchronously.

    Args:
        seconds: How long.
    """
    await anyio.sleep(seconds)
    return "awake"


def chatty(n: int) -> str:
    """Talks a lot.

    Args:
        n: How many characters.
    """
    return "x" * n


def weird(x: int) -> object:
    """Returns something that is not text.

    Args:
        x: Ignored.
    """
    return object()


TOOLS = {
    "boom": tool(boom),
    "sleepy": tool(sleepy, timeout=0.2),
    "async_sleepy": tool(async_sleepy, timeout=0.2),
    "chatty": tool(chatty, max_output_chars=50),
    "weird": tool(weird),
    "add": tool(add),
}


@pytest.mark.parametrize(
    "call, kind, text",
    [
        (ToolCall("boom", {"x": 1}, id="c1"), "error", "RuntimeError: disk on fire"),
        (ToolCall("sleepy", {"seconds": 5}), "timeout", "timed out after 0.2 s"),
        (ToolCall("async_sleepy", {"seconds": 5}), "timeout", "timed out after 0.2 s"),
        (ToolCall("nope", {}), "unknown_tool", "unknown tool 'nope'"),
        (ToolCall("add", None, raw_arguments='{"a": 1,', error="bad_json"), "bad_json", "not a valid JSON object"),
        ({"function": {"name": "add", "arguments": "{oops"}}, "bad_json", "not a valid JSON object"),
        (ToolCall("add", {"a": "seven"}), "bad_args", "a: Input should be a valid integer"),
        (ToolCall("add", {}), "bad_args", "a: Field required"),
        (ToolCall("chatty", {"n": 500}), "oversized", "[... output truncated: 450 more characters]"),
        (ToolCall("weird", {"x": 1}), "bad_output", "unreadable result"),
    ],
)
def test_every_failure_becomes_a_tool_message(call, kind, text):
    [res] = anyio.run(dispatch, [call], TOOLS)
    assert res.record.kind == kind
    assert res.message["role"] == "tool"
    assert text in res.message["content"]
    assert res.message["content"].startswith("Error") or kind == "oversized"
    assert res.record.latency_s >= 0
    assert res.record.tool == (call.name if isinstance(call, ToolCall) else "add")


def test_calls_of_one_turn_run_concurrently_and_keep_order():
    started: list[str] = []

    async def slow(tag: str) -> str:
        """Waits a bit.

        Args:
            tag: A label.
        """
        started.append(tag)
        await anyio.sleep(0.3)
        return tag

    tools = {"slow": tool(slow)}
    calls = [ToolCall("slow", {"tag": str(i)}) for i in range(5)]
    t0 = time.perf_counter()
    results = anyio.run(dispatch, calls, tools)
    elapsed = time.perf_counter() - t0
    assert [r.message["content"] for r in results] == ["0", "1", "2", "3", "4"]
    assert elapsed < 1.2  # 5 x 0.3 s sequential would be 1.5 s


def test_concurrency_limit_is_respected():
    active = 0
    peak = 0
    lock = threading.Lock()

    def busy(i: int) -> int:
        """Busy work.

        Args:
            i: Index.
        """
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        time.sleep(0.05)
        with lock:
            active -= 1
        return i

    t = tool(busy, max_concurrency=2)
    anyio.run(dispatch, [ToolCall("busy", {"i": i}) for i in range(8)], {"busy": t})
    assert peak == 2


def test_blocking_sync_tool_does_not_freeze_the_loop():
    ticks: list[float] = []

    async def main() -> None:
        async def ticker() -> None:
            for _ in range(5):
                ticks.append(time.perf_counter())
                await anyio.sleep(0.02)

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            tg.start_soon(dispatch, [ToolCall("sleepy", {"seconds": 0.15})], {"sleepy": tool(sleepy)})

    asyncio.run(main())
    assert len(ticks) == 5 and ticks[-1] - ticks[0] < 0.15
