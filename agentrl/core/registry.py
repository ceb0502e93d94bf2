"""The one name -> object registry behind losses, aggregations, parsers, chat formats and environments.

A ``dict`` (so ``name in R``, ``R[name]`` and iteration read as before) with one way to add an
entry (a second, different object under a taken name is an error unless ``overwrite``) and one way
to look one up (an unknown name names the kind, the closest known name and every known name).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from agentrl.core.errors import UserError

T = TypeVar("T")

__all__ = ["Registry", "UnknownName"]


class UnknownName(UserError, LookupError):
    """No entry of a registry has this name."""


class Registry(dict[str, T], Generic[T]):
    """Entries of one ``kind`` (``"loss"``, ``"chat format"``, ...) by name."""

    def __init__(self, kind: str, error: type[Exception] = UnknownName) -> None:
        super().__init__()
        self.kind, self.error = kind, error

    def copy(self) -> Registry[T]:  # type: ignore[override]
        """A registry of the same kind with the same entries (tests register into a copy)."""
        out: Registry[T] = Registry(self.kind, self.error)
        out.update(self)
        return out

    def add(self, name: str, obj: T, *, overwrite: bool = False, same: Callable[[Any, Any], bool] | None = None) -> T:
        """Register ``obj`` as ``name``; registering the same object again is a no-op."""
        old = self.get(name)
        if name in self and not overwrite and old is not obj and not (same or _equal)(old, obj):
            raise ValueError(f"a {self.kind} named {name!r} is already registered ({_describe(old)})")
        self[name] = obj
        return obj

    def lookup(self, name: str, known: list[str] | None = None) -> T:
        """The entry ``name``, or ``error`` with a did-you-mean and the known names (``known``: the
        names to list, when more exist than this registry holds, such as installed plugins)."""
        if name in self:
            return self[name]
        raise self.error(self.unknown(name, known))

    def unknown(self, name: Any, known: list[str] | None = None) -> str:
        """The message for an unknown ``name``."""
        names = sorted(self) if known is None else known
        close = difflib.get_close_matches(str(name), names, n=1) if isinstance(name, str) else []
        hint = f" (did you mean {close[0]}?)" if close else ""
        return f"unknown {self.kind} {name!r}{hint}; known: {', '.join(names)}"


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - objects whose == raises are simply not equal
        return False


def _describe(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__name__
