"""Run the tool calls of one assistant turn: concurrently, bounded, and never raising.

Every outcome — success, exception (any ``BaseException`` a tool raises, ``SystemExit`` and
``KeyboardInterrupt`` included), timeout, unknown tool, invalid JSON, invalid arguments, oversized
or unserialisable output — becomes a ``tool`` message the model can read plus a typed
``ToolRecord`` for metrics. Every message obeys the tool's output cap, error texts included. Only a
real cancellation of the run (the caller's cancel scope, Ctrl-C through the event loop) propagates.

A sync tool runs on its own daemon thread within the tool's thread budget (``tool_threads.py``),
so a hung tool cannot starve other tools nor keep the process alive; it is abandoned at its
timeout, and the wait for a free slot counts toward that timeout (an async tool may start the
clock at its slot instead: ``Tool.timeout_includes_queue``).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from typing import Any

import anyio

from agentrl.core.messages import ToolCall
from agentrl.core.records import FAILURES, MALFORMED, Outcome, ToolRecord
from agentrl.env.tool import DEFAULT_MAX_OUTPUT_CHARS, Tool, ToolError
from agentrl.env.tool_threads import run_in_thread

__all__ = ["FAILURES", "MALFORMED", "Outcome", "ToolRecord", "ToolResult", "dispatch", "run_call"]
# Names and other short fields quoted inside error messages are cut to this many characters.
_QUOTE_CHARS = 200

@dataclass
class ToolResult:
    message: dict[str, Any]
    record: ToolRecord


async def dispatch(
    calls: list[ToolCall | dict[str, Any]],
    tools: dict[str, Tool],
    injected: dict[str, Any] | None = None,
) -> list[ToolResult]:
    """Run ``calls`` concurrently against ``tools``; one result per call, in the order of the calls."""
    results: list[ToolResult | None] = [None] * len(calls)

    async def one(i: int, raw: Any) -> None:
        start = time.perf_counter()
        try:
            results[i] = await run_call(_as_call(raw), tools, injected or {})
        except BaseException as exc:  # a bug of ours or a hostile object: still the model's information
            if _run_cancelled(exc):
                raise
            results[i] = _failure(raw, start, f"Error: the call could not be run ({_describe(exc)}).")

    async with anyio.create_task_group() as tg:
        for i, call in enumerate(calls):
            tg.start_soon(one, i, call)
    return [r if r is not None else _failure(c, time.perf_counter(), "Error: the call produced no result.") for r, c in zip(results, calls)]


async def run_call(call: ToolCall, tools: dict[str, Tool], injected: dict[str, Any]) -> ToolResult:
    """One call, every failure caught and turned into a message of at most the tool's cap."""
    start = time.perf_counter()
    tool = tools.get(call.name)
    cap = _cap_of(tool)
    name = safe_text(call.name)[:_QUOTE_CHARS]  # a model may invent a name of any length

    def result(kind: str, content: str, detail: str = "") -> ToolResult:
        text = cap_text(content, cap)
        msg = {"role": "tool", "name": name, "content": text}
        if call.id is not None:
            msg["tool_call_id"] = call.id
        record = ToolRecord(name, kind, time.perf_counter() - start, call.id, cap_text(detail, cap) if detail else text)
        return ToolResult(msg, record)

    if tool is None:
        known = ", ".join(sorted(tools)) or "none"
        return result("unknown_tool", f"Error: unknown tool {_quote(call.name)}. Available tools: {known}.")
    if call.arguments is None:
        why = safe_text(call.error or "bad_json")[:_QUOTE_CHARS]
        return result("bad_json", f"Error: the arguments of {call.name} are not a valid JSON object ({why}).")
    try:
        kwargs = tool.validate(call.arguments)
    except BaseException as exc:  # pydantic.ValidationError, or a validator of the tool's own types failing
        if _run_cancelled(exc):
            raise
        return result("bad_args", f"Error: invalid arguments for {call.name}: {_short_errors(exc)}")
    kwargs.update({k: v for k, v in injected.items() if k in tool.injected})

    outcome: tuple[str, str, str] | None = None
    if tool.is_async and not tool.timeout_includes_queue:
        # Each holder of a slot is bounded by its own timeout, so the queue is bounded too; the clock
        # starts at the slot (a sandbox's queue is not the program's run time).
        async with tool.limiter():
            with anyio.move_on_after(tool.timeout) as scope:
                outcome = await _run_async(tool, call.name, kwargs)
    else:
        with anyio.move_on_after(tool.timeout) as scope:  # the wait for a slot counts toward the timeout
            if tool.is_async:
                async with tool.limiter():
                    outcome = await _run_async(tool, call.name, kwargs)
            else:
                done = await run_in_thread(lambda: _run_sync(tool, call.name, kwargs), tool.thread_budget(), call.name)
                outcome = done.value if done.error is None else ("error", f"Error: {call.name} failed ({_describe(done.error)}).", "")
    if outcome is None or scope.cancel_called:
        busy = "" if tool.is_async or tool.thread_budget().live < tool.thread_budget().limit else (
            f" (all {tool.thread_budget().limit} of its slots are held by earlier calls that have not ended)"
        )
        return result("timeout", f"Error: {call.name} timed out after {tool.timeout:g} s{busy}.")
    return result(*outcome)


