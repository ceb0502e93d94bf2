"""Hermes / Qwen2.5 tool calls: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.

Text before the first call is the content; calls may follow one another separated by whitespace.
A call's JSON is read with a JSON decoder first, so a ``</tool_call>`` inside an argument string
does not cut the call short; only when that fails is the text up to the closing tag used.
"""

from __future__ import annotations

import re

from agentrl.chat.parsers.base import MAX_CALLS, Finder, ResponseParser, TemplateProbe, too_many_calls
from agentrl.chat.parsers.calls import call_from_json, raw_decode
from agentrl.chat.parsers.registry import register_parser
from agentrl.core.messages import ParsedResponse, ParseIssue, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_TAG = "<tool_response>"
REASONING_TAGS = ("<think>", "</think>")


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _scan_call(finder: Finder, body_start: int) -> tuple[str, int, bool]:
    """Find the body of the call opened just before ``body_start``.

    Returns ``(body, resume_at, closed)``: the JSON text, where scanning goes on, and whether the
    closing tag was found.
    """
    text = finder.text
    i = _skip_ws(text, body_start)
    if text.startswith("{", i):
        nxt = finder.find(OPEN, body_start)
        decoded = raw_decode(text, i, len(text) if nxt == -1 else nxt)
        if decoded is not None:
            j = _skip_ws(text, decoded[1])
            if text.startswith(CLOSE, j):
                return text[body_start:j], j + len(CLOSE), True
            if j == len(text):
                return text[body_start:], len(text), False
    end, nxt = finder.find(CLOSE, body_start), finder.find(OPEN, body_start)
    if end != -1 and (nxt == -1 or end < nxt):
        return text[body_start:end], end + len(CLOSE), True
    stop = len(text) if nxt == -1 else nxt
    return text[body_start:stop], stop, False


def writes_hermes_calls(probe: TemplateProbe) -> bool:
    """The template writes ``<tool_call>`` + a JSON object naming the probe tool (not, e.g., Qwen3.5's
    XML parameters), whatever the key order: Hermes-2-Pro writes ``{"arguments": ..., "name": ...}``.
    The object need not decode: a template that writes broken arguments is detected, and its round
    trip then fails with the parser's issue, which says more than "not detected"."""
    text = probe.tool_call_turn
    name = re.compile(r'"name"\s*:\s*"' + re.escape(probe.tool_name) + '"')
    at = text.find(OPEN)
    while at != -1:
        end = text.find(CLOSE, at)
        body = text[at + len(OPEN) : len(text) if end == -1 else end]
        if body.lstrip().startswith("{") and name.search(body):
            return True
        at = text.find(OPEN, at + len(OPEN))
    return False


@register_parser("hermes")
class HermesParser(ResponseParser):
    """Hermes-style calls only; reasoning tags are left in the content and reported.

    ``allow_parallel_calls=False`` reports several calls in one turn as a ``multiple_calls`` issue
    (all are still returned; the dispatcher decides).
    """

    def __init__(self, allow_parallel_calls: bool = True) -> None:
        self.allow_parallel_calls = allow_parallel_calls

    @classmethod
    def matches(cls, probe: TemplateProbe) -> bool:
        return writes_hermes_calls(probe) and not probe.adds(REASONING_TAGS[0])

    def parse(self, text: str) -> ParsedResponse:
        if not text.strip():
            return ParsedResponse(content="", issues=[ParseIssue("empty", "no content and no tool call")])
        result = self.parse_calls(text)
        for tag in REASONING_TAGS:
            if tag in result.content:
                result.issues.append(ParseIssue("reasoning_tag", f"{tag} in output; the 'qwen3' format parses it"))
        return result

    def parse_calls(self, text: str) -> ParsedResponse:
        """Split ``text`` into content and calls (no empty-output check, no reasoning handling)."""
        issues: list[ParseIssue] = []
        calls: list[ToolCall] = []
        first = text.find(OPEN)
        content = text if first == -1 else text[:first]
        if CLOSE in content:
            issues.append(ParseIssue("stray_tag", f"{CLOSE} without a matching {OPEN}"))
        pos, index = first, 0
        finder = Finder(text)
        while pos != -1:
            if index == MAX_CALLS:
                issues.append(too_many_calls("tool calls"))
                break
            body, after, closed = _scan_call(finder, pos + len(OPEN))
            where = f"tool call {index}"
            if not closed:
                issues.append(ParseIssue("unclosed_tag", f"{where}: {OPEN} is never closed by {CLOSE}"))
            call, call_issues = call_from_json(body, where)
            issues.extend(call_issues)
            if call is not None:
                calls.append(call)
            pos = finder.find(OPEN, after)
            gap = text[after : len(text) if pos == -1 else pos]
            if gap.strip():
                kind = "trailing_text" if pos == -1 else "text_between_calls"
                issues.append(ParseIssue(kind, f"after {where}: {gap.strip()[:80]!r}"))
                if CLOSE in gap:
                    issues.append(ParseIssue("stray_tag", f"{CLOSE} without a matching {OPEN}"))
            index += 1
        if index > 1 and not self.allow_parallel_calls:
            issues.append(ParseIssue("multiple_calls", f"{index} tool calls in one turn"))
        if RESPONSE_TAG in text:
            issues.append(ParseIssue("tool_response_in_output", f"the model wrote {RESPONSE_TAG} itself"))
        return ParsedResponse(content=content.strip(), tool_calls=calls, issues=issues)
