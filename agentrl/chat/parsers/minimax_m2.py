"""MiniMax M2 tool calls, after the ``<think>`` block its generation prompt opens::

    reasoning
    </think>

    Let me check.
    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    </invoke>
    </minimax:tool_call>

Strings are written as they are, other values as JSON: types come from the tool schema.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentrl.chat.parsers.base import ResponseParser, TemplateProbe
from agentrl.chat.parsers.invoke import InvokeSyntax, parse_invokes
from agentrl.chat.parsers.registry import register_parser
from agentrl.core.messages import ParsedResponse

SYNTAX = InvokeSyntax(
    open="<minimax:tool_call>",
    close="</minimax:tool_call>",
    invoke=re.compile(r'<invoke name="([^"<>\n]*)">'),
    invoke_close="</invoke>",
    param=re.compile(r'<parameter name="([^"<>\n]*)">'),
    param_close="</parameter>",
)


@register_parser("minimax_m2")
class MiniMaxM2Parser(ResponseParser):
    @classmethod
    def matches(cls, probe: TemplateProbe) -> bool:
        turn = probe.tool_call_turn
        at = turn.find(SYNTAX.open)
        return at != -1 and f'<invoke name="{probe.tool_name}">' in turn[at:]

    def parse(self, text: str) -> ParsedResponse:
        return parse_invokes(text, SYNTAX, None)

    def parse_with_tools(self, text: str, tools: Sequence[dict[str, Any]] | None) -> ParsedResponse:
        return parse_invokes(text, SYNTAX, tools)
