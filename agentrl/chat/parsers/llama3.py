"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: the whole turn is ``{"name": ..., "parameters": {...}}``.

The published format writes one call as the entire assistant message, optionally after
``<|python_tag|>``; the turn ends with ``<|eot_id|>`` (or ``<|eom_id|>`` when the model expects a
tool result). Several calls are read one JSON object after another (separated by whitespace or
``;``), which is how agentrl's Llama template writes parallel calls; calls on their own lines after
some text are read too (the template writes content, then each call on a new line). Python code after
``<|python_tag|>`` (Llama's built-in code interpreter / ``brave_search.call(...)``) is not a JSON
tool: it stays content and is reported.
"""

from __future__ import annotations

import re

from agentrl.chat.parsers.base import MAX_CALLS, ResponseParser, TemplateProbe, too_many_calls
from agentrl.chat.parsers.calls import call_from_json, call_from_object, raw_decode
from agentrl.chat.parsers.registry import register_parser
from agentrl.core.messages import ParsedResponse, ParseIssue, ToolCall

PYTHON_TAG = "<|python_tag|>"
_LINE_CALL = re.compile(r'(?<=\n)[ \t]*\{\s*"name"\s*:')  # a call on its own line after some text


@register_parser("llama3")
class Llama3Parser(ResponseParser):
    """A turn that is JSON call objects is calls; anything else is content."""

    @classmethod
    def matches(cls, probe: TemplateProbe) -> bool:
        pattern = r'\{\s*"name"\s*:\s*"' + re.escape(probe.tool_name) + r'"\s*,\s*"parameters"\s*:'
        return re.search(pattern, probe.tool_call_turn) is not None and "<tool_call>" not in probe.tool_call_turn

    def parse(self, text: str) -> ParsedResponse:
        if not text.strip():
            return ParsedResponse(content="", issues=[ParseIssue("empty", "no content and no tool call")])
        issues: list[ParseIssue] = []
        body = text
        if PYTHON_TAG in text:
            before, _, body = text.partition(PYTHON_TAG)
            if before.strip():
                issues.append(ParseIssue("text_before_call", f"text before {PYTHON_TAG}: {before.strip()[:80]!r}"))
            if PYTHON_TAG in body:
                issues.append(ParseIssue("stray_tag", f"{PYTHON_TAG} more than once"))
                body = body.replace(PYTHON_TAG, "")
            if not body.lstrip().startswith("{"):
                issues.append(ParseIssue("python_code", "code after <|python_tag|> (built-in tools are not supported)"))
                return ParsedResponse(content=text.strip(), issues=issues)
        elif not body.lstrip().startswith("{"):
            match = _LINE_CALL.search(body)
            if match is None:
                return ParsedResponse(content=text.strip(), issues=issues)
            calls, call_issues = self.parse_objects(body[match.start() :])
            if call_issues:  # text then something call-like that is not clean calls: keep it as text
                issues.append(ParseIssue("call_in_content", "text followed by a malformed JSON call"))
                return ParsedResponse(content=text.strip(), issues=issues)
            return ParsedResponse(content=body[: match.start()].strip(), tool_calls=calls, issues=issues)
        calls, call_issues = self.parse_objects(body)
        return ParsedResponse(content="", tool_calls=calls, issues=issues + call_issues)

    @staticmethod
    def parse_objects(body: str) -> tuple[list[ToolCall], list[ParseIssue]]:
        """JSON call objects one after another; the rest after the first undecodable one is one bad call."""
        calls: list[ToolCall] = []
        issues: list[ParseIssue] = []
        i, index = 0, 0
        while True:
            while i < len(body) and (body[i].isspace() or body[i] == ";"):
                i += 1
            if i >= len(body):
                break
            if index == MAX_CALLS:
                issues.append(too_many_calls("tool calls"))
                break
            where = f"tool call {index}"
            decoded = raw_decode(body, i) if body.startswith("{", i) else None
            if decoded is None:
                rest = body[i:]
                if not rest.lstrip().startswith("{"):
                    issues.append(ParseIssue("trailing_text", f"after the calls: {rest.strip()[:80]!r}"))
                    break
                call, more = call_from_json(rest, where)
                issues.extend(more)
                if call is not None:
                    calls.append(call)
                break
            obj, i = decoded
            call, more = call_from_object(obj, where)
            issues.extend(more)
            if call is not None:
                calls.append(call)
            index += 1
        return calls, issues
