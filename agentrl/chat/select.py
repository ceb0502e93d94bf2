"""``get_chat_format``: from a tokenizer (and optional overrides) to a ready :class:`ChatFormat`.

Template choice, in order: an explicit ``chat_template`` always wins; a format that supplies its
own tools template uses it when the tokenizer's template writes no tool calls of its syntax; a
format with a training template uses it only after checking it against the tokenizer's template
(a fork that differs keeps its own template, and bridges fall back to counted splits). The choice
is logged (a warning whenever it is not the tokenizer's own) and kept in ``ChatFormat.template_source``.
"""

from __future__ import annotations

import logging
from typing import Any

from agentrl.chat.base import ChatFormat
from agentrl.chat.detect import detect_format, probe_template
from agentrl.chat.formats import FormatSpec, format_spec
from agentrl.chat.parsers import get_parser
from agentrl.chat.sandbox import NOTE, sandbox_safe_template

log = logging.getLogger(__name__)


def get_chat_format(
    tokenizer: Any,
    chat_format: str | ChatFormat | None = None,
    chat_template: str | None = None,
    training_template: bool = True,
) -> ChatFormat:
    """The :class:`ChatFormat` for ``tokenizer``.

    A ChatFormat instance is returned as is; a name picks that format (see
    ``agentrl.chat.available_formats()``); otherwise the format is detected from what the
    (override or tokenizer's) template renders, raising a ValueError that names the options when
    the template has no known tool-call syntax. ``training_template=False`` keeps the tokenizer's
    template even where the format has a verified training template.
    """
    if isinstance(chat_format, ChatFormat):
        return chat_format
    name = chat_format if chat_format is not None else detect_format(tokenizer, chat_template)
    spec = format_spec(name)
    safe = sandbox_safe_template(chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None))
    if chat_template is not None:
        template, source = (safe, f"override ({NOTE})") if safe else (chat_template, "override")
    else:
        template, source = choose_template(tokenizer, spec, training_template, own=safe)
        if safe is not None:  # the tokenizer's own (or what was derived from it), as transformers can render it
            template, source = template if template is not None else safe, f"{source}; {NOTE}"
    fmt = ChatFormat(
        tokenizer, get_parser(spec.parser), chat_template=template, name=name, template_source=source,
        adapt_messages=spec.adapt_messages, end_tokens=spec.end_tokens,
    )  # fmt: skip
    # Another template than the tokenizer's changes what the model sees: say so where it shows.
    (log.info if source in ("tokenizer", "override") else log.warning)("chat format %s, template: %s", name, source)
    return fmt


def choose_template(
    tokenizer: Any, spec: FormatSpec, training_template: bool = True, own: str | None = None
) -> tuple[str | None, str]:
    """(template to use, None = the tokenizer's; a description of the choice). ``own``: the text that
    stands for the tokenizer's template (its sandbox-safe rewrite, :mod:`agentrl.chat.sandbox`)."""
    rewritten = own
    own = own if own is not None else getattr(tokenizer, "chat_template", None)
    probe = probe_template(tokenizer, rewritten) if own and spec.template is not None else None
    if spec.template is not None and (probe is None or not spec.writes_syntax(probe) or not probe.tools_shown):
        # A template that writes calls but never shows the schemas (DeepSeek V3.1's) cannot teach tool use.
        why = (
            "the tokenizer has no chat template" if probe is None
            else f"the tokenizer's template writes no {spec.parser!r} tool calls" if not spec.writes_syntax(probe)
            else "the tokenizer's template does not show the tool schemas (tools= is ignored)"
        )  # fmt: skip
        return spec.template_text(), f"agentrl {spec.template} ({why})"
    why_own = "tokenizer"
    if spec.derive_training is not None and training_template and isinstance(own, str):
        derived = spec.derive_training(own)
        if derived is not None and derived != own:
            problem = spec.verify_training(tokenizer, own, derived) if spec.verify_training else None
            if problem is None:
                return derived, f"training template derived from the tokenizer's ({spec.derivation}; verified)"
            return None, f"tokenizer (derived training template rejected: {problem})"
        # Say why, so a fork that lost the switch is told apart from a template that needs no patch.
        why_own = (
            f"tokenizer (the {spec.name!r} training derivation does not apply: the template has none of the "
            "switches or conditions it patches)"
        )
    if spec.training_template is not None and training_template and own:
        training = spec.template_text(training=True) or ""
        problem = spec.verify_training(tokenizer, own, training) if spec.verify_training else None
        if problem is None:
            return training, f"training template {spec.training_template} (verified against the tokenizer's)"
        return None, f"tokenizer (training template rejected: {problem})"
    return None, why_own
