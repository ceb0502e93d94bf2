"""Detecting a chat template's tool-call family from what it renders, not from its name.

Model names and template sources lie (fine-tunes keep names, templates get edited); rendering a few
probe conversations shows the syntax the model was actually trained to write.
"""

from __future__ import annotations

from typing import Any

from agentrl.chat.parsers import TemplateProbe, available_parsers, parser_classes

PROBE_USER = "agentrl probe question"
PROBE_REASONING = "agentrl probe reasoning"
PROBE_REPLY = "agentrl probe reply"
PROBE_TOOL_NAME = "agentrl_probe_tool"
PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": PROBE_TOOL_NAME,
            "description": "Probe tool.",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
        },
    }
]
_CALL = {"type": "function", "id": "call_probe", "function": {"name": PROBE_TOOL_NAME, "arguments": {"x": 7}}}


def probe_template(tokenizer: Any, chat_template: str | None = None) -> TemplateProbe:
    """Render the probe conversations; a probe the template refuses renders as '' with its error kept."""
    errors: list[str] = []

    def tail(last: dict[str, Any] | None, **kwargs: Any) -> str:
        messages: list[dict[str, Any]] = [{"role": "user", "content": PROBE_USER}]
        if last is not None:
            messages.append(last)
        try:
            text = tokenizer.apply_chat_template(
                messages, tools=PROBE_TOOLS, chat_template=chat_template, tokenize=False, **kwargs
            )
        except Exception as exc:
            errors.append(f"{exc.__class__.__name__}: {exc}")
            return ""
        return text[text.rfind(PROBE_USER) + len(PROBE_USER) :] if PROBE_USER in text else text

    return TemplateProbe(
        tool_call_turn=tail({"role": "assistant", "content": "", "tool_calls": [_CALL]}),
        reasoning_turn=tail({"role": "assistant", "content": PROBE_REPLY, "reasoning_content": PROBE_REASONING}),
        plain_turn=tail({"role": "assistant", "content": PROBE_REPLY}),
        generation_prompt=tail(None, add_generation_prompt=True),
        generation_prompt_no_thinking=tail(None, add_generation_prompt=True, enable_thinking=False),
        tool_name=PROBE_TOOL_NAME,
        errors=tuple(errors),
    )


def detect_format(tokenizer: Any, chat_template: str | None = None) -> str:
    """Name of the one registered parser whose syntax the template writes; ValueError otherwise."""
    has_template = chat_template is not None or getattr(tokenizer, "chat_template", None)
    options = f"pass chat_format= one of {available_parsers()} or a ChatFormat"
    if not has_template:
        raise ValueError(
            f"the tokenizer has no chat template; {options}, and chat_template=agentrl.chat.default_template() "
            "for agentrl's ChatML + tools template"
        )
    probe = probe_template(tokenizer, chat_template)
    found = [name for name, cls in parser_classes().items() if cls.matches(probe)]
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise ValueError(f"the chat template matches several formats {sorted(found)}; {options}")
    rendered = probe.tool_call_turn.strip() or "(nothing)"
    why = f" (template errors: {'; '.join(probe.errors)})" if probe.errors else ""
    raise ValueError(
        f"could not detect a tool-call format: the chat template renders an assistant tool call as "
        f"{rendered[:300]!r}, with no known tool-call syntax{why}. Either {options}, or use "
        "chat_template=agentrl.chat.default_template() (agentrl's ChatML + tools template, 'hermes' syntax)"
    )
