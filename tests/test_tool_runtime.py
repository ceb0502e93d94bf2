"""The tool runtime under abuse: hung tools, the slot wait, process exit, capped error texts,
hostile results and every BaseException a tool can raise (issue 17, items 6 and 7)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time

import anyio
import pytest

from agentrl import ToolEnvironment, dispatch, tool
from agentrl.core.messages import ToolCall
from agentrl.env.tool import Tool, ToolError

RELEASE = threading.Event()  # set at the end of each test so hung worker threads end


@pytest.fixture(autouse=True)
def _release_hung_threads():
    RELEASE.clear()
    yield
    RELEASE.set()


def hang(x: int) -> str:
    """Blocks until the test ends.

    Args:
        x: Ignored.
    """
    RELEASE.wait()
    return "late"


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First.
        b: Second.
    """
    return a + b


def test_hung_tools_do_not_starve_an_unrelated_tool():
    # 2 tools x 32 hung calls = 64 threads blocked forever: more than a shared 40-thread pool has.
    hung_a = tool(hang, name="hung_a", timeout=3.0)
    hung_b = tool(hang, name="hung_b", timeout=3.0)
    calc = tool(add, timeout=1.0)
    tools = {"hung_a": hung_a, "hung_b": hung_b, "add": calc}

    async def main():
        calls = [ToolCall(n, {"x": i}) for i in range(32) for n in ("hung_a", "hung_b")]
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatch, calls, tools)
            await anyio.sleep(0.3)  # the hung calls hold their threads now
            t0 = time.perf_counter()
            [res] = await dispatch([ToolCall("add", {"a": 2, "b": 3})], tools)
            took = time.perf_counter() - t0
            RELEASE.set()
        return res, took

    res, took = anyio.run(main)
    assert res.record.kind == "ok" and res.message["content"] == "5", res.message
    assert took < 1.0


def test_waiting_for_a_slot_counts_toward_the_timeout():
    hung = tool(hang, timeout=0.4, max_concurrency=1)
    t0 = time.perf_counter()
    results = anyio.run(dispatch, [ToolCall("hang", {"x": i}) for i in range(4)], {"hang": hung})
    took = time.perf_counter() - t0
    assert [r.record.kind for r in results] == ["timeout"] * 4
    # one at a time after each other would be 4 x 0.4 s; the slot wait is inside each call's 0.4 s
    assert took < 1.2
    assert "slots are held by earlier calls" in results[-1].message["content"]


class _Nap(Tool):
    """An async tool whose every call takes 0.3 s."""

    name = "nap"
    timeout = 0.5
    max_concurrency = 1

    async def run(self, x: int) -> str:
        """Sleep.

        Args:
            x: Ignored.
        """
        await anyio.sleep(0.3)
        return "rested"


@pytest.mark.parametrize("counts_queue, kinds", [(True, ["ok", "timeout", "timeout", "timeout"]), (False, ["ok"] * 4)])
def test_an_async_tool_can_start_its_clock_at_its_slot(counts_queue, kinds):
    """Four 0.3 s calls at one slot and a 0.5 s timeout: counting the queue times out all but the first
    (the second would end at 0.6 s); starting the clock at the slot lets every call finish."""
    nap = _Nap()
    nap.timeout_includes_queue = counts_queue
    results = anyio.run(dispatch, [ToolCall("nap", {"x": i}) for i in range(4)], {"nap": nap})
    assert [r.record.kind for r in results] == kinds
    assert all(r.message["content"] == "rested" for r in results if r.record.kind == "ok")


def test_a_hung_tool_keeps_its_slot_until_its_thread_ends():
    hung = tool(hang, timeout=0.2, max_concurrency=2)
    [a, b] = anyio.run(dispatch, [ToolCall("hang", {"x": 0}), ToolCall("hang", {"x": 1})], {"hang": hung})
    assert a.record.kind == b.record.kind == "timeout"
    assert hung.thread_budget().live == 2  # abandoned, not forgotten: no third thread can start
    RELEASE.set()
    deadline = time.time() + 5
    while hung.thread_budget().live and time.time() < deadline:
        time.sleep(0.01)
    assert hung.thread_budget().live == 0


def test_process_exits_after_a_hung_sync_tool(tmp_path):
    script = tmp_path / "hung.py"
    script.write_text(textwrap.dedent('''
        import threading, anyio
        from agentrl import dispatch, tool
        from agentrl.core.messages import ToolCall

        def stuck(x: int) -> str:
            """Never returns.

            Args:
                x: Ignored.
            """
            threading.Event().wait()

        [res] = anyio.run(dispatch, [ToolCall("stuck", {"x": 1})], {"stuck": tool(stuck, timeout=0.2)})
        print(res.record.kind, flush=True)
    '''))
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    took = time.perf_counter() - t0
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "timeout"
    assert took < 30  # imports take a few seconds; a non-daemon hung thread would block exit forever


# -- capped error texts and hostile results ----------------------------------------------------


