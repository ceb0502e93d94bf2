"""Issue 42: the doctor and detection defects real templates exposed, each on its minimal template.

Mistral Nemo's template refuses call ids that are not 9 alphanumeric characters (the probe used
"call_probe"); Hermes-2-Pro writes ``{"arguments": ..., "name": ...}``; DeepSeek V3's and R1's template raises
on every tool call (not only on parallel ones); a template that drops the system message gave the
WARN "missing: -"; and a derivation that does not apply left ``template_source`` at "tokenizer".
Nemo's template is the real one (llama.cpp's copy); the Hermes-2-Pro key order is agentrl's own
template with its call object written arguments first (the copy llama.cpp keeps writes name first).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from chat_fixtures import (
    build_tiny_tokenizer,
    llamacpp_template,
    load_asset_tokenizer,
    trl_family_tokenizer,
    trl_template,
)

import agentrl.doctor.checks as C
from agentrl.chat import default_template, detect_format, get_chat_format

MISTRAL_SPECIAL = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                   "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[ARGS]"]  # fmt: skip
HERMES_2_PRO = default_template().replace(
    """{{- '<tool_call>\\n{"name": "' + fn.name + '", "arguments": ' }}
{%- if fn.arguments is string %}
{{- fn.arguments }}
{%- else %}
{{- fn.arguments | tojson }}
{%- endif %}
{{- '}\\n</tool_call>' }}""",
    """{{- '<tool_call>\\n{"arguments": ' }}
{%- if fn.arguments is string %}
{{- fn.arguments }}
{%- else %}
{{- fn.arguments | tojson }}
{%- endif %}
{{- ', "name": "' + fn.name + '"}\\n</tool_call>' }}""",
)
NO_SYSTEM_WITH_TOOLS = default_template().replace(
    "{%- if messages and messages[0].role == 'system' %}\n{{- messages[0].content + '\\n\\n' }}\n{%- endif %}", "", 1
)


def test_templates_here_are_the_intended_mutations() -> None:
    assert HERMES_2_PRO != default_template() and NO_SYSTEM_WITH_TOOLS != default_template()


def test_mistral_nemo_template_is_detected_and_kept(tmp_path: Path) -> None:
    nemo = llamacpp_template("mistralai-Mistral-Nemo-Instruct-2407")
    tok = build_tiny_tokenizer(tmp_path, nemo, MISTRAL_SPECIAL, [], eos="</s>", bos="<s>")
    with pytest.raises(Exception, match="length 9"):  # the rule is really there
        tok.apply_chat_template([{"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "id": "call_probe", "function": {"name": "f", "arguments": {}}}]}], tokenize=False)  # fmt: skip
    assert detect_format(tok) == "mistral"
    fmt = get_chat_format(tok, "mistral")  # not swapped for agentrl's template: Nemo's own, derived (issue 42b)
    assert fmt.template_source.startswith("training template derived from the tokenizer's (the system prompt kept")
    assert "Tool call IDs should be alphanumeric strings with length 9!" in fmt.chat_template
    assert get_chat_format(tok, "mistral", training_template=False).template_source == "tokenizer"


def test_hermes_2_pro_key_order_is_detected(tmp_path: Path) -> None:
    tok = build_tiny_tokenizer(tmp_path, HERMES_2_PRO)
    fmt = get_chat_format(tok)
    assert fmt.name == "hermes"
    check = C.check_round_trip(fmt, False)
    assert check.status in (C.PASS, C.WARN), check.details  # the parser reads either key order back


def test_a_template_that_refuses_every_call_is_not_said_to_refuse_parallel_calls() -> None:
    """DeepSeek V3's (and R1's) own template raises the same TypeError on both round-trip turns."""
    tok = load_asset_tokenizer("deepseek_v3")
    template = trl_template("deepseekv3")
    fmt = get_chat_format(tok, "deepseek_v3", chat_template=template)
    check = C.check_round_trip(fmt, False)
    assert check.status == C.FAIL
    assert check.summary.startswith("2 of 2 turns"), check.summary


def test_a_dropped_system_message_is_named_in_the_warning(tmp_path: Path) -> None:
    tok = build_tiny_tokenizer(tmp_path, NO_SYSTEM_WITH_TOOLS)
    check = C.check_tool_schemas(tok, None, get_chat_format(tok, "hermes"))
    assert check.status == C.WARN
    assert "missing: -" not in check.summary and "system message" in check.summary, check.summary


def test_template_source_says_why_a_derivation_does_not_apply() -> None:
    """Gemma 4's release revision has none of the places the Gemma derivation patches."""
    fmt = get_chat_format(trl_family_tokenizer("gemma4_v2"))
    assert fmt.name == "gemma4"
    assert fmt.template_source.startswith("tokenizer (") and "does not apply" in fmt.template_source
    assert get_chat_format(fmt.tokenizer, training_template=False).template_source == "tokenizer"
