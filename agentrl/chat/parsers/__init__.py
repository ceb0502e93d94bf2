"""Response parsers, one module per tool-call syntax family.

Adding a family (Llama 3 bare JSON, Mistral ``[TOOL_CALLS]``, Qwen3.5 XML parameters...) means one
module that subclasses :class:`ResponseParser`, decorates it with :func:`register_parser`, reuses
:mod:`.calls` / :mod:`.reasoning` where it can, and is imported below.
"""

from agentrl.chat.parsers.base import ResponseParser, TemplateProbe
from agentrl.chat.parsers.registry import available_parsers, get_parser, parser_classes, register_parser

# Built-in families register themselves on import.
from agentrl.chat.parsers.hermes import HermesParser
from agentrl.chat.parsers.qwen3 import Qwen3Parser

__all__ = [
    "HermesParser",
    "Qwen3Parser",
    "ResponseParser",
    "TemplateProbe",
    "available_parsers",
    "get_parser",
    "parser_classes",
    "register_parser",
]
