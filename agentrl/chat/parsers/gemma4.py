"""Gemma 4: calls in ``<|tool_call>call:NAME{key:value,...}<tool_call|>``, reasoning on a thought channel.

A turn the model writes looks like::

    <|channel>thought
    Need the weather.
    <channel|><|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|><|tool_response>

Argument values are written as Gemma's template writes them: strings between ``<|"|>`` marks (no
escaping inside), ``true``/``false``, bare numbers, objects with bare keys, lists in brackets.
Generation stops on ``<|tool_response>`` after calls (the environment writes the responses into the
same model turn) and on ``<turn|>`` after an answer.
"""

from __future__ import annotations

import re
from typing import Any

from agentrl.chat.parsers.base import MAX_CALLS, Finder, ResponseParser, TemplateProbe, too_many_calls
from agentrl.chat.parsers.calls import MAX_DEPTH
from agentrl.chat.parsers.reasoning import split_reasoning
from agentrl.chat.parsers.registry import register_parser
from agentrl.core.messages import ParsedResponse, ParseIssue, ToolCall

START, END, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
THOUGHT_OPEN, THOUGHT_CLOSE = "<|channel>thought", "<channel|>"
_NAME = re.compile(r"\s*call:([A-Za-z_][\w.\-]*)\s*\{")
_BARE = re.compile(r"[^,}\]:]*")
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None, "None": None}


class _Bad(Exception):
    """A value that cannot be read; caught inside this module (the parser never raises)."""


@register_parser("gemma4")
class Gemma4Parser(ResponseParser):
    @classmethod
    def matches(cls, probe: TemplateProbe) -> bool:
        return f"{START}call:{probe.tool_name}{{" in probe.tool_call_turn

    def parse(self, text: str) -> ParsedResponse:
        if not text.strip():
            return ParsedResponse(content="", issues=[ParseIssue("empty", "no text")])
        split = split_reasoning(text, THOUGHT_OPEN, THOUGHT_CLOSE)
        issues = list(split.issues)
        if split.reasoning is not None and START in split.reasoning:
            issues.append(ParseIssue("call_in_reasoning", f"{START} inside the thought channel is ignored"))
        rest = split.rest
        content: list[str] = []
        calls: list[ToolCall] = []
        find = Finder(rest)
        pos, attempts = 0, 0
        while True:
            start = find.find(START, pos)
            if start == -1:
                content.append(rest[pos:])
                break
            content.append(rest[pos:start])
            if attempts >= MAX_CALLS:  # malformed calls count too: each one costs an issue
                issues.append(too_many_calls("calls"))
                break
            attempts += 1
            end = find.find(END, start + len(START))
            body = rest[start + len(START) : end if end != -1 else len(rest)]
            where = f"call {len(calls)}"
            if end == -1:
                issues.append(ParseIssue("unclosed_tag", f"{where}: {START} is never closed by {END}"))
            call, problem = parse_call(body)
            if call is not None:
                calls.append(call)
            if problem is not None:
                issues.append(ParseIssue(problem[0], f"{where}: {problem[1]}"))
            if end == -1:
                break
            pos = end + len(END)
        text_out = "".join(content)
        if END in text_out:
            issues.append(ParseIssue("stray_tag", f"{END} without {START}"))
        return ParsedResponse(content=text_out.strip(), reasoning=split.reasoning, tool_calls=calls, issues=issues)


def parse_call(body: str) -> tuple[ToolCall | None, tuple[str, str] | None]:
    """``call:NAME{...}`` -> (call or None, (issue kind, detail) or None); never raises."""
    head = _NAME.match(body)
    if head is None:
        return None, ("missing_name", f"expected call:NAME{{...}}, got {body.strip()[:60]!r}")
    name = head.group(1)
    try:
        args, end = _object(body, head.end(), 1)
    except _Bad as exc:
        return ToolCall(name, None, raw_arguments=body[head.end() - 1 :], error="bad_value"), ("bad_value", f"{name}: {exc}")
    except RecursionError:  # not reached with MAX_DEPTH; kept so a parser never raises
        return ToolCall(name, None, raw_arguments=body[head.end() - 1 :], error="bad_value"), ("bad_value", f"{name}: too deep")
    raw = body[head.end() - 1 : end]
    if body[end:].strip():
        return ToolCall(name, args, raw_arguments=raw), ("trailing_text", f"{name}: {body[end:].strip()[:60]!r} after the call")
    return ToolCall(name, args, raw_arguments=raw), None


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\n":
        i += 1
    return i


def _object(text: str, i: int, depth: int) -> tuple[dict[str, Any], int]:
    """The members of an object whose ``{`` is just before ``i``; returns it and the position after ``}``."""
    if depth > MAX_DEPTH:
        raise _Bad(f"nested more than {MAX_DEPTH} levels")
    out: dict[str, Any] = {}
    i = _skip(text, i)
    if text.startswith("}", i):
        return out, i + 1
    while True:
        i = _skip(text, i)
        if text.startswith(QUOTE, i):
            close = text.find(QUOTE, i + len(QUOTE))
            if close == -1:
                raise _Bad("unclosed quoted key")
            key, i = text[i + len(QUOTE) : close], close + len(QUOTE)
        else:
            colon = _BARE.match(text, i)
            key, i = (colon.group(0).strip(), colon.end()) if colon else ("", i)
        i = _skip(text, i)
        if not key or not text.startswith(":", i):
            raise _Bad(f"expected key:value at {text[i:i + 40]!r}")
        if key in out:
            raise _Bad(f"{key!r} given twice")
        out[key], i = _value(text, i + 1, depth)
        i = _skip(text, i)
        if text.startswith(",", i):
            i += 1
        elif text.startswith("}", i):
            return out, i + 1
        else:
            raise _Bad(f"expected , or }} at {text[i:i + 40]!r}")


def _list(text: str, i: int, depth: int) -> tuple[list[Any], int]:
    if depth > MAX_DEPTH:
        raise _Bad(f"nested more than {MAX_DEPTH} levels")
    out: list[Any] = []
    i = _skip(text, i)
    if text.startswith("]", i):
        return out, i + 1
    while True:
        value, i = _value(text, i, depth)
        out.append(value)
        i = _skip(text, i)
        if text.startswith(",", i):
            i += 1
        elif text.startswith("]", i):
            return out, i + 1
        else:
            raise _Bad(f"expected , or ] at {text[i:i + 40]!r}")


def _value(text: str, i: int, depth: int) -> tuple[Any, int]:
    i = _skip(text, i)
    if text.startswith(QUOTE, i):
        close = text.find(QUOTE, i + len(QUOTE))
        if close == -1:
            raise _Bad("unclosed string")
        return text[i + len(QUOTE) : close], close + len(QUOTE)
    if text.startswith("{", i):
        return _object(text, i + 1, depth + 1)
    if text.startswith("[", i):
        return _list(text, i + 1, depth + 1)
    bare = _BARE.match(text, i)
    token = bare.group(0).strip() if bare else ""
    end = bare.end() if bare else i
    if token in _LITERALS:
        return _LITERALS[token], end
    if _NUMBER.fullmatch(token):
        return (int(token) if token.lstrip("-").isdigit() else float(token)), end
    raise _Bad(f"{token[:40]!r} is not a value" if token else f"no value at {text[i:i + 40]!r}")
