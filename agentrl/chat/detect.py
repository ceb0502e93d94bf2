"""Detecting a chat template's tool-call family from what it renders, not from its name.

Model names and template sources lie (fine-tunes keep names, templates get edited); rendering a few
probe conversations shows the syntax the model was actually trained to write. So a fork of a
template (another system prompt, other whitespace) is detected as long as it writes the same calls.
"""

from __future__ import annotations

from typing import Any

from agentrl.chat.formats import available_formats, format_specs
from agentrl.chat.parsers import TemplateProbe, parser_classes
from agentrl.chat.sandbox import sandbox_safe_template

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
# Nine alphanumeric characters: Mistral Nemo's template refuses any other call id, and a probe it
# refuses would make the family look as if it wrote no tool calls at all.
PROBE_CALL_ID = "callprobe"
_CALL = {"type": "function", "id": PROBE_CALL_ID, "function": {"name": PROBE_TOOL_NAME, "arguments": {"x": 7}}}
# Some real templates (DeepSeek V3) concatenate arguments as a string and want content None.
_CALL_STR = {"type": "function", "id": PROBE_CALL_ID, "function": {"name": PROBE_TOOL_NAME, "arguments": '{"x": 7}'}}


def probe_template(tokenizer: Any, chat_template: str | None = None) -> TemplateProbe:
    """Render the probe conversations; a probe the template refuses renders as '' with its error kept."""
    errors: list[str] = []

    def full(last: dict[str, Any] | None, record: bool = True, **kwargs: Any) -> str:
        messages: list[dict[str, Any]] = [{"role": "user", "content": PROBE_USER}]
        if last is not None:
            messages.append(last)
        try:
            return tokenizer.apply_chat_template(
                messages, tools=PROBE_TOOLS, chat_template=chat_template, tokenize=False, **kwargs
            )
        except Exception as exc:
            if record:
                errors.append(f"{exc.__class__.__name__}: {exc}")
            return ""

    def tail(text: str) -> str:
        return text[text.rfind(PROBE_USER) + len(PROBE_USER) :] if PROBE_USER in text else text

    call_turn = tail(full({"role": "assistant", "content": "", "tool_calls": [_CALL]}, record=False))
    if PROBE_TOOL_NAME not in call_turn:  # try the string-arguments shape before giving up
        call_turn = tail(full({"role": "assistant", "content": None, "tool_calls": [_CALL_STR]})) or call_turn
    prompt = full(None, add_generation_prompt=True)
    return TemplateProbe(
        tool_call_turn=call_turn,
        reasoning_turn=tail(full({"role": "assistant", "content": PROBE_REPLY, "reasoning_content": PROBE_REASONING})),
        plain_turn=tail(full({"role": "assistant", "content": PROBE_REPLY})),
        generation_prompt=tail(prompt),
        generation_prompt_no_thinking=tail(full(None, add_generation_prompt=True, enable_thinking=False)),
        tool_name=PROBE_TOOL_NAME,
        tools_shown=PROBE_TOOL_NAME in prompt,
        prompt=prompt,
        errors=tuple(errors),
    )


def detect_format(tokenizer: Any, chat_template: str | None = None) -> str:
    """Name of the one chat format whose syntax the template writes; ValueError otherwise.

    First by tool-call syntax (each registered parser's ``matches``); then, for a template that
    renders no tools at all, by the family's turn markers, which selects a format that supplies
    its own tools template (SmolLM2's ChatML -> ``chatml_tools``); then, for a template that shows
    tools but writes no calls, by the markers around its tool list (LFM2's first template, whose
    model writes calls as text: ``lfm2_content``).
    """
    has_template = chat_template is not None or getattr(tokenizer, "chat_template", None)
    options = f"pass chat_format= one of {available_formats()} or a ChatFormat"
    if not has_template:
        raise ValueError(
            f"the tokenizer has no chat template; {options}, and chat_template=agentrl.chat.default_template() "
            "for agentrl's ChatML + tools template"
        )
    # A template transformers' sandbox refuses (Kimi K2's list.append) is probed as rewritten.
    probe = probe_template(tokenizer, sandbox_safe_template(chat_template or getattr(tokenizer, "chat_template", None)) or chat_template)
    found = [name for name, cls in parser_classes().items() if cls.matches(probe)]
    if not found and not probe.tools_shown:
        found = [s.name for s in format_specs() if s.template and s.markers and all(m in probe.plain_turn for m in s.markers)]
    if not found and probe.tools_shown and PROBE_TOOL_NAME not in probe.tool_call_turn:
        # Shows tools but writes no calls: a family whose calls are plain content (LFM2's first template).
        found = [s.name for s in format_specs() if s.prompt_markers and all(m in probe.prompt for m in s.prompt_markers)]
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
