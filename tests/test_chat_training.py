"""Qwen3's training template against Qwen3's real template, on many generated conversations."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from chat_fixtures import load_asset_tokenizer

from agentrl.chat import get_chat_format
from agentrl.chat.formats import read_template
from agentrl.chat.training import qwen3_hidden, random_conversations, training_template_problems


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_asset_tokenizer("qwen3")


def test_generated_conversations_cover_the_cases() -> None:
    convs = random_conversations(300, seed=1)
    turns = [m for messages, _, _ in convs for m in messages if m["role"] == "assistant"]
    assert any(m.get("reasoning_content") for m in turns) and any(m.get("reasoning_content") == "" for m in turns)
    assert any("reasoning_content" not in m for m in turns) and any(len(m.get("tool_calls", [])) == 2 for m in turns)
    assert any(kw for _, _, kw in convs) and any(tools is None for _, tools, _ in convs)
    assert any(m["role"] == "user" for messages, _, _ in convs for m in messages[2:])


def test_training_template_matches_the_original_on_300_conversations(tok: Any) -> None:
    """Same trained turns, same generation prompts, same everything but hidden reasoning, and
    prefix-preserving at every assistant turn (thinking on and off, tool loops and new questions)."""
    training = read_template("qwen3_training.jinja")
    assert training_template_problems(tok, tok.chat_template, training, random_conversations(300, seed=1),
                                      qwen3_hidden, limit=3) == []  # fmt: skip


def test_the_check_catches_the_original_rewriting_history(tok: Any) -> None:
    problems = training_template_problems(tok, tok.chat_template, tok.chat_template, random_conversations(40, seed=2),
                                          qwen3_hidden)  # fmt: skip
    assert problems and all("rewrites history" in p for p in problems)


def test_a_training_template_that_doubles_the_think_block_is_rejected(tok: Any) -> None:
    """The failure of a patched template that writes the reasoning twice (what inference never sees)."""
    doubled = read_template("qwen3_training.jinja").replace(
        "'\\n</think>\\n\\n' + content.lstrip('\\n') }}", "'\\n</think>\\n\\n<think>\\n\\n</think>\\n\\n' + content.lstrip('\\n') }}"
    )
    assert doubled != read_template("qwen3_training.jinja")
    problems = training_template_problems(tok, tok.chat_template, doubled, random_conversations(5), qwen3_hidden)
    assert problems and "the trained turn differs" in problems[0]


def test_a_fork_with_another_system_prompt_keeps_its_own_template(tok: Any, tmp_path: Any) -> None:
    """Detected as qwen3 by its behaviour, but our training template would change its tool prompt:
    it keeps its template, and the reason is in template_source."""
    fork = tok.chat_template.replace("You may call one or more functions", "You can call functions")
    tok.save_pretrained(tmp_path)
    forked = type(tok).from_pretrained(tmp_path)
    forked.chat_template = fork
    fmt = get_chat_format(forked)
    assert fmt.name == "qwen3" and fmt.chat_template is None
    assert fmt.template_source.startswith("tokenizer (training template rejected:"), fmt.template_source
    assert "the prompt differs beyond hidden history" in fmt.template_source and "may call one or more functions" in fmt.template_source


def test_the_template_choice_is_logged(tok: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="agentrl.chat.select"):
        get_chat_format(tok)
        get_chat_format(tok, training_template=False)
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "qwen3_training.jinja" in warning.getMessage()
    assert any(r.levelno == logging.INFO and r.getMessage().endswith("template: tokenizer") for r in caplog.records)


# ------------------------------------------------------------------ Qwen3.5-style: derived training templates
QWEN35 = ["qwen3_5_think", "qwen3_5_nothink", "qwen3_6", "qwen3_8"]


@pytest.mark.parametrize("name", QWEN35)
def test_derived_qwen35_training_template_matches_the_original(name: str) -> None:
    """Qwen3.5/3.6/3.8's real templates (TRL's set): the derived template changes only which
    reasoning history shows, on 60 generated conversations, and is prefix-preserving."""
    from chat_fixtures import trl_template

    from agentrl.chat.training import derive_qwen3_xml_training, verify_qwen3_xml_training

    tok = load_asset_tokenizer("qwen3")
    original = trl_template(name)
    derived = derive_qwen3_xml_training(original)
    assert derived is not None and derived != original
    convs = random_conversations(60, seed=3)
    if "nothink" in name:  # reasons only when asked
        convs = [(m, t, kw or {"enable_thinking": True}) for m, t, kw in convs]
    assert training_template_problems(tok, original, derived, convs, qwen3_hidden) == []
    assert verify_qwen3_xml_training(tok, original, derived) is None
    tok.chat_template = original
    fmt = get_chat_format(tok)
    assert fmt.name == "qwen3_xml" and fmt.template_source.startswith("training template derived")
    assert get_chat_format(tok, training_template=False).template_source == "tokenizer"


def test_qwen35_original_rewrites_history_and_the_check_sees_it() -> None:
    from chat_fixtures import trl_template

    tok = load_asset_tokenizer("qwen3")
    original = trl_template("qwen3_5_think")
    problems = training_template_problems(tok, original, original, random_conversations(20, seed=2), qwen3_hidden)
    assert any("rewrites history" in p for p in problems)


def test_a_bad_derivation_is_rejected_and_the_original_kept() -> None:
    """A derived template that also changes a trained turn must not be used."""
    from chat_fixtures import trl_template

    from agentrl.chat.training import derive_qwen3_xml_training, verify_qwen3_xml_training

    tok = load_asset_tokenizer("qwen3")
    original = trl_template("qwen3_5_think")
    broken = (derive_qwen3_xml_training(original) or "").replace(r"'\n</think>\n\n'", r"'\n</think>\n'")
    assert broken != derive_qwen3_xml_training(original)
    assert verify_qwen3_xml_training(tok, original, broken) is not None
