"""Training templates derived from the real templates of GPT-OSS, LFM2.5, Nemotron 3, Gemma 4 and GLM-4.

For each: the derivation applies to every revision of the family in TRL's set, the derived template
passes the token-space check on 24 generated conversations (trained turns identical, history
identical but for what the family hides, prefixes kept), the original itself fails that check (so
the check sees what the derivation fixes), a derivation broken on purpose is rejected and the
tokenizer's template kept, and ``get_chat_format`` picks the derived one and says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from chat_fixtures import trl_template, trl_tokenizer

from agentrl.chat import derived as D
from agentrl.chat import get_chat_format
from agentrl.chat import harmony_training as H
from agentrl.chat.training import random_conversations, training_template_problems


def plain(n: int, seed: int) -> list[Any]:
    return [(m, t, {}) for m, t, _ in random_conversations(n, seed)]


def lfm2_conversations(n: int, seed: int) -> list[Any]:
    return [(D.thinking_from_reasoning(m), t, {}) for m, t, _ in random_conversations(n, seed)]


# family -> (templates, derive, verify, conversations, hidden, extra check options, a patch that breaks the derived one)
FAMILIES: dict[str, tuple[list[str], Callable, Callable, Callable, Callable, dict, tuple[str, str]]] = {
    "gpt_oss": (["gptoss"], H.derive_gpt_oss_training, H.verify_gpt_oss_training, H.one_call_conversations, H.harmony_hidden,
                {"split_after": H.final_answer, "original_may_refuse": True, "original_rewrites": True},
                ('"<|call|>"', '"<|end|>"')),
    "lfm2": (["lfm2_2_5", "lfm2_2_5_v2", "lfm2_2_5_vl"], D.derive_lfm2_training, D.verify_lfm2_training, lfm2_conversations,
             lambda t: D._LFM2_THINK.sub("", t), {}, ('"<|im_end|>\\n"', '"<|im_end|>"')),
    "nemotron": (["nemotron_3_nano", "nemotron_3_super", "nemotron_3_ultra", "nemotron_3_5_lightning"],
                 D.derive_nemotron_training, D.verify_nemotron_training, D.nemotron_conversations, D.nemotron_hidden, {},
                 ("'</function>\\n</tool_call>\\n'", "'</function>\\n</tool_call>'")),
    "gemma4": (["gemma4", "gemma4_v3", "gemma4_v4", "gemma4_v5", "diffusion_gemma"], D.derive_gemma4_training,
               D.verify_gemma4_training, plain, D.gemma4_hidden, {"original_rewrites": True},
               ("'}<tool_call|>'", "'} <tool_call|>'")),
    "glm4": (["glm4moe"], D.derive_glm4_training, D.verify_glm4_training, plain, D.glm4_hidden, {"turn_ends": D.GLM_STOPS},
             ("'<|observation|>' if m.tool_calls", "'<|user|>' if m.tool_calls")),
}  # fmt: skip
CASES = [(family, name) for family, spec in FAMILIES.items() for name in spec[0]]


@pytest.mark.parametrize(("family", "name"), CASES)
def test_derived_template_stands_in_for_the_original(family: str, name: str) -> None:
    _, derive, verify, conversations, hidden, options, _ = FAMILIES[family]
    tok, original = trl_tokenizer(name), trl_template(name)
    derived = derive(original)
    assert derived is not None and derived != original
    assert training_template_problems(tok, original, derived, conversations(24, 7), hidden, **options) == []
    assert verify(tok, original, derived) is None


@pytest.mark.parametrize(("family", "name"), [(f, spec[0][0]) for f, spec in FAMILIES.items()])
def test_the_check_sees_what_the_derivation_fixes(family: str, name: str) -> None:
    _, _, _, conversations, hidden, options, _ = FAMILIES[family]
    tok, original = trl_tokenizer(name), trl_template(name)
    problems = training_template_problems(tok, original, original, conversations(24, 7), hidden, **options)
    assert problems, "the original must fail the check it is derived to pass"


@pytest.mark.parametrize(("family", "name"), [(f, spec[0][0]) for f, spec in FAMILIES.items()])
def test_a_broken_derivation_is_rejected_and_the_tokenizers_template_kept(family: str, name: str) -> None:
    _, derive, verify, _, _, _, (old, new) = FAMILIES[family]
    tok, original = trl_tokenizer(name), trl_template(name)
    good = derive(original)
    broken = good.replace(old, new, 1)
    assert broken != good, f"the breaking patch {old!r} did not apply"
    assert verify(tok, original, broken) is not None


@pytest.mark.parametrize(("family", "name"), [(f, spec[0][-1]) for f, spec in FAMILIES.items()])
def test_get_chat_format_uses_the_derived_template(family: str, name: str) -> None:
    tok = trl_tokenizer(name)
    tok.chat_template = trl_template(name)
    fmt = get_chat_format(tok)
    assert fmt.template_source.startswith("training template derived from the tokenizer's"), fmt.template_source
    assert get_chat_format(tok, training_template=False).template_source == "tokenizer"


@pytest.mark.parametrize("name", ["gemma4_v2", "lfm2_v2", "qwen3_vl"])
def test_templates_that_need_no_derivation_get_none(name: str) -> None:
    """Gemma 4's release revision closes each call turn; LFM2 v2 renders no reasoning; Qwen3-VL keeps it."""
    original = trl_template(name)
    assert all(derive(original) is None for derive in (D.derive_gemma4_training, D.derive_lfm2_training,
                                                        D.derive_nemotron_training, D.derive_glm4_training,
                                                        H.derive_gpt_oss_training))  # fmt: skip


def test_a_fork_that_moves_a_patched_place_is_not_derived() -> None:
    """The derivation patches exact places: a fork that rewrote one of them gets no derived template."""
    fork = trl_template("gptoss").replace("Cannot pass both content and thinking", "Content and thinking together", 1)
    assert H.derive_gpt_oss_training(fork) is None
    glm = trl_template("glm4moe")
    fork = glm.replace("loop.index0 > ns.last_user_index and reasoning_content", "reasoning_content and loop.index0 > ns.last_user_index")
    assert fork != glm and D.derive_glm4_training(fork) is None
