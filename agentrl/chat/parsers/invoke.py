"""``<invoke name="f"><parameter name="k">v</parameter></invoke>`` blocks, shared by the families that
write calls as XML invocations inside a block of their own (MiniMax M2, DeepSeek V3.2's DSML).

Values are untyped text (strings raw, other values as JSON), so types come from the tool schema
(:func:`agentrl.chat.parsers.qwen3_xml._convert`), unless the family marks each parameter with
``string="true|false"`` (DSML), which then decides. Linear in the text; never raises.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.chat.parsers.base import MAX_CALLS, Finder, too_many_calls
from agentrl.chat.parsers.calls import loads
from agentrl.chat.parsers.names import bad_name, check_declared
from agentrl.chat.parsers.qwen3_xml import _convert, _param_types
from agentrl.chat.parsers.reasoning import split_calls
from agentrl.core.messages import ParsedResponse, ParseIssue, ToolCall


@dataclass(frozen=True)
class InvokeSyntax:
    """The tags of one family's invocation blocks."""

    open: str  # the block around a turn's calls, e.g. "<minimax:tool_call>"
    close: str
    invoke: re.Pattern[str]  # group 1: the function name
    invoke_close: str
    param: re.Pattern[str]  # group 1: the parameter name; group 2 (optional): "true"/"false" = is a string
    param_close: str


def parse_invokes(text: str, syntax: InvokeSyntax, tools: Sequence[dict[str, Any]] | None) -> ParsedResponse:
    """Reasoning (``<think>``), content before the first block, then each block's invocations."""
    if not text.strip():
        return ParsedResponse(content="", issues=[ParseIssue("empty", "no reasoning, content or tool call")])
    split = split_calls(text, syntax.open, syntax.close)
    issues, rest, pos, content = split.issues, split.rest, split.first, split.content
    types = _param_types(tools)
    calls: list[ToolCall] = []
    finder = Finder(rest)
    blocks = 0
    while pos != -1:
        if blocks == MAX_CALLS or len(calls) >= MAX_CALLS:
            issues.append(too_many_calls("tool-call blocks"))
            break
        blocks += 1
        start = pos + len(syntax.open)
        end, nxt = finder.find(syntax.close, start), finder.find(syntax.open, start)
        closed = end != -1 and (nxt == -1 or end < nxt)
        stop = end if closed else (len(rest) if nxt == -1 else nxt)
        where = f"tool-call block {blocks - 1}"
        if not closed:
            issues.append(ParseIssue("unclosed_tag", f"{where}: {syntax.open} is never closed by {syntax.close}"))
        got, more = _invokes(rest[start:stop], syntax, where, types, MAX_CALLS - len(calls))
        calls += got
        issues += more
        after = stop + len(syntax.close) if closed else stop
        pos = finder.find(syntax.open, after)
        gap = rest[after : len(rest) if pos == -1 else pos]
        if gap.strip():
            issues.append(ParseIssue("trailing_text" if pos == -1 else "text_between_calls", f"after {where}: {gap.strip()[:80]!r}"))
    result = ParsedResponse(content=content.strip(), reasoning=split.reasoning, tool_calls=calls, issues=issues)
    return check_declared(result, tools)


def _invokes(body: str, syntax: InvokeSyntax, where: str, types: dict[str, dict[str, Any]], room: int) -> tuple[list[ToolCall], list[ParseIssue]]:
    issues: list[ParseIssue] = []
    invokes = list(syntax.invoke.finditer(body, 0, len(body)))
    if not invokes:
        return [], [ParseIssue("empty_call" if not body.strip() else "missing_name", f"{where}: no invocation in {body.strip()[:60]!r}")]
    if body[: invokes[0].start()].strip():
        issues.append(ParseIssue("trailing_text", f"{where}: text before the first invocation"))
    find = Finder(body)
    calls: list[ToolCall] = []
    for n, invoke in enumerate(invokes):
        if len(calls) >= room:
            issues.append(too_many_calls("calls"))
            break
        name = invoke.group(1).strip()
        stop = invokes[n + 1].start() if n + 1 < len(invokes) else len(body)
        close = find.find(syntax.invoke_close, invoke.end())
        if close == -1 or close > stop:
            issues.append(ParseIssue("unclosed_tag", f"{where} ({name}): the invocation is never closed"))
            close = stop
        elif body[close + len(syntax.invoke_close) : stop].strip():
            issues.append(ParseIssue("text_between_calls", f"{where} ({name}): text after the invocation"))
        if not name:
            issues.append(ParseIssue("missing_name", f"{where}: an invocation without a name"))
            continue
        if (problem := bad_name(name, where)) is not None:
            issues.append(problem)
            continue
        call, more = _arguments(body[invoke.end() : close], syntax, name, where, types.get(name, {}))
        calls.append(call)
        issues += more
    return calls, issues


def _arguments(inner: str, syntax: InvokeSyntax, name: str, where: str, kinds: dict[str, Any]) -> tuple[ToolCall, list[ParseIssue]]:
    args: dict[str, Any] = {}
    issues: list[ParseIssue] = []
    bad = False
    params = list(syntax.param.finditer(inner))
    pos = 0
    for n, param in enumerate(params):
        if inner[pos : param.start()].strip():
            issues.append(ParseIssue("trailing_text", f"{where} ({name}): text outside the parameters"))
        end = inner.find(syntax.param_close, param.end(), params[n + 1].start() if n + 1 < len(params) else len(inner))
        key = param.group(1)
        if end == -1:
            issues.append(ParseIssue("unclosed_tag", f"{where} ({name}): parameter {key!r} is never closed"))
            bad = True
            break
        raw = inner[param.end() : end]
        marked = param.group(2) if param.re.groups >= 2 else None
        if marked == "true":
            value, problem = raw, None  # the family says: a string, as written
        elif marked == "false":
            value, err = loads(raw.strip())
            problem = None if err is None else f"{raw.strip()[:40]!r} is marked not a string but is no JSON value"
            if problem is None:
                value, problem = _convert(raw, kinds.get(key)) if kinds.get(key) else (value, None)
        else:
            value, problem = _convert(raw, kinds.get(key))
        if problem is not None:
            issues.append(ParseIssue("bad_value", f"{where} ({name}) argument {key!r}: {problem}"))
            bad = True
        if key in args:
            issues.append(ParseIssue("duplicate_parameter", f"{where} ({name}): {key!r} given twice"))
        args[key] = value
        pos = end + len(syntax.param_close)
    if not bad and inner[pos:].strip():
        issues.append(ParseIssue("trailing_text", f"{where} ({name}): text after the parameters"))
    if bad:
        return ToolCall(name, None, raw_arguments=inner, error="bad_value"), issues
    return ToolCall(name, args, raw_arguments=inner), issues
