"""The chat formats agentrl knows: one :class:`FormatSpec` per model family, by name.

A format is a response parser plus what the family's template needs around it: a template agentrl
supplies when the tokenizer's own writes no tool calls (SmolLM2's ChatML, Llama 3's base template),
a training template that keeps history stable where the original rewrites it (Qwen3), and a
message adapter where the real template wants another message shape (DeepSeek V3). Names here are
what ``get_chat_format(tokenizer, name)`` and ``model.chat_format=`` accept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any

from agentrl.chat.parsers import TemplateProbe, get_parser, parser_classes
from agentrl.core.registry import Registry

Messages = list[dict[str, Any]]


@dataclass(frozen=True)
class FormatSpec:
    """One chat format. ``template`` / ``training_template`` name files in ``agentrl/chat/templates``.

    ``markers``: text the family's template writes around a plain assistant turn; a template that
    shows them but renders no tools at all is detected as this format and gets ``template``.
    ``verify_training``: checks a training template against the tokenizer's original (None = ok).
    ``adapt_messages``: reshapes messages before rendering (e.g. arguments as JSON strings).
    """

    name: str
    parser: str
    models: str
    template: str | None = None
    training_template: str | None = None
    thinking: bool = False
    markers: tuple[str, ...] = ()
    adapt_messages: Callable[[Messages], Messages] | None = None
    end_tokens: tuple[str, ...] = ()  # tokens that end an assistant turn, when a probe cannot tell
    verify_training: Callable[[Any, str, str], str | None] | None = None
    # Builds a training template from the tokenizer's own (a patch of the one condition that
    # rewrites history), used only after ``verify_training`` accepts it.
    derive_training: Callable[[str], str | None] | None = None
    # What the derivation changes, for ``template_source``.
    derivation: str = "every turn keeps its reasoning"
    # Known limitations of the family, by kind ("parallel_calls", "text_beside_calls", "tool_result",
    # "new_question"):
    # why a bridge or a round trip cannot be exact however the template is written. `agentrl doctor`
    # prints the reason with the warning it explains.
    limits: dict[str, str] = field(default_factory=dict)
    # Text around the tool list of a template that shows tools but renders no tool calls, because
    # the model writes its calls as plain content (LFM2's first template): detects this format.
    prompt_markers: tuple[str, ...] = ()

    def writes_syntax(self, probe: TemplateProbe) -> bool:
        """Whether a template that rendered ``probe`` writes this format's tool-call syntax."""
        return parser_classes()[self.parser].matches(probe)

    def template_text(self, training: bool = False) -> str | None:
        name = self.training_template if training else self.template
        return None if name is None else read_template(name)


_FORMATS: Registry[FormatSpec] = Registry("chat format")


def register_format(spec: FormatSpec) -> FormatSpec:
    """Make ``spec`` available by name; its parser must be registered already."""
    if spec.name not in _FORMATS or _FORMATS[spec.name] != spec:
        get_parser(spec.parser)  # fails early, naming the parsers, if the parser is unknown
    return _FORMATS.add(spec.name, spec)


def available_formats() -> list[str]:
    """Names of every chat format ``get_chat_format`` accepts (formats and bare parsers)."""
    return sorted(set(_FORMATS) | set(parser_classes()))


def format_spec(name: str) -> FormatSpec:
    """The spec of ``name``; a parser registered without a spec gets a plain one."""
    if name in _FORMATS:
        return _FORMATS[name]
    if name in parser_classes():
        return FormatSpec(name=name, parser=name, models="(parser only)")
    raise ValueError(f"unknown chat format {name!r}; available: {available_formats()}")


def format_specs() -> list[FormatSpec]:
    """All specs (for detection, docs and ``agentrl doctor``)."""
    return [format_spec(name) for name in available_formats()]


def read_template(name: str) -> str:
    """A template file shipped in ``agentrl/chat/templates``."""
    return files("agentrl.chat").joinpath(f"templates/{name}").read_text(encoding="utf-8")
