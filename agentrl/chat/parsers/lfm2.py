"""LFM2 / LFM2.5 (Liquid AI): Python-style calls in one block.

The model writes (after an optional ``<think>...</think>``)::

    Let me check.<|tool_call_start|>[get_weather(city='Paris', days=3), search(q='x')]<|tool_call_end|>

Values are written as the template writes them: strings raw between single quotes (no escaping),
objects as JSON, everything else as Python writes it (``True``, ``None``, ``1.5``, ``['a', 'b']``).
A string holding ``', name=`` cannot be told from two arguments: that is the family's own quoting.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any

from agentrl.chat.parsers.base import MAX_CALLS, Finder, ResponseParser, TemplateProbe, too_many_calls
from agentrl.chat.parsers.calls import MAX_DEPTH, raw_decode, too_deep
from agentrl.chat.parsers.names import json_value
from agentrl.chat.parsers.reasoning import split_reasoning
from agentrl.chat.parsers.registry import register_parser
from agentrl.core.messages import ParsedResponse, ParseIssue, ToolCall

START, END = "<|tool_call_start|>", "<|tool_call_end|>"
_NAME = re.compile(r"\s*([A-Za-z_][\w.\-]*)\s*\(")
_KEY = re.compile(r"\s*([A-Za-z_]\w*)\s*=\s*")
# A quote closes a string only where the argument list goes on: ", key=" or ")" (then "," / "]" / end).
_STRING_END = re.compile(r"[ \t]{0,8}(?:,[ \t]{0,8}[A-Za-z_]\w*[ \t]{0,8}=|\)[ \t]{0,8}(?:,|\]|$))")
_BARE = re.compile(r"[^,)\]]*")
# Newer templates (LFM2 v2, LFM2.5-VL) escape backslash, quote, newline and CR inside a string;
# older ones (LFM2.5) write it raw. A string is read escaped when it closes that way, else raw.
_ESCAPES = {"\\\\": "\\", "\\'": "'", '\\"': '"', "\\n": "\n", "\\r": "\r"}
_UNESCAPE = re.compile(r"\\[\\'\"nr]")
_ESCAPED_STOP = {q: re.compile(r"\\.|" + q, re.DOTALL) for q in "'\""}
_LITERALS = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None}


@register_parser("lfm2")
class Lfm2Parser(ResponseParser):
    @classmethod
    def matches(cls, probe: TemplateProbe) -> bool:
        return f"{START}[{probe.tool_name}(" in probe.tool_call_turn

    def parse(self, text: str) -> ParsedResponse:
        if not text.strip():
            return ParsedResponse(content="", issues=[ParseIssue("empty", "no text")])
        split = split_reasoning(text)
        issues = list(split.issues)
        rest = split.rest
        if split.reasoning is not None and START in split.reasoning:
            issues.append(ParseIssue("call_in_reasoning", f"{START} inside the reasoning block is ignored"))
        content: list[str] = []
        calls: list[ToolCall] = []
        find = Finder(rest)
        pos, blocks = 0, 0
        while True:
            start = find.find(START, pos)
            if start == -1:
                content.append(rest[pos:])
                break
            content.append(rest[pos:start])
            end = find.find(END, start + len(START))
            if end == -1:
                issues.append(ParseIssue("unclosed_tag", f"{START} is never closed by {END}"))
                body, pos = rest[start + len(START) :], len(rest)
            else:
                body, pos = rest[start + len(START) : end], end + len(END)
            if len(calls) >= MAX_CALLS or blocks >= MAX_CALLS:  # malformed blocks count too: each costs an issue
                issues.append(too_many_calls("calls"))
                break
            blocks += 1
            got, more = parse_call_list(body, f"call block {len(calls)}")
            calls += got[: MAX_CALLS - len(calls)]
            issues += more
            if end == -1:
                break
        text_out = "".join(content)
        if END in text_out:
            issues.append(ParseIssue("stray_tag", f"{END} without {START}"))
        return ParsedResponse(content=text_out.strip(), reasoning=split.reasoning, tool_calls=calls, issues=issues)


def parse_call_list(body: str, where: str) -> tuple[list[ToolCall], list[ParseIssue]]:
    """``[f(a=1), g()]`` -> calls; never raises. Each call that cannot be read is an issue."""
    text = body.strip()
    if not text:
        return [], [ParseIssue("empty_call", f"{where}: nothing between the call tags")]
    if not text.startswith("["):
        return [], [ParseIssue("not_a_list", f"{where}: calls are not a [...] list: {text[:80]!r}")]
    calls: list[ToolCall] = []
    issues: list[ParseIssue] = []
    i = 1
    while True:
        while i < len(text) and text[i] in " \t\n,":
            i += 1
        if i >= len(text):
            issues.append(ParseIssue("unclosed_tag", f"{where}: the call list has no closing ]"))
            return calls, issues
        if text[i] == "]":
            if text[i + 1 :].strip():
                issues.append(ParseIssue("trailing_text", f"{where}: {text[i + 1 :].strip()[:80]!r} after the list"))
            if not calls and not issues:
                issues.append(ParseIssue("empty_call", f"{where}: an empty call list"))
            return calls, issues
        if len(calls) >= MAX_CALLS:
            issues.append(too_many_calls("calls"))
            return calls, issues
        name = _NAME.match(text, i)
        if name is None:
            issues.append(ParseIssue("missing_name", f"{where}: expected name(...) at {text[i:i + 60]!r}"))
            return calls, issues
        call, i = _arguments(text, name.end(), name.group(1), f"{where}, call {len(calls)}", issues)
        calls.append(call)
        if call.error is not None:
            return calls, issues  # the rest of the list cannot be located reliably


def _arguments(text: str, i: int, name: str, where: str, issues: list[ParseIssue]) -> tuple[ToolCall, int]:
    """Read ``key=value, ...)`` from ``i``; the call and the position after its ``)``."""
    args: dict[str, Any] = {}
    start = i
    while True:
        while i < len(text) and text[i] in " \t\n":
            i += 1
        if i < len(text) and text[i] == ")":
            return ToolCall(name, args, raw_arguments=text[start:i]), i + 1
        key = _KEY.match(text, i)
        if key is None:
            issues.append(ParseIssue("bad_value", f"{where} ({name}): expected key=value at {text[i:i + 60]!r}"))
            return ToolCall(name, None, raw_arguments=text[start:], error="bad_value"), len(text)
        value, i, problem = _value(text, key.end())
        if problem is not None:
            issues.append(ParseIssue("bad_value", f"{where} ({name}) argument {key.group(1)!r}: {problem}"))
            return ToolCall(name, None, raw_arguments=text[start:], error="bad_value"), len(text)
        if key.group(1) in args:
            issues.append(ParseIssue("duplicate_parameter", f"{where} ({name}): {key.group(1)!r} given twice"))
        args[key.group(1)] = value
        while i < len(text) and text[i] in " \t\n":
            i += 1
        if i < len(text) and text[i] == ",":
            i += 1
        elif i >= len(text) or text[i] != ")":
            issues.append(ParseIssue("bad_value", f"{where} ({name}): expected , or ) at {text[i:i + 60]!r}"))
            return ToolCall(name, None, raw_arguments=text[start:], error="bad_value"), len(text)


def _value(text: str, i: int) -> tuple[Any, int, str | None]:
    """One argument value at ``i``: (value, position after it, problem or None)."""
    if i >= len(text):
        return None, i, "no value"
    first = text[i]
    if first in "'\"":
        close = _string_end(text, i + 1, first, escaped=True)
        if close is not None:
            return _UNESCAPE.sub(lambda m: _ESCAPES[m.group(0)], text[i + 1 : close]), close + 1, None
        close = _string_end(text, i + 1, first, escaped=False)
        if close is None:
            return None, i, "unclosed string"
        return text[i + 1 : close], close + 1, None
    if first in "{[":
        end = _balanced(text, i)
        if end is None:
            return None, i, f"unbalanced {first}"
        decoded = raw_decode(text, i, end)
        if decoded is not None and decoded[1] == end:
            return decoded[0], end, None
        try:
            value = ast.literal_eval(text[i:end])
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
            return None, i, f"not a literal: {type(exc).__name__}"
        if too_deep(value):
            return None, i, f"nested more than {MAX_DEPTH} levels"
        value, problem = json_value(value)  # a Python literal may be a set, bytes, a complex number
        return (None, i, problem) if problem is not None else (value, end, None)
    bare = _BARE.match(text, i)
    token = bare.group(0).strip() if bare else ""
    end = bare.end() if bare else i
    if token in _LITERALS:
        return _LITERALS[token], end, None
    try:
        return int(token), end, None
    except ValueError:
        pass
    try:
        number = float(token)
    except ValueError:
        return None, i, f"{token[:40]!r} is not a value"
    if not math.isfinite(number):  # float() reads 'nan' and 'inf', which JSON has no form for
        return None, i, f"{token[:40]!r} is not a JSON number"
    return number, end, None


def _string_end(text: str, at: int, quote: str, escaped: bool) -> int | None:
    """Where the string opened before ``at`` closes: the first quote (not backslash-escaped, if
    ``escaped``) after which the argument list goes on."""
    stop = _ESCAPED_STOP[quote] if escaped else re.compile(re.escape(quote))
    while True:
        hit = stop.search(text, at)
        if hit is None:
            return None
        if hit.group(0) != quote:  # an escaped character
            at = hit.end()
            continue
        close = hit.start()
        if _STRING_END.match(text, close + 1) or (close + 1 == len(text)):
            return close
        at = close + 1


def _balanced(text: str, i: int) -> int | None:
    """The end of the bracketed value starting at ``i`` (quotes respected), or None."""
    depth = 0
    quote = ""
    k = i
    while k < len(text):
        ch = text[k]
        if quote:
            if ch == "\\":
                k += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "{[":
            depth += 1
            if depth > MAX_DEPTH:
                return None
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return k + 1
        k += 1
    return None
