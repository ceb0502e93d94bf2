"""DeepSeek V3.1 tool calls: the V3 framing without the type and the code fence::

    Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Reasoning, when the prompt opened it with ``<think>``, ends at ``</think>``. The block and call
scanning are V3's (:class:`DeepSeekV3Parser`); only a call's inside differs.
"""

from __future__ import annotations

from agentrl.chat.parsers.base import TemplateProbe
from agentrl.chat.parsers.calls import call_body, call_from_object, loads
from agentrl.chat.parsers.deepseek_v3 import CALL_BEGIN, CALL_END, SEP, DeepSeekV3Parser
from agentrl.chat.parsers.names import bad_name
from agentrl.chat.parsers.registry import register_parser
from agentrl.core.messages import ParseIssue, ToolCall


@register_parser("deepseek_v31")
class DeepSeekV31Parser(DeepSeekV3Parser):
    @classmethod
    def matches(cls, probe: TemplateProbe) -> bool:
        return f"{CALL_BEGIN}{probe.tool_name}{SEP}" in probe.tool_call_turn

    @staticmethod
    def _call(piece: str, where: str) -> tuple[ToolCall | None, list[ParseIssue]]:
        body, issues = call_body(piece, CALL_BEGIN, CALL_END, where)
        name, found, args = body.partition(SEP)
        name = name.strip()
        if not found or not name:
            return None, [*issues, ParseIssue("missing_name", f"{where}: no NAME{SEP} at the start of the call")]
        if (problem := bad_name(name, where)) is not None:
            return None, [*issues, problem]
        args = args.strip()
        value, err = loads(args or "{}")
        if err is not None:
            return ToolCall(name, None, raw_arguments=args, error="bad_json"), [*issues, ParseIssue("bad_json", f"{where} ({name}): {err}")]
        call, more = call_from_object({"name": name, "arguments": value}, where)
        if call is not None:
            call.raw_arguments = args
        return call, issues + more
