"""Do two concurrent episodes of an environment share mutable state? ``check_env``'s isolation check.

Two ways to find out, both on two instances from ``spawn()``:
- by structure: every list, dict, set or object reachable from one episode's attributes, class
  attributes, tools and rewards must not be reachable from the other's, except what is shared by
  declaration (datasets, ``shared`` names, the tools' limiters);
- by behaviour: the episodes are interleaved (reset A, reset B, step A with a call to every tool,
  step B likewise) and nothing the other episode can reach, the state its tool functions keep in
  closures and module globals included, may change while only one episode acts.
A tool that is a bound method of the environment ``spawn()`` was called on is named directly.
"""

from __future__ import annotations

import sys
import types
from collections import deque
from collections.abc import Iterator
from typing import Any

from agentrl.env.episode_copy import ATOMIC, is_dataset, is_immutable, shared_names

MAX_OBJECTS = 20000
_TOOL_COMMON = {"_limiters", "_thread_budget", "_schema", "_args_model"}
# Libraries whose functions' module globals are not episode state (and far too large to walk).
_NOT_USER_CODE = {"agentrl", "torch", "transformers", "anyio", "pydantic", "datasets", "numpy", "tokenizers"}


def _owned_items(obj: Any) -> Iterator[tuple[str, Any]]:
    """An object's own attributes minus what its class declares shared (and a tool's limiters)."""
    attrs = getattr(obj, "__dict__", None)
    if not isinstance(attrs, dict):
        return
    skip = shared_names(type(obj))
    if hasattr(obj, "tool_name"):
        skip |= _TOOL_COMMON
    for name, value in attrs.items():
        if name not in skip:
            yield f".{name}", value


def _children(obj: Any, follow_code: bool) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield f"[{k!r}]", v
    elif isinstance(obj, list | tuple | deque):
        for i, v in enumerate(obj):
            yield f"[{i}]", v
    elif isinstance(obj, set | frozenset):
        for v in obj:
            yield "{…}", v
    elif isinstance(obj, types.MethodType):
        yield ".__self__", obj.__self__
        yield ".__func__", obj.__func__
    elif isinstance(obj, types.FunctionType):
        if (
            not follow_code
            or obj.__module__
            and obj.__module__.split(".")[0] in _NOT_USER_CODE | set(sys.stdlib_module_names)
        ):
            return
        for cell, name in zip(obj.__closure__ or (), obj.__code__.co_freevars):
            try:
                yield f" (closure {name})", cell.cell_contents
            except ValueError:  # an empty cell
                continue
        for name in _global_names(obj.__code__):
            if name in obj.__globals__:
                yield f" (global {obj.__module__}.{name})", obj.__globals__[name]
    elif not isinstance(obj, ATOMIC):
        yield from _owned_items(obj)
        cls_state = {n for k in type(obj).__mro__ for n, v in vars(k).items() if not n.startswith("__")}
        for name in sorted(cls_state - set(getattr(obj, "__dict__", {}) or {}) - shared_names(type(obj))):
            value = getattr(type(obj), name, None)
            if isinstance(value, dict | list | set | bytearray) and name != "train_defaults":
                yield f".{name} (class attribute)", value


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def reachable(root: Any, label: str, follow_code: bool) -> dict[int, tuple[str, Any]]:
    """Mutable objects reachable from ``root`` (id -> (path, object)), declared-shared ones left out."""
    seen: dict[int, tuple[str, Any]] = {}
    visited: set[int] = set()
    queue: deque[tuple[str, Any]] = deque([(label, root)])
    while queue and len(visited) < MAX_OBJECTS:
        path, obj = queue.popleft()
        if (
            id(obj) in visited
            or is_dataset(obj)
            or isinstance(obj, type | types.ModuleType | types.BuiltinFunctionType)
        ):
            continue
        code = isinstance(obj, types.FunctionType | types.MethodType)
        if is_immutable(obj) and not code:
            continue
        visited.add(id(obj))
        if _has_state(obj):  # code is walked, not compared: the same function in two episodes is fine
            seen[id(obj)] = (path, obj)
        for step, child in _children(obj, follow_code):
            queue.append((path + step, child))
    return seen


def _has_state(obj: Any) -> bool:
    """Containers and objects with attributes; not code, and not objects deepcopy keeps as they are."""
    if isinstance(obj, dict | list | set | deque | bytearray):
        return True
    if isinstance(obj, types.FunctionType | types.MethodType | tuple | frozenset):
        return False
    return isinstance(getattr(obj, "__dict__", None), dict)


def _leaf(value: Any) -> Any:
    return ("v", type(value).__name__, repr(value)) if is_immutable(value) else ("obj", id(value))


def signature(obj: Any) -> Any:
    """What changes when ``obj`` is changed in place (its items or attributes, by value or identity)."""
    if isinstance(obj, dict):
        return tuple((_leaf(k), _leaf(v)) for k, v in obj.items())
    if isinstance(obj, list | tuple | deque):
        return tuple(_leaf(v) for v in obj)
    if isinstance(obj, set | frozenset):
        return tuple(sorted(repr(_leaf(v)) for v in obj))
    if isinstance(obj, bytearray):
        return bytes(obj)
    if isinstance(obj, types.FunctionType | types.MethodType):
        return None
    return tuple((name, _leaf(v)) for name, v in _owned_items(obj))


def snapshot(root: Any) -> dict[int, tuple[str, Any]]:
    """Signatures of everything an episode can reach, code-held state included."""
    return {k: (path, signature(obj)) for k, (path, obj) in reachable(root, "env", follow_code=True).items()}


def changed(before: dict[int, tuple[str, Any]], after: dict[int, tuple[str, Any]]) -> list[str]:
    return [path for k, (path, sig) in before.items() if k in after and after[k][1] != sig]


def shared_between(a: Any, b: Any) -> list[str]:
    """Paths of mutable objects both episodes reach through their attributes, tools and rewards."""
    mine = reachable(a, "env", follow_code=False)
    theirs = reachable(b, "env", follow_code=False)
    return sorted({path for k, (path, _) in mine.items() if k in theirs and k not in (id(a), id(b))}, key=len)


def bound_to(env: Any, base: Any) -> list[str]:
    """Names of ``env``'s tools and rewards that are bound methods of ``base`` (the spawned-from instance)."""
    out = []
    for kind, items in (("tool", getattr(env, "tools", ())), ("reward", getattr(env, "rewards", ()))):
        for item in items:
            fn = getattr(item, "fn", None)
            if isinstance(fn, types.MethodType) and fn.__self__ is base:
                out.append(f"{kind} {getattr(item, 'tool_name', None) or getattr(item, 'name', '?')!r}")
    return out