def huge_error(kind: str) -> str:
    """Fails with a 5 MB message.

    Args:
        kind: "plain" for RuntimeError, "tool" for ToolError.
    """
    text = "e" * 5_000_000
    raise ToolError(text) if kind == "tool" else RuntimeError(text)


@pytest.mark.parametrize("kind", ["plain", "tool"])
def test_error_texts_obey_the_output_cap(kind):
    t = tool(huge_error, max_output_chars=100)
    [res] = anyio.run(dispatch, [ToolCall("huge_error", {"kind": kind})], {"huge_error": t})
    assert res.record.kind == "error"
    assert len(res.message["content"]) < 200 and "output truncated" in res.message["content"]
    assert len(res.record.detail) < 200


def test_unknown_tool_message_is_capped():
    tools = {f"tool_{i:05d}": tool(add, name=f"tool_{i:05d}") for i in range(2000)}
    [res] = anyio.run(dispatch, [ToolCall("x" * 100_000, {})], tools)
    assert res.record.kind == "unknown_tool" and len(res.message["content"]) < 4200
    assert len(res.message["name"]) <= 200 and len(res.record.tool) <= 200


class EvilStr(str):
    def __str__(self):
        raise RuntimeError("no str for you")

    def __len__(self):
        raise RuntimeError("no len for you")

    def __getitem__(self, item):
        raise RuntimeError("no slicing for you")


class EvilExc(Exception):
    def __str__(self):
        raise SystemExit("hostile __str__")


def deep(n: int) -> list:
    out: list = []
    for _ in range(n):
        out = [out]
    return out


def make_hostile(kind: str):
    def hostile(x: int):
        """Returns or raises something nasty.

        Args:
            x: Ignored.
        """
        if kind == "deep":
            return deep(100_000)
        if kind == "evil_str":
            return EvilStr("y" * 10_000)
        if kind == "evil_exc":
            raise EvilExc()
        if kind == "evil_str_error":
            raise ToolError(EvilStr("z"))
        if kind == "huge_int":
            return 10**100_000
        raise {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt, "GeneratorExit": GeneratorExit}[kind]("raised by the tool")

    return hostile


KINDS = ["deep", "evil_str", "evil_exc", "evil_str_error", "huge_int", "SystemExit", "KeyboardInterrupt", "GeneratorExit"]


def _env_for(fn, *, is_async: bool) -> ToolEnvironment:
    if is_async:
        sync_fn = fn

        async def hostile(x: int):
            """Returns or raises something nasty.

            Args:
                x: Ignored.
            """
            return sync_fn(x)

        fn = hostile
    return ToolEnvironment(tools=[tool(fn, name="hostile", max_output_chars=300)], datasets={"train": [{"question": "q"}]})


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("kind", KINDS)
def test_hostile_results_and_base_exceptions_become_tool_messages(kind, is_async):
    env = _env_for(make_hostile(kind), is_async=is_async).sync()
    env.reset(task={"question": "q"}, seed=0)
    msg = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {"name": "hostile", "arguments": {"x": 1}}}]}
    messages, reward, terminated, truncated, info = env.step(msg)
    [m] = messages
    assert type(m["content"]) is str and len(m["content"]) <= 400 and m["tool_call_id"] == "c1"
    if kind == "evil_str":  # its text is read without calling its methods, then cut to the cap
        assert m["content"].startswith("yyy") and info["tool_records"][0].kind == "oversized"
        return
    assert m["content"].startswith("Error")
    assert info["tool_records"][0].kind in ("error", "bad_output")
    if kind in ("SystemExit", "KeyboardInterrupt", "GeneratorExit"):
        assert kind in m["content"]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="telling a tool's own CancelledError from a real one needs Task.cancelling()")
def test_an_async_tool_that_raises_cancelled_error_still_answers():
    async def flaky(x: int) -> str:
        """Its own inner work was cancelled.

        Args:
            x: Ignored.
        """
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        loop.call_soon(fut.cancel)
        await fut  # raises CancelledError, though nobody cancelled this call
        return "unreachable"

    results = anyio.run(dispatch, [ToolCall("flaky", {"x": 1}, id="a"), ToolCall("add", {"a": 1, "b": 1}, id="b")], {"flaky": tool(flaky), "add": tool(add)})
    assert [r.message["tool_call_id"] for r in results] == ["a", "b"]
    assert results[0].record.kind == "error" and "CancelledError" in results[0].message["content"]
    assert results[1].message["content"] == "2"


def test_a_real_cancellation_of_the_run_still_cancels():
    async def slow(x: int) -> str:
        """Takes a while.

        Args:
            x: Ignored.
        """
        await anyio.sleep(10)
        return "done"

    async def main():
        with anyio.move_on_after(0.2) as scope:
            await dispatch([ToolCall("slow", {"x": 1})], {"slow": tool(slow, timeout=30)})
        return scope.cancelled_caught

    t0 = time.perf_counter()
    assert anyio.run(main) is True
    assert time.perf_counter() - t0 < 5