def _run_sync(tool: Tool, name: str, kwargs: dict[str, Any]) -> tuple[str, str, str]:
    """Call and render in the worker thread: a hostile result's ``__str__`` is timed out with the call."""
    try:
        output = tool.run(**kwargs)
    except BaseException as exc:  # noqa: BLE001 - in a worker thread every exception is the tool's own
        return _error_outcome(name, exc)
    return render_output(output, tool.max_output_chars)


async def _run_async(tool: Tool, name: str, kwargs: dict[str, Any]) -> tuple[str, str, str]:
    try:
        output = await tool.run(**kwargs)
    except BaseException as exc:
        if _run_cancelled(exc):
            raise  # our timeout or the run's cancellation: not the tool's own failure
        return _error_outcome(name, exc)
    return render_output(output, tool.max_output_chars)


def _error_outcome(name: str, exc: BaseException) -> tuple[str, str, str]:
    if isinstance(exc, ToolError):
        return "error", f"Error: {safe_text(exc)}", ""
    return "error", f"Error: {name} raised {_describe(exc)}", ""


def render_output(output: Any, cap: int) -> tuple[str, str, str]:
    """(kind, text, detail) of a tool's return value; never raises."""
    try:
        text = format_output(output)
    except BaseException as exc:  # noqa: BLE001 - RecursionError on deep data, a hostile __str__...
        if _run_cancelled(exc):
            raise
        return "bad_output", f"Error: the tool returned an unreadable result ({_describe(exc, with_type=False)}).", ""
    if len(text) > cap:
        return "oversized", text, f"{len(text)} chars"
    return "ok", text, ""


def format_output(output: Any) -> str:
    """Tool output as text: strings as is, JSON for plain data, ``str`` for simple scalars.

    Always returns an exact ``str`` (a str subclass's own methods are never trusted); raises
    TypeError/ValueError (or RecursionError on data nested too deep) for anything else.
    """
    kind = type(output)  # type(), not isinstance: __class__ can lie
    if issubclass(kind, str):
        return str.__str__(output)
    if output is None:
        return ""
    if issubclass(kind, bool):
        return "True" if output else "False"
    if issubclass(kind, int):
        return int.__repr__(output)
    if issubclass(kind, float):
        if not math.isfinite(output):
            raise ValueError(f"non-finite number {float.__repr__(output)}")
        return float.__repr__(output)
    if issubclass(kind, dict | list | tuple):
        return str.__str__(json.dumps(output, ensure_ascii=False, allow_nan=False))
    raise TypeError(f"type {_quote(kind.__name__)} is not text, a number or JSON data")


def cap_text(text: str, cap: int) -> str:
    """``text`` cut to ``cap`` characters with a visible marker saying how much was cut."""
    if len(text) <= cap:
        return text
    return text[:cap] + f"\n[... output truncated: {len(text) - cap} more characters]"


