"""Cohere Command R7B / Command A tool calls: a JSON list inside action tags, after optional thinking::

    <|START_THINKING|>I will check the weather.<|END_THINKING|><|START_ACTION|>[
        {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}}
    ]<|END_ACTION|>

An answer is ``<|START_RESPONSE|>text<|END_RESPONSE|>`` (R7B), ``<|START_TEXT|>text<|END_TEXT|>``
(Cohere2 / Command A reasoning templates) or plain text. The call id is kept: tool results are
addressed to it.
"""

from __future__ import annotations

import re

from agentrl.chat.parsers.base import MAX_CALLS, ResponseParser, TemplateProbe, too_many_calls
from agentrl.chat.parsers.calls import call_from_object, loads, raw_decode
from agentrl.chat.parsers.names import bad_name
from agentrl.chat.parsers.reasoning import split_reasoning
from agentrl.chat.parsers.registry import register_parser
from agentrl.core.messages import ParsedResponse, ParseIssue, ToolCall

THINK_OPEN, THINK_CLOSE = "<|START_THINKING|>", "<|END_THINKING|>"
ACTION_OPEN, ACTION_CLOSE = "<|START_ACTION|>", "<|END_ACTION|>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<|START_RESPONSE|>", "<|END_RESPONSE|>"
TEXT_OPEN, TEXT_CLOSE = "<|START_TEXT|>", "<|END_TEXT|>"
# The tags an answer is written between, by template generation: R7B's, then Cohere2's.
_ANSWER_TAGS = ((RESPONSE_OPEN, RESPONSE_CLOSE), (TEXT_OPEN, TEXT_CLOSE))
_TOOL_NAME = re.compile(r'"tool_name"\s*:\s*"([^"\\]*)"')


@register_parser("command")
class CommandParser(ResponseParser):
    @classmethod
    def matches(cls, probe: TemplateProbe) -> bool:
        turn = probe.tool_call_turn
        at = turn.find(ACTION_OPEN)
        return at != -1 and re.search(r'"tool_name"\s*:\s*"' + re.escape(probe.tool_name) + '"', turn[at:]) is not None

    def parse(self, text: str) -> ParsedResponse:
        if not text.strip():
            return ParsedResponse(content="", issues=[ParseIssue("empty", "no thinking, answer or action")])
        split = split_reasoning(text, THINK_OPEN, THINK_CLOSE)
        issues = list(split.issues)
        if split.reasoning and ACTION_OPEN in split.reasoning:
            issues.append(ParseIssue("call_in_reasoning", f"{ACTION_OPEN} inside the thinking (not executed)"))
        rest = split.rest
        at = rest.find(ACTION_OPEN)
        content = _answer(rest if at == -1 else rest[:at], issues)
        calls: list[ToolCall] = []
        if at != -1:
            body = rest[at + len(ACTION_OPEN) :]
            end = body.find(ACTION_CLOSE)
            if end == -1:
                issues.append(ParseIssue("unclosed_tag", f"{ACTION_OPEN} is never closed by {ACTION_CLOSE}"))
            else:
                if body[end + len(ACTION_CLOSE) :].strip():
                    issues.append(ParseIssue("trailing_text", f"after {ACTION_CLOSE}: {body[end + len(ACTION_CLOSE):].strip()[:80]!r}"))
                body = body[:end]
            calls = _actions(body, issues)
        elif ACTION_CLOSE in rest:
            issues.append(ParseIssue("stray_tag", f"{ACTION_CLOSE} without {ACTION_OPEN}"))
        return ParsedResponse(content=content, reasoning=split.reasoning, tool_calls=calls, issues=issues)


def _answer(text: str, issues: list[ParseIssue]) -> str:
    """The answer text: inside the response (or text) tags where the model wrote them."""
    found = [(text.find(o), o, c) for o, c in _ANSWER_TAGS if o in text]
    if not found:
        for o, c in _ANSWER_TAGS:
            if c in text:
                issues.append(ParseIssue("stray_tag", f"{c} without {o}"))
        return text.strip()
    start, open_tag, close_tag = min(found)
    if text[:start].strip():
        issues.append(ParseIssue("trailing_text", f"before {open_tag}: {text[:start].strip()[:80]!r}"))
    inner = text[start + len(open_tag) :]
    end = inner.find(close_tag)
    if end == -1:
        issues.append(ParseIssue("unclosed_tag", f"{open_tag} is never closed by {close_tag}"))
        return inner.strip()
    if inner[end + len(close_tag) :].strip():
        issues.append(ParseIssue("trailing_text", f"after {close_tag}: {inner[end + len(close_tag):].strip()[:80]!r}"))
    return inner[:end].strip()


def _actions(body: str, issues: list[ParseIssue]) -> list[ToolCall]:
    """The JSON list of ``{"tool_call_id", "tool_name", "parameters"}`` objects; never raises."""
    text = body.strip()
    if not text:
        issues.append(ParseIssue("empty_call", "nothing inside the action"))
        return []
    decoded = raw_decode(text, 0) if text.startswith("[") else None
    if decoded is None:
        _, err = loads(text)
        names = _TOOL_NAME.findall(text)[:MAX_CALLS]
        ok = [n for n in names if bad_name(n, "action") is None]
        issues.append(ParseIssue("bad_json" if text.startswith("[") else "not_a_list", f"the action is not a JSON list of calls: {err}"))
        return [ToolCall(n, None, raw_arguments=text, error="bad_json") for n in ok]
    value, stop = decoded
    if text[stop:].strip():
        issues.append(ParseIssue("trailing_text", f"after the action list: {text[stop:].strip()[:80]!r}"))
    if not isinstance(value, list):
        issues.append(ParseIssue("not_a_list", "the action is not a JSON list"))
        return []
    if not value:
        issues.append(ParseIssue("empty_call", "an empty action list"))
    if len(value) > MAX_CALLS:
        issues.append(too_many_calls("actions"))
    calls: list[ToolCall] = []
    for k, item in enumerate(value[:MAX_CALLS]):
        where = f"action {k}"
        if not isinstance(item, dict):
            issues.append(ParseIssue("not_an_object", f"{where}: expected a JSON object, got {type(item).__name__}"))
            continue
        call_id = item.get("tool_call_id")
        obj = {"name": item.get("tool_name"), "arguments": item.get("parameters", {}),
               "id": str(call_id) if isinstance(call_id, (str, int)) and not isinstance(call_id, bool) else None}  # fmt: skip
        call, more = call_from_object(obj, where)
        issues += more
        if call is not None:
            calls.append(call)
    return calls
