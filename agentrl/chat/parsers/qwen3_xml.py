"""Qwen3.5 / Qwen3-Coder XML parameter calls, after an optional ``<think>`` block::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Parameter values are untyped text (strings raw, other values as JSON or Python literals), so the
argument types come from the tool schema when the caller passes it (``ChatFormat.parse(ids,
tools)``); without a schema a value that reads as JSON is taken as JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from agentrl.chat.parsers.base import MAX_CALLS, Finder, ResponseParser, TemplateProbe, too_many_calls
from agentrl.chat.parsers.calls import loads
from agentrl.chat.parsers.names import bad_name, check_declared, coerce, schema_kinds
from agentrl.chat.parsers.reasoning import split_calls
from agentrl.chat.parsers.registry import register_parser
from agentrl.core.messages import ParsedResponse, ParseIssue, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
# A name stops at '<' too, so "<function=" repeated is one failed match per opener, not a scan to
# the end of the text per opener (quadratic).
_FUNCTION = re.compile(r"<function=([^<>\n]*)>")
_PARAM = re.compile(r"<parameter=([^<>\n]*)>")
_PY_LITERALS = {"True": True, "False": False, "None": None}


def _param_types(tools: Sequence[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """tool name -> {parameter -> its JSON-schema type (string, or list of them)}."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        props = (fn.get("parameters") or {}).get("properties") or {}
        if isinstance(fn.get("name"), str) and isinstance(props, dict):
            out[fn["name"]] = {k: (v.get("type") if isinstance(v, dict) else None) for k, v in props.items()}
    return out


def _convert(raw: str, kind: Any) -> tuple[Any, str | None]:
    """The value of a parameter's text given its schema type; (value, problem or None).

    A value of another type than declared is coerced where that is unambiguous (``"42"`` or
    ``42.0`` for an integer) and is a problem otherwise (``3.5`` for an integer), never passed on
    silently: the tool would receive a type its schema excludes.
    """
    kinds = schema_kinds(kind)
    if kinds == {"string"}:
        return raw, None
    text = raw.strip()
    value, err = loads(text)
    if err is not None:
        if text in _PY_LITERALS:
            value = _PY_LITERALS[text]
        elif not kinds or "string" in kinds:
            return raw, None
        else:
            return raw, f"{text[:40]!r} is not a {'/'.join(sorted(kinds))}"
    if "string" in kinds and value is not None:  # a union with string: keep the text as written
        return raw, None
    value, problem = coerce(value, kinds)
    return (raw, problem) if problem is not None else (value, None)


@register_parser("qwen3_xml")
class Qwen3XmlParser(ResponseParser):
    """Reasoning first (as Qwen3), then ``<tool_call><function=...><parameter=...>`` calls."""

    @classmethod
    def matches(cls, probe: TemplateProbe) -> bool:
        return f"<function={probe.tool_name}>" in probe.tool_call_turn

    def parse(self, text: str) -> ParsedResponse:
        return self.parse_with_tools(text, None)

    def parse_with_tools(self, text: str, tools: Sequence[dict[str, Any]] | None) -> ParsedResponse:
        if not text.strip():
            return ParsedResponse(content="", issues=[ParseIssue("empty", "no reasoning, content or tool call")])
        split = split_calls(text, OPEN, CLOSE)
        issues, rest, first, content = split.issues, split.rest, split.first, split.content
        types = _param_types(tools)
        calls: list[ToolCall] = []
        pos, index = first, 0
        finder = Finder(rest)
        while pos != -1:
            if index == MAX_CALLS:
                issues.append(too_many_calls("tool calls"))
                break
            start = pos + len(OPEN)
            fn_close = finder.find("</function>", start)  # a value may contain </tool_call>: look after the function
            end, nxt = finder.find(CLOSE, start if fn_close == -1 else fn_close), finder.find(OPEN, start)
            closed = end != -1 and (nxt == -1 or end < nxt)
            stop = end if closed else (len(rest) if nxt == -1 else nxt)
            where = f"tool call {index}"
            if not closed:
                issues.append(ParseIssue("unclosed_tag", f"{where}: {OPEN} is never closed by {CLOSE}"))
            call, more = self._call(rest[start:stop], where, types)
            issues.extend(more)
            if call is not None:
                calls.append(call)
            after = stop + len(CLOSE) if closed else stop
            pos = finder.find(OPEN, after)
            gap = rest[after : len(rest) if pos == -1 else pos]
            if gap.strip():
                kind = "trailing_text" if pos == -1 else "text_between_calls"
                issues.append(ParseIssue(kind, f"after {where}: {gap.strip()[:80]!r}"))
            index += 1
        return check_declared(ParsedResponse(content=content.strip(), reasoning=split.reasoning, tool_calls=calls, issues=issues), tools)

    @staticmethod
    def _call(body: str, where: str, types: dict[str, dict[str, Any]]) -> tuple[ToolCall | None, list[ParseIssue]]:
        issues: list[ParseIssue] = []
        match = _FUNCTION.search(body)
        if match is None or not match.group(1).strip():
            kind = "empty_call" if not body.strip() else "missing_name"
            return None, [ParseIssue(kind, f"{where}: no <function=name> in {body.strip()[:80]!r}")]
        name = match.group(1).strip()
        if (problem := bad_name(name, where)) is not None:
            return None, [problem]
        if body[: match.start()].strip():
            issues.append(ParseIssue("trailing_text", f"{where}: text before <function=>"))
        fn_end = body.find("</function>", match.end())
        if fn_end == -1:
            issues.append(ParseIssue("unclosed_tag", f"{where} ({name}): <function=...> is never closed"))
            fn_end = len(body)
        elif body[fn_end + len("</function>") :].strip():
            issues.append(ParseIssue("trailing_text", f"{where} ({name}): text after </function>"))
        inner = body[match.end() : fn_end]
        args: dict[str, Any] = {}
        bad = False
        params = list(_PARAM.finditer(inner))
        if inner[: params[0].start() if params else len(inner)].strip():
            issues.append(ParseIssue("trailing_text", f"{where} ({name}): text outside <parameter=...>"))
        for k, p in enumerate(params):
            key = p.group(1).strip()
            limit = params[k + 1].start() if k + 1 < len(params) else len(inner)
            close = inner.find("</parameter>", p.end(), limit)
            if close == -1:
                issues.append(ParseIssue("unclosed_tag", f"{where} ({name}): <parameter={key}> is never closed"))
                close, bad = limit, True
            raw = inner[p.end() : close]
            raw = raw[1:] if raw.startswith("\n") else raw
            raw = raw[:-1] if raw.endswith("\n") else raw
            if key in args:
                issues.append(ParseIssue("duplicate_parameter", f"{where} ({name}): {key!r} given twice"))
            value, problem = _convert(raw, types.get(name, {}).get(key))
            if problem:
                issues.append(ParseIssue("bad_value", f"{where} ({name}.{key}): {problem}"))
                bad = True
            args[key] = value
        raw_args = json.dumps(args, ensure_ascii=False)
        if bad:
            return ToolCall(name, None, raw_arguments=raw_args, error="bad_value"), issues
        return ToolCall(name, args, raw_arguments=raw_args), issues
