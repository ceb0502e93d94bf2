"""Response parsers, one module per tool-call syntax family.

Adding a family means one
module that subclasses :class:`ResponseParser`, decorates it with :func:`register_parser`, reuses
:mod:`.calls` / :mod:`.reasoning` where it can, and is imported below.
"""

# Built-in families register themselves on import.
from agentrl.chat.parsers.atem import AtemParser
from agentrl.chat.parsers.base import ResponseParser, TemplateProbe
from agentrl.chat.parsers.command import CommandParser
from agentrl.chat.parsers.deepseek_v3 import DeepSeekV3Parser
from agentrl.chat.parsers.deepseek_v31 import DeepSeekV31Parser
from agentrl.chat.parsers.deepseek_v32 import DeepSeekV32Parser
from agentrl.chat.parsers.gemma4 import Gemma4Parser
from agentrl.chat.parsers.glm4 import Glm4Parser
from agentrl.chat.parsers.gpt_oss import GptOssParser
from agentrl.chat.parsers.hermes import HermesParser
from agentrl.chat.parsers.kimi_k2 import KimiK2Parser
from agentrl.chat.parsers.lfm2 import Lfm2Parser
from agentrl.chat.parsers.llama3 import Llama3Parser
from agentrl.chat.parsers.llama4_pythonic import Llama4PythonicParser
from agentrl.chat.parsers.minimax_m2 import MiniMaxM2Parser
from agentrl.chat.parsers.mistral import MistralParser
from agentrl.chat.parsers.qwen3 import Qwen3Parser
from agentrl.chat.parsers.qwen3_xml import Qwen3XmlParser
from agentrl.chat.parsers.registry import available_parsers, get_parser, parser_classes, register_parser

__all__ = [
    "AtemParser",
    "CommandParser",
    "DeepSeekV3Parser",
    "DeepSeekV31Parser",
    "DeepSeekV32Parser",
    "Gemma4Parser",
    "Glm4Parser",
    "GptOssParser",
    "Llama3Parser",
    "Llama4PythonicParser",
    "Lfm2Parser",
    "MiniMaxM2Parser",
    "MistralParser",
    "Qwen3XmlParser",
    "HermesParser",
    "KimiK2Parser",
    "Qwen3Parser",
    "ResponseParser",
    "TemplateProbe",
    "available_parsers",
    "get_parser",
    "parser_classes",
    "register_parser",
]
