"""GLM-4 MoE (GLM-4.5 / 4.6): reasoning in ``<think>``, calls as name plus key/value tags.

After the prompt's ``<|assistant|>`` the model writes::

    <think>Need the weather.</think>
    Let me check.
    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

and stops on the token that opens the next message (``<|observation|>`` after calls, ``<|user|>``
after an answer). String values are written as they are, others as JSON, so argument types come from
the tool schema when the caller passes it; without one, a value that reads as JSON is taken as JSON.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentrl.chat.parsers.base import MAX_CALLS, Finder, ResponseParser, TemplateProbe, too_many_calls
from agentrl.chat.parsers.names import bad_name, check_declared
from agentrl.chat.parsers.qwen3_xml import _convert, _param_types
from agentrl.chat.parsers.reasoning import split_calls
from agentrl.chat.parsers.registry import register_parser
from agentrl.core.messages import ParsedResponse, ParseIssue, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
_NAME = re.compile(r"\s*([^<>\s]+)\s*")


@register_parser("glm4")
class Glm4Parser(ResponseParser):
    @classmethod
    def matches(cls, probe: TemplateProbe) -> bool:
        turn = probe.tool_call_turn
        at = turn.find(f"{OPEN}{probe.tool_name}")
        return at != -1 and KEY_OPEN in turn[at:]

    def parse(self, text: str) -> ParsedResponse:
        return self.parse_with_tools(text, None)

    def parse_with_tools(self, text: str, tools: Sequence[dict[str, Any]] | None) -> ParsedResponse:
        if not text.strip():
            return ParsedResponse(content="", issues=[ParseIssue("empty", "no reasoning, content or tool call")])
        split = split_calls(text, OPEN, CLOSE)
        issues, rest, first, content = split.issues, split.rest, split.first, split.content
        types = _param_types(tools)
        calls: list[ToolCall] = []
        finder = Finder(rest)
        pos, attempts = first, 0
        while pos != -1:
            if attempts == MAX_CALLS:  # malformed calls count too: each one costs an issue and a scan
                issues.append(too_many_calls("tool calls"))
                break
            attempts += 1
            start = pos + len(OPEN)
            end, nxt = _outside_values(finder, CLOSE, start), _outside_values(finder, OPEN, start)
            closed = end != -1 and (nxt == -1 or end < nxt)
            stop = end if closed else (len(rest) if nxt == -1 else nxt)
            where = f"tool call {len(calls)}"
            if not closed:
                issues.append(ParseIssue("unclosed_tag", f"{where}: {OPEN} is never closed by {CLOSE}"))
            call, more = _call(rest[start:stop], where, types)
            issues += more
            if call is not None:
                calls.append(call)
            after = stop + len(CLOSE) if closed else stop
            pos = finder.find(OPEN, after)
            gap = rest[after : len(rest) if pos == -1 else pos]
            if gap.strip():
                kind = "trailing_text" if pos == -1 else "text_between_calls"
                issues.append(ParseIssue(kind, f"after {where}: {gap.strip()[:80]!r}"))
        return check_declared(ParsedResponse(content=content.strip(), reasoning=split.reasoning, tool_calls=calls, issues=issues), tools)


def _outside_values(finder: Finder, tag: str, start: int) -> int:
    """The first ``tag`` from ``start`` that is not inside an ``<arg_value>`` (a string value may
    hold ``</tool_call>`` or ``<tool_call>`` as text). Positions only move forward: linear."""
    at = start
    while True:
        end, value = finder.find(tag, at), finder.find(VALUE_OPEN, at)
        if value == -1 or end == -1 or end < value:
            return end
        value_end = finder.find(VALUE_CLOSE, value + len(VALUE_OPEN))
        if value_end == -1:
            return end
        at = value_end + len(VALUE_CLOSE)


def _call(body: str, where: str, types: dict[str, dict[str, Any]]) -> tuple[ToolCall | None, list[ParseIssue]]:
    """``NAME <arg_key>k</arg_key><arg_value>v</arg_value>...`` -> a call; never raises."""
    head = body.split(KEY_OPEN, 1)[0]
    name_match = _NAME.fullmatch(head)
    if not body.strip():
        return None, [ParseIssue("empty_call", f"{where}: nothing inside {OPEN}")]
    if name_match is None:
        return None, [ParseIssue("missing_name", f"{where}: no function name before the arguments: {head.strip()[:60]!r}")]
    name = name_match.group(1)
    if (problem := bad_name(name, where)) is not None:
        return None, [problem]
    kinds = types.get(name, {})
    args: dict[str, Any] = {}
    issues: list[ParseIssue] = []
    bad = False
    pos = len(head)
    while pos < len(body):
        key_end = body.find(KEY_CLOSE, pos)
        value_open = body.find(VALUE_OPEN, pos)
        value_close = body.find(VALUE_CLOSE, pos)
        if not body.startswith(KEY_OPEN, pos) or -1 in (key_end, value_open, value_close) or not key_end < value_open < value_close:
            issues.append(ParseIssue("unclosed_tag", f"{where} ({name}): a broken <arg_key>/<arg_value> pair at {body[pos:pos + 60]!r}"))
            bad = True
            break
        key = body[pos + len(KEY_OPEN) : key_end].strip()
        if body[key_end + len(KEY_CLOSE) : value_open].strip():
            issues.append(ParseIssue("trailing_text", f"{where} ({name}): text between the key {key!r} and its value"))
        raw = body[value_open + len(VALUE_OPEN) : value_close]
        value, problem = _convert(raw, kinds.get(key))
        if problem is not None:
            issues.append(ParseIssue("bad_value", f"{where} ({name}) argument {key!r}: {problem}"))
            bad = True
        if key in args:
            issues.append(ParseIssue("duplicate_parameter", f"{where} ({name}): {key!r} given twice"))
        args[key] = value
        pos = value_close + len(VALUE_CLOSE)
        while pos < len(body) and body[pos] in " \t\n":
            pos += 1
    if bad:
        return ToolCall(name, None, raw_arguments=body[len(head) :], error="bad_value"), issues
    return ToolCall(name, args, raw_arguments=body[len(head) :]), issues
