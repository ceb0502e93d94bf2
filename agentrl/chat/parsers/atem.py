"""Muse Glimmer (ATEM): a turn is a sequence of messages, each addressed to a recipient.

After the prompt's ``<|start|>assistant`` the model writes, for example::

     to=self<|message|>Need the weather.<|eom|><|start|>assistant to=get_weather<|message|><atem:function_calls>
    <atem:invoke name="get_weather">
    <atem:parameter name="city">Paris</atem:parameter>
    </atem:invoke>
    </atem:function_calls><|eot|>

``to=self`` is reasoning, ``to=user`` the answer, any other recipient a tool call. ``<|eom|>`` ends a
message, ``<|eot|>`` the turn (the stop token). Strings are written as they are and lists and
objects as JSON, so argument types come from the tool schema when the caller passes it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentrl.chat.parsers.base import MAX_CALLS, Finder, ResponseParser, TemplateProbe, too_many_calls
from agentrl.chat.parsers.names import bad_name, check_declared
from agentrl.chat.parsers.qwen3_xml import _convert, _param_types
from agentrl.chat.parsers.registry import register_parser
from agentrl.core.messages import ParsedResponse, ParseIssue, ToolCall

START, MESSAGE, END_MESSAGE = "<|start|>", "<|message|>", "<|eom|>"
CALLS_OPEN, CALLS_CLOSE = "<atem:function_calls>", "</atem:function_calls>"
INVOKE_CLOSE, PARAM_CLOSE = "</atem:invoke>", "</atem:parameter>"
# Only <|eom|> ends a message: a header after a message that did not end (an answer quoting
# "<|start|>assistant to=f") is text of that message, never a new one whose call would run.
_SEPARATOR = re.compile(r"<\|eom\|>\s*(?:<\|start\|>\s*assistant)?")
_RECIPIENT = re.compile(r"^\s*to=(\S+)\s*$")
_INVOKE = re.compile(r'<atem:invoke name="([^"<>\n]*)">')
_PARAM = re.compile(r'<atem:parameter name="([^"<>\n]*)">')


@register_parser("atem")
class AtemParser(ResponseParser):
    @classmethod
    def matches(cls, probe: TemplateProbe) -> bool:
        return f'<atem:invoke name="{probe.tool_name}">' in probe.tool_call_turn

    def parse(self, text: str) -> ParsedResponse:
        return self.parse_with_tools(text, None)

    def parse_with_tools(self, text: str, tools: Sequence[dict[str, Any]] | None) -> ParsedResponse:
        if not text.strip():
            return ParsedResponse(content="", issues=[ParseIssue("empty", "no message")])
        types = _param_types(tools)
        issues: list[ParseIssue] = []
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[ToolCall] = []
        for k, chunk in enumerate(c for c in _SEPARATOR.split(text, MAX_CALLS + 1) if c.strip()):
            where = f"message {k}"
            if k == MAX_CALLS:
                issues.append(too_many_calls("messages"))
                break
            header, found, body = chunk.partition(MESSAGE)
            if not found:
                issues.append(ParseIssue("missing_message_tag", f"{where}: no {MESSAGE} in {chunk.strip()[:80]!r}"))
                content.append(chunk.strip())
                continue
            if START in body:
                issues.append(ParseIssue("stray_tag", f"{where}: {START} inside a message that no {END_MESSAGE} ended (kept as its text)"))
            recipient = _RECIPIENT.match(header)
            to = recipient.group(1) if recipient else None
            if to is None:
                issues.append(ParseIssue("missing_channel", f"{where}: no recipient (to=...) in {header.strip()[:60]!r}"))
            if to == "self":
                reasoning.append(body)
            elif to in (None, "user"):
                content.append(body)
            else:
                got, more = _calls(body, to, where, types, MAX_CALLS - len(calls))
                calls += got
                issues += more
        result = ParsedResponse(
            content="\n\n".join(c for c in content if c),
            reasoning="\n\n".join(reasoning) if reasoning else None,
            tool_calls=calls,
            issues=issues,
        )
        return check_declared(result, tools, alias=namespace_alias)


def without_namespace(name: str) -> str:
    """``get_weather.get_weather`` -> ``get_weather``: Muse Glimmer advertises every tool's namespace
    (its name up to the first dot) as ``NS.*`` recipients, so a model writes an undotted tool with
    its namespace in front; a name whose prefix is not its own namespace is kept."""
    ns, dot, rest = name.partition(".")
    return rest if dot and rest.split(".", 1)[0] == ns else name


def namespace_alias(name: str, declared: set[str]) -> str | None:
    """The declared tool ``name`` means once its repeated namespace is dropped, if any."""
    bare = without_namespace(name)
    return bare if bare != name and bare in declared else None


def _calls(body: str, to: str, where: str, types: dict[str, dict[str, Any]], room: int) -> tuple[list[ToolCall], list[ParseIssue]]:
    """The invocations of one message addressed to a tool; never raises."""
    text = body.strip()
    if not text.startswith(CALLS_OPEN):
        return [], [ParseIssue("missing_name", f"{where} (to={to}): no {CALLS_OPEN} block: {text[:60]!r}")]
    issues: list[ParseIssue] = []
    if not text.endswith(CALLS_CLOSE):
        issues.append(ParseIssue("unclosed_tag", f"{where} (to={to}): {CALLS_OPEN} is never closed"))
    inner = text[len(CALLS_OPEN) : len(text) - len(CALLS_CLOSE) if text.endswith(CALLS_CLOSE) else len(text)]
    calls: list[ToolCall] = []
    find = Finder(inner)
    invokes = list(_INVOKE.finditer(inner))
    if not invokes:
        return [], [*issues, ParseIssue("empty_call", f"{where} (to={to}): no <atem:invoke name=...>")]
    for n, invoke in enumerate(invokes):
        if len(calls) >= room:
            issues.append(too_many_calls("calls"))
            break
        name = invoke.group(1).strip()
        stop = invokes[n + 1].start() if n + 1 < len(invokes) else len(inner)
        close = find.find(INVOKE_CLOSE, invoke.end())
        if close == -1 or close > stop:
            issues.append(ParseIssue("unclosed_tag", f"{where} ({name}): <atem:invoke> is never closed"))
            close = stop
        if not name:
            issues.append(ParseIssue("missing_name", f"{where}: an <atem:invoke> without a name"))
            continue
        if (problem := bad_name(name, where)) is not None:
            issues.append(problem)
            continue
        if without_namespace(name) != without_namespace(to):
            issues.append(ParseIssue("recipient_mismatch", f"{where}: addressed to {to!r} but invokes {name!r}"))
        kinds = types.get(name) or types.get(without_namespace(name), {})
        call, more = _arguments(inner[invoke.end() : close], name, where, kinds)
        calls.append(call)
        issues += more
    return calls, issues


def _arguments(inner: str, name: str, where: str, kinds: dict[str, Any]) -> tuple[ToolCall, list[ParseIssue]]:
    args: dict[str, Any] = {}
    issues: list[ParseIssue] = []
    bad = False
    params = list(_PARAM.finditer(inner))
    pos = 0
    for n, param in enumerate(params):
        if inner[pos : param.start()].strip():
            issues.append(ParseIssue("trailing_text", f"{where} ({name}): text outside <atem:parameter>"))
        end = inner.find(PARAM_CLOSE, param.end(), params[n + 1].start() if n + 1 < len(params) else len(inner))
        if end == -1:
            issues.append(ParseIssue("unclosed_tag", f"{where} ({name}): <atem:parameter name={param.group(1)!r}> is never closed"))
            bad = True
            break
        key = param.group(1)
        value, problem = _convert(inner[param.end() : end], kinds.get(key))
        if problem is not None:
            issues.append(ParseIssue("bad_value", f"{where} ({name}) argument {key!r}: {problem}"))
            bad = True
        if key in args:
            issues.append(ParseIssue("duplicate_parameter", f"{where} ({name}): {key!r} given twice"))
        args[key] = value
        pos = end + len(PARAM_CLOSE)
    if not bad and inner[pos:].strip():
        issues.append(ParseIssue("trailing_text", f"{where} ({name}): text after the parameters"))
    if bad:
        return ToolCall(name, None, raw_arguments=inner, error="bad_value"), issues
    return ToolCall(name, args, raw_arguments=inner), issues
