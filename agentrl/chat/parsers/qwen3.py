"""Qwen3: Hermes tool calls after an optional ``<think>...</think>`` reasoning block.

Handles outputs that start inside the reasoning (the template put ``<think>\\n`` in the prompt, so
only ``</think>`` appears). Calls written inside the reasoning are reported, never executed.
"""

from __future__ import annotations

from agentrl.chat.parsers.base import TemplateProbe
from agentrl.chat.parsers.hermes import OPEN, HermesParser, writes_hermes_calls
from agentrl.chat.parsers.reasoning import split_reasoning
from agentrl.chat.parsers.registry import register_parser
from agentrl.core.messages import ParsedResponse, ParseIssue

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@register_parser("qwen3")
class Qwen3Parser(HermesParser):
    """Reasoning first (explicit or prompt-opened ``<think>``), then Hermes calls in the rest."""

    @classmethod
    def matches(cls, probe: TemplateProbe) -> bool:
        return writes_hermes_calls(probe) and probe.adds(THINK_OPEN)

    def parse(self, text: str) -> ParsedResponse:
        if not text.strip():
            return ParsedResponse(content="", issues=[ParseIssue("empty", "no reasoning, content or tool call")])
        split = split_reasoning(text, THINK_OPEN, THINK_CLOSE)
        issues = list(split.issues)
        if split.reasoning and OPEN in split.reasoning:
            n = split.reasoning.count(OPEN)
            issues.append(ParseIssue("call_in_reasoning", f"{n} {OPEN} inside the reasoning (not executed)"))
        if split.closed and not split.rest.strip():
            issues.append(ParseIssue("empty", "no content and no tool call after the reasoning"))
        result = self.parse_calls(split.rest)
        result.reasoning = split.reasoning
        result.issues = issues + result.issues
        return result
