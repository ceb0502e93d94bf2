"""Chat formats: tokenizer-specific rendering, response parsing and exact token bridging.

``get_chat_format(tokenizer)`` is the entry point; it detects the tool-call family from what the
chat template renders. ``available_formats()`` lists the names it accepts as an override.
"""

from __future__ import annotations

from importlib.resources import files

from agentrl.chat import families as _families  # noqa: F401  (registers the built-in formats)
from agentrl.chat import families_recent as _families_recent  # noqa: F401  (and those added in issue 42)
from agentrl.chat.base import BridgeResult, ChatFormat
from agentrl.chat.detect import detect_format
from agentrl.chat.formats import FormatSpec, available_formats, format_spec, register_format
from agentrl.chat.parsers import ResponseParser, available_parsers, get_parser, register_parser
from agentrl.chat.select import get_chat_format
from agentrl.core.messages import ParsedResponse, ParseIssue, ToolCall

__all__ = [
    "BridgeResult",
    "ChatFormat",
    "FormatSpec",
    "ParseIssue",
    "ParsedResponse",
    "ResponseParser",
    "ToolCall",
    "available_formats",
    "available_parsers",
    "detect_format",
    "format_spec",
    "default_template",
    "get_chat_format",
    "get_parser",
    "register_format",
    "register_parser",
]


def default_template() -> str:
    """agentrl's own ChatML + tools template (prefix-preserving, Hermes-style calls)."""
    return files("agentrl.chat").joinpath("templates/chatml_tools.jinja").read_text(encoding="utf-8")