def safe_text(value: Any) -> str:
    """``str(value)`` as an exact ``str``; a placeholder when ``__str__`` fails or lies."""
    try:
        text = value if issubclass(type(value), str) else str(value)
        return str.__str__(text)
    except BaseException as exc:  # noqa: BLE001 - hostile __str__ (SystemExit included)
        if _run_cancelled(exc):
            raise
        return f"<unprintable {_type_name(value)}>"


def _describe(exc: BaseException, with_type: bool = True) -> str:
    text = safe_text(exc)
    return f"{_type_name(exc)}: {text}" if with_type else text


def _type_name(value: Any) -> str:
    try:
        return str.__str__(type(value).__name__)[:_QUOTE_CHARS]
    except BaseException:  # noqa: BLE001
        return "object"


def _quote(value: Any) -> str:
    text = safe_text(value)
    return repr(text[:_QUOTE_CHARS] + ("..." if len(text) > _QUOTE_CHARS else ""))


def _cap_of(tool: Tool | None) -> int:
    cap = getattr(tool, "max_output_chars", DEFAULT_MAX_OUTPUT_CHARS) if tool is not None else DEFAULT_MAX_OUTPUT_CHARS
    return cap if type(cap) is int and cap > 0 else DEFAULT_MAX_OUTPUT_CHARS


def _run_cancelled(exc: BaseException) -> bool:
    """True when ``exc`` is the cancellation of the running task (a timeout or the run's end),
    as opposed to a ``CancelledError`` a tool raised or let escape on its own."""
    if not isinstance(exc, asyncio.CancelledError):
        return False
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop: we are in a worker thread
        return False
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+; on 3.10 every CancelledError counts as real
    return task is None or cancelling is None or cancelling() > 0


def _failure(raw: Any, start: float, content: str) -> ToolResult:
    """The message for a call that could not even be read."""
    name = raw.name if isinstance(raw, ToolCall) else ""
    call_id = raw.id if isinstance(raw, ToolCall) else None
    msg = {"role": "tool", "name": name, "content": cap_text(content, DEFAULT_MAX_OUTPUT_CHARS)}
    if call_id is not None:
        msg["tool_call_id"] = call_id
    return ToolResult(msg, ToolRecord(name, "error", max(0.0, time.perf_counter() - start), call_id, msg["content"]))


def _as_call(call: ToolCall | dict[str, Any]) -> ToolCall:
    """Accept parsed ``ToolCall``s or OpenAI ``tool_calls`` entries (arguments as dict or JSON text)."""
    if isinstance(call, ToolCall):
        return call
    if not isinstance(call, dict):
        return ToolCall("", None, raw_arguments=None, error=f"a tool call must be an object, got {_type_name(call)}")
    fn = call.get("function", call)
    if not isinstance(fn, dict):
        return ToolCall("", None, call.get("id"), error="the call's 'function' is not an object")
    name = safe_text(fn.get("name") or "")
    args = fn.get("arguments")
    if issubclass(type(args), str):
        text = str.__str__(args)
        try:
            parsed = json.loads(text) if text.strip() else {}
        except (ValueError, RecursionError):
            return ToolCall(name, None, call.get("id"), raw_arguments=text, error="bad_json")
        args = parsed
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ToolCall(name, None, call.get("id"), error="arguments are not an object")
    return ToolCall(name, args, call.get("id"))


def _short_errors(exc: BaseException) -> str:
    try:
        errors = exc.errors()[:5]  # type: ignore[attr-defined]
    except BaseException:  # noqa: BLE001 - not a pydantic error: a validator raised something else
        return _describe(exc)
    parts = []
    for err in errors:
        loc = ".".join(safe_text(p)[:_QUOTE_CHARS] for p in err.get("loc", ())) or "arguments"
        parts.append(f"{loc}: {safe_text(err.get('msg', 'invalid'))[:_QUOTE_CHARS]}")
    return "; ".join(parts)
