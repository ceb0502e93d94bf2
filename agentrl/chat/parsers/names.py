"""Tool names and argument values checked against the grammar and the tool schemas of the prompt.

A parser reads a name where the family's syntax puts it; that text is only a name if it looks like
one (a JSON object read as a name is a misread call, not a tool to look up), and only a declared
tool if the prompt declared it. Argument values must be JSON values, typed as the schema says where
the family writes them untyped. Everything here reports problems as issues and never raises.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.core.messages import ParsedResponse, ParseIssue

# What any family accepts as a function name: OpenAI's ``[A-Za-z0-9_-]`` plus the namespace
# separators real tool sets use (``brave_search.call``, ``server:tool``, ``ns/tool``).
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-:/]{0,255}")


def bad_name(name: str, where: str, grammar: re.Pattern[str] = NAME) -> ParseIssue | None:
    """A ``bad_name`` issue when ``name`` is not a function name of the family's grammar."""
    if grammar.fullmatch(name):
        return None
    return ParseIssue("bad_name", f"{where}: {name[:60]!r} is not a function name")


def declared_names(tools: Sequence[Any] | None) -> set[str]:
    """The function names the prompt declared (OpenAI-style or bare function schemas)."""
    out: set[str] = set()
    for tool in tools or []:
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out.add(fn["name"])
    return out


Alias = Callable[[str, set[str]], str | None]


def check_declared(result: ParsedResponse, tools: Sequence[Any] | None, alias: Alias | None = None) -> ParsedResponse:
    """Report calls to tools the prompt never declared (the call is kept, so the dispatcher answers
    "unknown tool" and the model can learn from it); a family's documented ``alias`` that maps a name
    to a declared one is applied and reported as ``name_aliased``. No tools: nothing to check."""
    declared = declared_names(tools)
    if not declared:
        return result
    for k, call in enumerate(result.tool_calls):
        if call.name in declared:
            continue
        target = alias(call.name, declared) if alias is not None else None
        if target is not None:
            result.issues.append(ParseIssue("name_aliased", f"tool call {k}: {call.name!r} read as the declared {target!r}"))
            call.name = target
        else:
            result.issues.append(ParseIssue("undeclared_tool", f"tool call {k}: {call.name!r} is not a declared tool"))
    return result


# ----------------------------------------------------------------------------- values
_JSON_SCALARS = (str, bool, int, type(None))


def json_value(value: Any) -> tuple[Any, str | None]:
    """``value`` as a plain JSON value (tuples become lists), or ``(None, why)`` when it holds
    something JSON has no form for (a set, bytes, a complex number, NaN, a non-string key).

    Iterative, so a deep value cannot overflow the stack (depth is bounded by the callers).
    """
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]  # (value, container to write into, key)
    while stack:
        item, parent, key = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return None, f"{item!r} is not a JSON number"
            parent[key] = item
        elif isinstance(item, _JSON_SCALARS):
            parent[key] = item
        elif isinstance(item, (list, tuple)):
            out: list[Any] = [None] * len(item)
            parent[key] = out
            stack.extend((child, out, i) for i, child in enumerate(item))
        elif isinstance(item, dict):
            obj: dict[str, Any] = {}
            parent[key] = obj
            for k, child in item.items():
                if not isinstance(k, str):
                    return None, f"the key {k!r} is not a string"
                obj[k] = None
                stack.append((child, obj, k))
        else:
            return None, f"a {type(item).__name__} is not a JSON value"
    return root[0], None


def schema_kinds(kind: Any) -> set[str]:
    """A JSON-schema ``type`` (a name or a list of names) as a set."""
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    return {kind} if isinstance(kind, str) else set()


def _is(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return {
        "string": isinstance(value, str),
        "boolean": isinstance(value, bool),
        "null": value is None,
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
    }.get(kind, True)  # a type name this check does not know is not held against the value


_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_BOOLEANS = {"true": True, "false": False}


def coerce(value: Any, kinds: set[str]) -> tuple[Any, str | None]:
    """``value`` fitted to the schema's types where the intent is unambiguous: a numeric string for a
    number, ``3.0`` for an integer, ``"true"`` for a boolean; otherwise ``(value, why not)``."""
    if not kinds or any(_is(value, k) for k in kinds):
        return value, None
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()) and kinds & {"integer", "number"}:
        number: Any = float(value) if any(c in value for c in ".eE") else int(value)
        if "integer" in kinds and isinstance(number, float) and number.is_integer() and math.isfinite(number):
            return int(number), None
        if any(_is(number, k) for k in kinds):
            return number, None
    if isinstance(value, float) and "integer" in kinds and value.is_integer():
        return int(value), None
    if isinstance(value, str) and value.strip().lower() in _BOOLEANS and "boolean" in kinds:
        return _BOOLEANS[value.strip().lower()], None
    shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return value, f"{shown[:40]} is not a {'/'.join(sorted(kinds))}"
