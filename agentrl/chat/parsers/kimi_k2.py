"""Kimi K2 (Moonshot) tool calls, after an optional ``<think>`` block (K2 Thinking)::

    Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

Each call's id is ``functions.NAME:INDEX`` (the index counts calls across the conversation); the
name is read from it and the id kept, since tool results are addressed to it (``## Return of ID``).
"""

from __future__ import annotations

import re

from agentrl.chat.parsers.base import MAX_CALLS, ResponseParser, TemplateProbe, too_many_calls
from agentrl.chat.parsers.calls import call_body, call_from_object, loads
from agentrl.chat.parsers.names import bad_name
from agentrl.chat.parsers.reasoning import split_reasoning
from agentrl.chat.parsers.registry import register_parser
from agentrl.core.messages import ParsedResponse, ParseIssue, ToolCall

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGS, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_ID = re.compile(r"functions\.(.+):([0-9]+)")


@register_parser("kimi_k2")
class KimiK2Parser(ResponseParser):
    @classmethod
    def matches(cls, probe: TemplateProbe) -> bool:
        return f"{CALL_BEGIN}functions.{probe.tool_name}:" in probe.tool_call_turn

    def parse(self, text: str) -> ParsedResponse:
        if not text.strip():
            return ParsedResponse(content="", issues=[ParseIssue("empty", "no reasoning, content or tool call")])
        split = split_reasoning(text)
        issues = list(split.issues)
        if split.reasoning and SECTION_BEGIN in split.reasoning:
            issues.append(ParseIssue("call_in_reasoning", f"{SECTION_BEGIN} inside the reasoning (not executed)"))
        rest = split.rest
        start = rest.find(SECTION_BEGIN)
        if start == -1:
            for tag in (SECTION_END, CALL_BEGIN, ARGS, CALL_END):
                if tag in rest:
                    issues.append(ParseIssue("stray_tag", f"{tag} without {SECTION_BEGIN}"))
            return ParsedResponse(content=rest.strip(), reasoning=split.reasoning, issues=issues)
        content, body = rest[:start], rest[start + len(SECTION_BEGIN) :]
        end = body.find(SECTION_END)
        if end == -1:
            issues.append(ParseIssue("unclosed_tag", f"{SECTION_BEGIN} is never closed by {SECTION_END}"))
        else:
            if body[end + len(SECTION_END) :].strip():
                issues.append(ParseIssue("trailing_text", f"after {SECTION_END}: {body[end + len(SECTION_END):].strip()[:80]!r}"))
            body = body[:end]
        pieces = body.split(CALL_BEGIN, MAX_CALLS + 1)
        if len(pieces) > MAX_CALLS + 1:
            pieces = pieces[: MAX_CALLS + 1]
            issues.append(too_many_calls("tool calls"))
        if pieces[0].strip():
            issues.append(ParseIssue("text_between_calls", f"{pieces[0].strip()[:80]!r}"))
        calls: list[ToolCall] = []
        for k, piece in enumerate(pieces[1:]):
            call, more = _call(piece, f"tool call {k}")
            issues += more
            if call is not None:
                calls.append(call)
        if not pieces[1:]:
            issues.append(ParseIssue("empty_call", "no call inside the tool-calls section"))
        return ParsedResponse(content=content.strip(), reasoning=split.reasoning, tool_calls=calls, issues=issues)


def _call(piece: str, where: str) -> tuple[ToolCall | None, list[ParseIssue]]:
    """``functions.NAME:I<|tool_call_argument_begin|>{...}<|tool_call_end|>`` -> a call; never raises."""
    body, issues = call_body(piece, CALL_BEGIN, CALL_END, where)
    call_id, found, args = body.partition(ARGS)
    call_id = call_id.strip()
    if not found:
        return None, [*issues, ParseIssue("missing_arguments", f"{where}: no {ARGS} after the call id {call_id[:60]!r}")]
    match = _ID.fullmatch(call_id)
    if match is None:
        return None, [*issues, ParseIssue("bad_name", f"{where}: the call id {call_id[:60]!r} is not functions.NAME:INDEX")]
    name = match.group(1)
    if (problem := bad_name(name, where)) is not None:
        return None, [*issues, problem]
    args = args.strip()
    value, err = loads(args or "{}")
    if err is not None:
        return ToolCall(name, None, id=call_id, raw_arguments=args, error="bad_json"), [
            *issues, ParseIssue("bad_json", f"{where} ({name}): {err}")
        ]  # fmt: skip
    call, more = call_from_object({"name": name, "arguments": value, "id": call_id}, where)
    if call is not None:
        call.raw_arguments = args
    return call, issues + more
