"""Turning the JSON text of one tool call into a :class:`ToolCall`, shared by JSON-call families.

Hermes/Qwen (``{"name", "arguments"}``), Llama 3 (``{"name", "parameters"}``) and Mistral (a list of
such objects) all write calls as JSON objects; only the framing around them differs. This module
owns the part they share: strict-ish decoding, argument normalisation, and salvaging a name and the
raw argument text from broken JSON so the model can be told exactly what was wrong.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentrl.chat.parsers.names import bad_name
from agentrl.core.messages import ParseIssue, ToolCall

# strict=False: literal newlines/tabs inside strings (common when models write code) are accepted;
# the call is re-serialised by the template anyway.
_DECODER = json.JSONDecoder(strict=False)
ARGUMENT_KEYS = ("arguments", "parameters")
_NAME_RE = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"', re.DOTALL)
_ARGS_RE = re.compile(r'"(?:arguments|parameters)"\s*:\s*')


# Arguments nested deeper than this are refused as a decoding error: no tool takes them, and a value
# a thousand levels deep breaks every recursive consumer after the parser (json.dumps, pydantic,
# deepcopy), so it must not leave the parser as data.
MAX_DEPTH = 64


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests lists/dicts more than ``limit`` levels (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


_TOO_DEEP = f"ValueError: JSON nested more than {MAX_DEPTH} levels deep"


def loads(text: str) -> tuple[Any, str | None]:
    """``json.loads`` that returns ``(value, None)`` or ``(None, error)`` and never raises.

    A value nested more than :data:`MAX_DEPTH` levels is an error too (see there).
    """
    try:
        value = _DECODER.decode(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        return None, f"{type(exc).__name__}: {exc}"[:300]
    return (None, _TOO_DEEP) if too_deep(value) else (value, None)


def raw_decode(text: str, start: int, end: int | None = None) -> tuple[Any, int] | None:
    """Decode one JSON value starting at ``start`` (and ending by ``end``); ``(value, end)`` or None.

    Never raises. Pass ``end`` when decoding at many places of one long text: a decoding error
    counts the lines from the start of the string it was given, which is quadratic over a long
    text full of broken calls unless each attempt sees only its own window.
    """
    try:
        if end is None:
            value, stop = _DECODER.raw_decode(text, start)
        else:
            value, stop = _DECODER.raw_decode(text[start:end])
            stop += start
    except (ValueError, RecursionError):
        return None
    return None if too_deep(value) else (value, stop)


def salvage_name(text: str) -> str | None:
    """The ``"name"`` string of a call whose JSON does not parse, if one can be read."""
    match = _NAME_RE.search(text)
    if not match:
        return None
    value, err = loads(f'"{match.group(1)}"')
    name = value if err is None and isinstance(value, str) else match.group(1)
    return name.strip() or None


def salvage_arguments(text: str) -> str | None:
    """The text after ``"arguments":`` (or ``"parameters":``) of a broken call, best effort."""
    match = _ARGS_RE.search(text)
    if not match:
        return None
    decoded = raw_decode(text, match.end())
    if decoded is not None:
        return text[match.end() : decoded[1]]
    rest = text[match.end() :].rstrip()
    if text.lstrip().startswith("{") and rest.endswith("}"):
        rest = rest[:-1].rstrip()  # the call object's own closing brace
    return rest


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def call_from_object(obj: Any, where: str) -> tuple[ToolCall | None, list[ParseIssue]]:
    """Build a call from an already decoded JSON value (``where`` names it in issue details)."""
    if not isinstance(obj, dict):
        return None, [ParseIssue("not_an_object", f"{where}: expected a JSON object, got {type(obj).__name__}")]
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, [ParseIssue("missing_name", f"{where}: no string 'name' in {_short(json.dumps(obj))}")]
    if (problem := bad_name(name, where)) is not None:
        return None, [problem]
    call_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    key = next((k for k in ARGUMENT_KEYS if k in obj), None)
    args: Any = obj[key] if key else {}
    if isinstance(args, str):
        decoded, err = loads(args)
        if err is not None:
            issue = ParseIssue("bad_json", f"{where} ({name}): arguments string is not JSON: {err}")
            return ToolCall(name, None, id=call_id, raw_arguments=args, error="bad_json"), [issue]
        raw, args = args, decoded
    else:
        raw = json.dumps(args, ensure_ascii=False)
    if not isinstance(args, dict):
        issue = ParseIssue("arguments_not_object", f"{where} ({name}): arguments is {type(args).__name__}")
        return ToolCall(name, None, id=call_id, raw_arguments=raw, error="arguments_not_object"), [issue]
    return ToolCall(name, args, id=call_id, raw_arguments=raw), []


def call_from_json(text: str, where: str) -> tuple[ToolCall | None, list[ParseIssue]]:
    """Decode the JSON text of one call object.

    Bad JSON still yields a call (``arguments=None``, ``error="bad_json"``) when a name can be
    salvaged, so the dispatcher can answer "your JSON was invalid" instead of silently dropping it.
    """
    body = text.strip()
    if not body:
        return None, [ParseIssue("empty_call", f"{where}: no JSON inside the call")]
    obj, err = loads(body)
    if err is None:
        call, issues = call_from_object(obj, where)
        if call is not None and isinstance(obj, dict) and any(isinstance(obj.get(k), dict) for k in ARGUMENT_KEYS):
            call.raw_arguments = salvage_arguments(body) or call.raw_arguments  # the exact text written
        return call, issues
    name = salvage_name(body)
    if name is None:
        return None, [ParseIssue("bad_json", f"{where}: {err}; no tool name could be recovered")]
    if (problem := bad_name(name, where)) is not None:
        return None, [ParseIssue("bad_json", f"{where}: {err}"), problem]
    raw = salvage_arguments(body)
    call = ToolCall(name, None, raw_arguments=body if raw is None else raw, error="bad_json")
    return call, [ParseIssue("bad_json", f"{where} ({name}): {err}")]


def call_body(piece: str, begin: str, end: str, where: str) -> tuple[str, list[ParseIssue]]:
    """The text of one call before its ``end`` tag (the whole piece when unclosed), and the issues of a
    missing ``end`` or of text after it: what every begin/end-tag family checks first."""
    issues: list[ParseIssue] = []
    stop = piece.find(end)
    if stop == -1:
        issues.append(ParseIssue("unclosed_tag", f"{where}: {begin} is never closed by {end}"))
    elif piece[stop + len(end) :].strip():
        issues.append(ParseIssue("text_between_calls", f"after {where}: {piece[stop + len(end):].strip()[:80]!r}"))
    return (piece if stop == -1 else piece[:stop]), issues
