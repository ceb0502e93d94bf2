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
    assert "turns other than reasoning differ" in fmt.template_source


def test_the_template_choice_is_logged(tok: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="agentrl.chat.select"):
        get_chat_format(tok)
        get_chat_format(tok, training_template=False)
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "qwen3_training.jinja" in warning.getMessage()
    assert any(r.levelno == logging.INFO and r.getMessage().endswith("template: tokenizer") for r in caplog.records)
