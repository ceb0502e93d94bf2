"""Name -> parser class registry, so a new model family is one module with one decorator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from agentrl.chat.parsers.base import ResponseParser

_REGISTRY: dict[str, type[ResponseParser]] = {}

P = TypeVar("P", bound=type[ResponseParser])


def register_parser(name: str) -> Callable[[P], P]:
    """Class decorator: make a :class:`ResponseParser` available as ``get_parser(name)``."""

    def decorate(cls: P) -> P:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"a parser named {name!r} is already registered ({_REGISTRY[name].__qualname__})")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def get_parser(name: str, **options: Any) -> ResponseParser:
    """A new parser instance of the family ``name``; ``options`` go to its constructor."""
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown chat format / parser {name!r}; available: {available_parsers()}") from None
    return cls(**options)


def available_parsers() -> list[str]:
    return sorted(_REGISTRY)


def parser_classes() -> dict[str, type[ResponseParser]]:
    """A copy of the registry (detection iterates over it)."""
    return dict(_REGISTRY)
