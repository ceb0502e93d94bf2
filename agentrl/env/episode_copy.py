"""Per-episode copies: what ``Environment.spawn()`` and ``Tool`` copies use so episodes never share state.

Concurrent episodes run on copies of one environment. A shallow copy would leave every list, dict
or stateful object of the instance, of its class, and of its tools shared by all episodes (and
tools that are bound methods of the original would write into the original). Here each mutable
attribute is deep-copied, with one memo per episode so that an object reached twice (a tool held in
``tools`` and in an attribute, a bound method of the environment) becomes one per-episode object.

Kept shared, by declaration: attribute names listed in a class's ``shared`` tuple (on the
environment or on a tool), the dataset attributes, ``datasets`` objects, and a tool's concurrency
limiters and caches. What cannot be copied (a lock, a connection) is refused with one line that
names the attribute and says what to do.
"""

from __future__ import annotations

import asyncio
import copy
import enum
import types
from collections.abc import Iterable
from typing import Any

from agentrl.core.errors import UserError

IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), range, type(Ellipsis), type(NotImplemented))
# Objects deepcopy treats as atomic, or that are code rather than state; the event loop every
# episode runs on is the engine's, never an episode's.
ATOMIC = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, property, staticmethod, classmethod, asyncio.AbstractEventLoop)


class SpawnError(UserError, TypeError):
    """An attribute of an environment or tool cannot be given to each episode on its own."""


def is_immutable(value: Any) -> bool:
    """True for values no episode can change in place (numbers, strings, tuples of such, enums, code)."""
    if isinstance(value, (*IMMUTABLE, *ATOMIC, enum.Enum)):
        return True
    if type(value) in (tuple, frozenset):
        return all(is_immutable(v) for v in value)
    return False


def is_dataset(value: Any) -> bool:
    """A ``datasets`` Dataset / DatasetDict / IterableDataset: read-only task data, shared by design."""
    return type(value).__module__.split(".")[0] == "datasets"


def shared_names(cls: type) -> set[str]:
    """Every name listed in ``shared`` by ``cls`` or a base class."""
    names: set[str] = set()
    for klass in cls.__mro__:
        names.update(klass.__dict__.get("shared", ()))
    return names


def _copy_value(owner: Any, name: str, value: Any, memo: dict[int, Any]) -> Any:
    try:
        return copy.deepcopy(value, memo)
    except SpawnError:
        raise
    except Exception as exc:
        kind = "tool" if hasattr(owner, "tool_name") else "environment"
        raise SpawnError(
            f"{type(owner).__name__}.{name} ({type(value).__name__}) cannot be copied for each concurrent episode "
            f"({type(exc).__name__}: {exc}); create it in reset(), or list {name!r} in the {kind} class's "
            f"`shared = (...)` if every episode may use the same object"
        ) from None


def class_state(cls: type, skip: Iterable[str]) -> dict[str, Any]:
    """Mutable plain values defined on ``cls`` or its bases (a class-level ``seen = []``), by name."""
    skip = set(skip)
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__[:-1]):  # object last out; subclasses override bases
        for name, value in vars(klass).items():
            if name.startswith("__") or name in skip:
                continue
            if is_immutable(value) or isinstance(value, ATOMIC) or _is_descriptor(value):
                found.pop(name, None)
                continue
            found[name] = value
    return found


def _is_descriptor(value: Any) -> bool:
    return hasattr(type(value), "__get__") and not isinstance(value, types.MethodType)


def per_episode_copy(
    obj: Any, memo: dict[int, Any], *, keep: Iterable[str] = (), reset: dict[str, Any] | None = None
) -> Any:
    """A copy of ``obj`` whose mutable instance and class attributes are its own.

    ``keep``: names shared with ``obj`` on top of the class's ``shared``; ``reset``: names set to
    a value in the copy instead of copied (a finished episode's record).
    """
    shared = shared_names(type(obj)) | set(keep)
    reset = reset or {}
    clone = copy.copy(obj)
    memo[id(obj)] = clone
    for value in _shared_values(obj, shared):
        memo.setdefault(id(value), value)
    for name, value in list(vars(obj).items()):
        if name in reset:
            clone.__dict__[name] = reset[name]
        elif name in shared or is_immutable(value) or is_dataset(value):
            continue
        else:
            clone.__dict__[name] = _copy_value(obj, name, value, memo)
    for name, value in class_state(type(obj), skip=shared | set(vars(obj)) | set(reset)).items():
        clone.__dict__[name] = _copy_value(obj, name, value, memo)
    return clone


def _shared_values(obj: Any, shared: set[str]) -> list[Any]:
    out = []
    for name in shared:
        if name in vars(obj):
            out.append(vars(obj)[name])
        else:
            value = getattr(type(obj), name, None)
            if value is not None:
                out.append(value)
    return out
