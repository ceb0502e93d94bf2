"""The built-in chat formats, one :class:`FormatSpec` each (see docs/chat_formats.md)."""

from __future__ import annotations

from agentrl.chat.formats import FormatSpec, register_format
from agentrl.chat.training import verify_qwen3_training

HERMES = register_format(FormatSpec(name="hermes", parser="hermes", models="Qwen2.5, Hermes 2/3, agentrl's bundled model"))
QWEN3 = register_format(
    FormatSpec(
        name="qwen3",
        parser="qwen3",
        models="Qwen3 (thinking on and off)",
        thinking=True,
        training_template="qwen3_training.jinja",
        verify_training=verify_qwen3_training,
    )
)
CHATML_TOOLS = register_format(
    FormatSpec(
        name="chatml_tools",
        parser="hermes",
        models="SmolLM2 and other ChatML templates without a tools section",
        template="chatml_tools.jinja",
        markers=("<|im_start|>assistant",),
    )
)
