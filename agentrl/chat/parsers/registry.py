"""Name -> parser class registry, so a new model family is one module with one decorator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from agentrl.chat.parsers.base import ResponseParser
from agentrl.core.registry import Registry

_REGISTRY: Registry[type[ResponseParser]] = Registry("parser")

P = TypeVar("P", bound=type[ResponseParser])


def register_parser(name: str) -> Callable[[P], P]:
    """Class decorator: make a :class:`ResponseParser` available as ``get_parser(name)``."""

    def decorate(cls: P) -> P:
        _REGISTRY.add(name, cls, same=lambda old, new: old is new)
        cls.name = name
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
