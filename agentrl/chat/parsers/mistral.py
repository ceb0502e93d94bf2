"""Mistral ``[TOOL_CALLS]`` calls, in both published shapes.

* v3 (Mistral 7B v0.3, Nemo, Small 3.x): ``[TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": ...}]``
* v11+ (Magistral, Devstral, Small 3.2): ``[TOOL_CALLS]name[ARGS]{...}``, repeated per call.

Text before the first ``[TOOL_CALLS]`` is the content; the turn ends with ``</s>``.
"""

from __future__ import annotations

from agentrl.chat.parsers.base import MAX_CALLS, ResponseParser, TemplateProbe, too_many_calls
from agentrl.chat.parsers.calls import call_from_json, call_from_object, loads, raw_decode
from agentrl.chat.parsers.names import bad_name
from agentrl.chat.parsers.registry import register_parser
from agentrl.core.messages import ParsedResponse, ParseIssue, ToolCall

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"
_CONTROL = ("[INST]", "[/INST]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[AVAILABLE_TOOLS]")


@register_parser("mistral")
class MistralParser(ResponseParser):
    """Content, then one or more ``[TOOL_CALLS]`` segments (JSON list, or ``name[ARGS]{json}``)."""

    @classmethod
    def matches(cls, probe: TemplateProbe) -> bool:
        return TOOL_CALLS in probe.tool_call_turn and probe.tool_name in probe.tool_call_turn

    def parse(self, text: str) -> ParsedResponse:
        if not text.strip():
            return ParsedResponse(content="", issues=[ParseIssue("empty", "no content and no tool call")])
        issues: list[ParseIssue] = []
        content, *segments = text.split(TOOL_CALLS, MAX_CALLS + 1)
        calls: list[ToolCall] = []
        if len(segments) > MAX_CALLS:
            segments = segments[:MAX_CALLS]
            issues.append(too_many_calls(f"{TOOL_CALLS} segments"))
        for k, segment in enumerate(segments):
            where = f"tool call segment {k}"
            if segment.lstrip().startswith("[") and not segment.lstrip().startswith(ARGS):
                found, more = self._json_list(segment, where)
            else:
                found, more = self._named(segment, where)
            calls.extend(found)
            issues.extend(more)
            if len(calls) > MAX_CALLS:
                del calls[MAX_CALLS:]
                issues.append(too_many_calls("tool calls"))
                break
        for tag in _CONTROL:
            if tag in text:
                issues.append(ParseIssue("stray_tag", f"the model wrote {tag}"))
        return ParsedResponse(content=content.strip(), tool_calls=calls, issues=issues)

    @staticmethod
    def _json_list(segment: str, where: str) -> tuple[list[ToolCall], list[ParseIssue]]:
        start = segment.index("[")
        decoded = raw_decode(segment, start)
        if decoded is None:
            _, err = loads(segment[start:])
            # Salvage what can be read, call by call, so a model learns which call was broken.
            inner = segment[start + 1 :].strip().rstrip("]")
            call, issues = call_from_json(inner, where) if inner.strip() else (None, [])
            return ([call] if call else []), issues or [ParseIssue("bad_json", f"{where}: {err}")]
        value, end = decoded
        issues: list[ParseIssue] = []
        if segment[end:].strip():
            issues.append(ParseIssue("trailing_text", f"after {where}: {segment[end:].strip()[:80]!r}"))
        if not isinstance(value, list):
            return [], [*issues, ParseIssue("not_a_list", f"{where}: expected a JSON list of calls")]
        if not value:
            issues.append(ParseIssue("empty_call", f"{where}: an empty list of calls"))
        calls: list[ToolCall] = []
        for i, obj in enumerate(value):
            call, more = call_from_object(obj, f"{where}, call {i}")
            issues.extend(more)
            if call is not None:
                calls.append(call)
        return calls, issues

    @staticmethod
    def _named(segment: str, where: str) -> tuple[list[ToolCall], list[ParseIssue]]:
        if ARGS not in segment:
            return [], [ParseIssue("missing_arguments", f"{where}: neither a JSON list nor name{ARGS}{{...}}")]
        name, _, body = segment.partition(ARGS)
        name = name.strip()
        if not name:
            return [], [ParseIssue("missing_name", f"{where}: no function name before {ARGS}")]
        if (problem := bad_name(name, where)) is not None:
            return [], [problem]
        decoded = raw_decode(body, len(body) - len(body.lstrip()))
        if decoded is None:
            _, err = loads(body)
            call = ToolCall(name, None, raw_arguments=body.strip(), error="bad_json")
            return [call], [ParseIssue("bad_json", f"{where} ({name}): {err}")]
        value, end = decoded
        issues = []
        if body[end:].strip():
            issues.append(ParseIssue("trailing_text", f"after {where}: {body[end:].strip()[:80]!r}"))
        if not isinstance(value, dict):
            call = ToolCall(name, None, raw_arguments=body[:end].strip(), error="arguments_not_object")
            return [call], [*issues, ParseIssue("arguments_not_object", f"{where} ({name})")]
        return [ToolCall(name, value, raw_arguments=body[:end].strip())], issues
