"""Llama 4 pythonic tool calls: the turn's text, then one Python-style list of calls on its own line::

    Let me check.
    [get_weather(city='Paris', days=3), search(q="x")]

optionally between ``<|python_start|>`` and ``<|python_end|>``. Values are Python literals (strings in
either quote, ``True``/``None``, numbers, lists and dicts); the list is read as LFM2's is
(:func:`agentrl.chat.parsers.lfm2.parse_call_list`), so a value JSON cannot hold is ``bad_value``.
"""

from __future__ import annotations

import re

from agentrl.chat.parsers.base import ResponseParser, TemplateProbe
from agentrl.chat.parsers.lfm2 import parse_call_list
from agentrl.chat.parsers.registry import register_parser
from agentrl.core.messages import ParsedResponse, ParseIssue

PY_START, PY_END = "<|python_start|>", "<|python_end|>"
# A call list starts a line: "[" then a name and "(" (bounded spaces keep the scan linear).
_LIST = re.compile(r"(?:^|\n)[ \t]{0,16}(\[)(?=[ \t\n]{0,16}[A-Za-z_][\w.\-]{0,256}[ \t]{0,16}\()")


@register_parser("llama4_pythonic")
class Llama4PythonicParser(ResponseParser):
    @classmethod
    def matches(cls, probe: TemplateProbe) -> bool:
        turn = probe.tool_call_turn
        return f"[{probe.tool_name}(" in turn and "<|tool_call_start|>" not in turn

    def parse(self, text: str) -> ParsedResponse:
        if not text.strip():
            return ParsedResponse(content="", issues=[ParseIssue("empty", "no content and no tool call")])
        issues: list[ParseIssue] = []
        start = text.find(PY_START)
        if start != -1:
            content, body = text[:start], text[start + len(PY_START) :]
            end = body.find(PY_END)
            if end == -1:
                issues.append(ParseIssue("unclosed_tag", f"{PY_START} is never closed by {PY_END}"))
            else:
                if body[end + len(PY_END) :].strip():
                    issues.append(ParseIssue("trailing_text", f"after {PY_END}: {body[end + len(PY_END):].strip()[:80]!r}"))
                body = body[:end]
        else:
            match = _LIST.search(text)
            if match is None:
                if PY_END in text:
                    issues.append(ParseIssue("stray_tag", f"{PY_END} without {PY_START}"))
                return ParsedResponse(content=text.strip(), issues=issues)
            content, body = text[: match.start(1)], text[match.start(1) :]
        calls, more = parse_call_list(body, "call list")
        return ParsedResponse(content=content.strip(), tool_calls=calls, issues=issues + more)
