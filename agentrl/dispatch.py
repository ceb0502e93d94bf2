"""Run the tool calls of one assistant turn: concurrently, bounded, and never raising.

Every outcome — success, exception, timeout, unknown tool, invalid JSON, invalid arguments,
oversized or unserialisable output — becomes a ``tool`` message the model can read plus a typed
``ToolRecord`` for metrics. A sync tool runs in a worker thread so it cannot freeze the event loop;
a hung sync tool is abandoned at its timeout (the thread cannot be killed, but the episode moves on).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

import anyio
import pydantic

from agentrl.chat.types import ToolCall
from agentrl.tool import Tool, ToolError

Outcome = Literal["ok", "error", "timeout", "unknown_tool", "bad_json", "bad_args", "oversized", "bad_output"]
FAILURES: frozenset[str] = frozenset({"error", "timeout", "unknown_tool", "bad_json", "bad_args", "bad_output"})
# Failures that mean the model wrote a broken call (as opposed to a tool failing on a good call).
MALFORMED: frozenset[str] = frozenset({"bad_json", "bad_args", "unknown_tool"})


@dataclass
class ToolRecord:
    """What happened to one call; ``kind`` is "ok" or one of the failure kinds."""

    tool: str
    kind: str
    latency_s: float
    call_id: str | None = None
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.kind in FAILURES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ToolResult:
    message: dict[str, Any]
    record: ToolRecord


async def dispatch(
    calls: list[ToolCall | dict[str, Any]],
    tools: dict[str, Tool],
    injected: dict[str, Any] | None = None,
) -> list[ToolResult]:
    """Run ``calls`` concurrently against ``tools``; results keep the order of the calls."""
    results: list[ToolResult | None] = [None] * len(calls)

    async def one(i: int, call: ToolCall | dict[str, Any]) -> None:
        results[i] = await run_call(_as_call(call), tools, injected or {})

    async with anyio.create_task_group() as tg:
        for i, call in enumerate(calls):
            tg.start_soon(one, i, call)
    return [r for r in results if r is not None]


async def run_call(call: ToolCall, tools: dict[str, Tool], injected: dict[str, Any]) -> ToolResult:
    """One call, every failure caught and turned into a message."""
    start = time.perf_counter()

    def result(kind: str, content: str, detail: str = "") -> ToolResult:
        msg = {"role": "tool", "name": call.name, "content": content}
        if call.id is not None:
            msg["tool_call_id"] = call.id
        record = ToolRecord(call.name, kind, time.perf_counter() - start, call.id, detail or content)
        return ToolResult(msg, record)

    tool = tools.get(call.name)
    if tool is None:
        known = ", ".join(sorted(tools)) or "none"
        return result("unknown_tool", f"Error: unknown tool {call.name!r}. Available tools: {known}.")
    if call.arguments is None:
        why = call.error or "bad_json"
        return result("bad_json", f"Error: the arguments of {call.name} are not a valid JSON object ({why}).")
    try:
        kwargs = tool.validate(call.arguments)
    except pydantic.ValidationError as exc:
        return result("bad_args", f"Error: invalid arguments for {call.name}: {_short_errors(exc)}")
    kwargs.update({k: v for k, v in injected.items() if k in tool.injected})

    output: Any = None
    try:
        async with tool.limiter():
            with anyio.move_on_after(tool.timeout) as scope:
                if tool.is_async:
                    output = await tool.run(**kwargs)
                else:
                    output = await anyio.to_thread.run_sync(lambda: tool.run(**kwargs), abandon_on_cancel=True)
    except ToolError as exc:
        return result("error", f"Error: {exc}")
    except Exception as exc:  # a tool's own failure is the model's information, not our crash
        return result("error", f"Error: {call.name} raised {type(exc).__name__}: {exc}")
    if scope.cancelled_caught:
        return result("timeout", f"Error: {call.name} timed out after {tool.timeout:g} s.")

    try:
        text = format_output(output)
    except (TypeError, ValueError) as exc:
        return result("bad_output", f"Error: {call.name} returned an unreadable result ({exc}).")
    cap = tool.max_output_chars
    if len(text) > cap:
        cut = len(text) - cap
        return result("oversized", text[:cap] + f"\n[... output truncated: {cut} more characters]", f"{len(text)} chars")
    return result("ok", text, "")


def format_output(output: Any) -> str:
    """Tool output as text: strings as is, JSON for plain data, ``str`` for simple scalars."""
    if isinstance(output, str):
        return output
    if output is None:
        return ""
    if isinstance(output, bool | int):
        return str(output)
    if isinstance(output, float):
        if not math.isfinite(output):
            raise ValueError(f"non-finite number {output}")
        return repr(output)
    if isinstance(output, dict | list | tuple):
        return json.dumps(output, ensure_ascii=False, allow_nan=False)
    raise TypeError(f"type {type(output).__name__} is not text, a number or JSON data")


def _as_call(call: ToolCall | dict[str, Any]) -> ToolCall:
    """Accept parsed ``ToolCall``s or OpenAI ``tool_calls`` entries (arguments as dict or JSON text)."""
    if isinstance(call, ToolCall):
        return call
    fn = call.get("function", call) if isinstance(call, dict) else {}
    name = str(fn.get("name") or "")
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            parsed = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return ToolCall(name, None, call.get("id"), raw_arguments=args, error="bad_json")
        args = parsed
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ToolCall(name, None, call.get("id"), raw_arguments=json.dumps(args), error="arguments are not an object")
    return ToolCall(name, args, call.get("id"))


def _short_errors(exc: pydantic.ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ())) or "arguments"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)
