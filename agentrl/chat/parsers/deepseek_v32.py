"""DeepSeek V3.2 tool calls (DSML), after the turn's text::

    Let me check.

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

Each parameter says whether it is a string (written as is) or not (JSON), so types need no schema;
a schema type still fits a non-string value (``"3"`` for an integer). Reasoning ends at ``</think>``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentrl.chat.parsers.base import ResponseParser, TemplateProbe
from agentrl.chat.parsers.invoke import InvokeSyntax, parse_invokes
from agentrl.chat.parsers.registry import register_parser
from agentrl.core.messages import ParsedResponse

DSML = "｜DSML｜"
SYNTAX = InvokeSyntax(
    open=f"<{DSML}function_calls>",
    close=f"</{DSML}function_calls>",
    invoke=re.compile(f'<{DSML}invoke name="([^"<>\\n]*)">'),
    invoke_close=f"</{DSML}invoke>",
    param=re.compile(f'<{DSML}parameter name="([^"<>\\n]*)"(?: string="(true|false)")?>'),
    param_close=f"</{DSML}parameter>",
)


@register_parser("deepseek_v32")
class DeepSeekV32Parser(ResponseParser):
    @classmethod
    def matches(cls, probe: TemplateProbe) -> bool:
        return f'<{DSML}invoke name="{probe.tool_name}">' in probe.tool_call_turn

    def parse(self, text: str) -> ParsedResponse:
        return parse_invokes(text, SYNTAX, None)

    def parse_with_tools(self, text: str, tools: Sequence[dict[str, Any]] | None) -> ParsedResponse:
        return parse_invokes(text, SYNTAX, tools)
