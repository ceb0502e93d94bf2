"""Chat formats: tokenizer-specific rendering, response parsing and exact token bridging.

``get_chat_format(tokenizer)`` is the entry point; it detects the tool-call family from what the
chat template renders.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from agentrl.chat.base import BridgeResult, ChatFormat
from agentrl.chat.detect import detect_format
from agentrl.chat.parsers import ResponseParser, available_parsers, get_parser, register_parser
from agentrl.chat.types import ParsedResponse, ParseIssue, ToolCall

__all__ = [
    "BridgeResult",
    "ChatFormat",
    "ParseIssue",
    "ParsedResponse",
    "ResponseParser",
    "ToolCall",
    "available_parsers",
    "default_template",
    "get_chat_format",
    "get_parser",
    "register_parser",
]


def default_template() -> str:
    """agentrl's own ChatML + tools template (prefix-preserving, Hermes-style calls)."""
    return files("agentrl.chat").joinpath("templates/chatml_tools.jinja").read_text(encoding="utf-8")


def get_chat_format(
    tokenizer: Any,
    chat_format: str | ChatFormat | None = None,
    chat_template: str | None = None,
) -> ChatFormat:
    """The :class:`ChatFormat` for ``tokenizer``.

    A ChatFormat instance is returned as is; a name picks that parser; otherwise the format is
    detected from what the (override or tokenizer's) template renders, raising a ValueError that
    names the options when the template has no known tool-call syntax.
    """
    if isinstance(chat_format, ChatFormat):
        return chat_format
    name = chat_format if chat_format is not None else detect_format(tokenizer, chat_template)
    return ChatFormat(tokenizer, get_parser(name), chat_template=chat_template, name=name)
