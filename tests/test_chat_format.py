"""ChatFormat rendering and end tokens, format detection, the parser registry, the packaged template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chat_fixtures import TOOLS, build_tiny_tokenizer, load_asset_tokenizer, tool_call, tool_result

import agentrl.chat as chat
from agentrl.chat import ChatFormat, default_template, get_chat_format, register_parser
from agentrl.chat.parsers import HermesParser, Qwen3Parser, ResponseParser, TemplateProbe, registry
from agentrl.core.messages import ParsedResponse

PLAIN_CHATML = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Renders tools and calls, but in a syntax no parser knows.
UNKNOWN_SYNTAX = (
    "{%- if tools %}{{- '<|im_start|>system\\n' + (tools | tojson) + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content }}"
    "{%- for call in message.tool_calls or [] %}{{- 'CALL ' + call.function.name }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CONVERSATIONS: list[tuple[list[dict[str, Any]], dict[str, Any]]] = [
    ([{"role": "user", "content": "Hi"}], {}),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}], {}),
    ([{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": "", "reasoning_content": "Call it.",
       "tool_calls": [tool_call("get_weather", {"city": "Paris"}, "c0")]},
      tool_result('{"temp_c": 21}', call_id="c0")], {}),
    ([{"role": "user", "content": "Hi"}], {"enable_thinking": False}),
]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def qwen3_tok() -> Any:
    return load_asset_tokenizer("qwen3")


@pytest.fixture(scope="module")
def smollm2_tok() -> Any:
    return load_asset_tokenizer("smollm2")


@pytest.mark.parametrize("which", ["tiny_tok", "qwen3_tok", "smollm2_tok"])
@pytest.mark.parametrize(("messages", "kwargs"), CONVERSATIONS)
def test_render_matches_apply_chat_template(request: pytest.FixtureRequest, which: str, messages: list,
                                            kwargs: dict) -> None:  # fmt: skip
    tok = request.getfixturevalue(which)
    fmt = get_chat_format(tok, chat_format="hermes")
    for gen in (True, False):
        expected = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=gen, **kwargs)["input_ids"]
        assert fmt.render(messages, TOOLS, add_generation_prompt=gen, **kwargs) == expected


def test_end_tokens(tiny_tok: Any, qwen3_tok: Any, smollm2_tok: Any) -> None:
    for tok in (tiny_tok, qwen3_tok):
        fmt = get_chat_format(tok)
        im_end, endoftext = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
        assert fmt.eot_token_ids == [im_end]
        assert fmt.stop_token_ids == [im_end, endoftext]
    assert get_chat_format(smollm2_tok, "hermes").eot_token_ids == [smollm2_tok.convert_tokens_to_ids("<|im_end|>")]


def test_parse_strips_end_of_turn_and_reports_framing(tiny_tok: Any) -> None:
    fmt = get_chat_format(tiny_tok)
    body = fmt.encode('Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>')
    eot = fmt.eot_token_ids[0]
    clean = fmt.parse(body + [eot])
    assert clean.issues == [] and clean.content == "Sure." and clean.tool_calls[0].arguments == {"a": 1}
    assert [i.kind for i in fmt.parse(body).issues] == ["truncated"]
    assert [i.kind for i in fmt.parse(body + [eot] + body).issues] == ["tokens_after_end_of_turn"]
    assert [i.kind for i in fmt.parse([eot]).issues] == ["empty"]
    assert fmt.parse([-5, eot]).issues[0].kind == "decode_error"


# ------------------------------------------------------------------ detection
def test_detects_hermes_for_our_template(tiny_tok: Any, qwen3_tok: Any, smollm2_tok: Any) -> None:
    assert get_chat_format(tiny_tok).name == "hermes"
    assert get_chat_format(qwen3_tok, chat_template=default_template()).name == "hermes"
    assert get_chat_format(smollm2_tok, chat_template=default_template()).name == "hermes"


def test_detects_qwen3(qwen3_tok: Any) -> None:
    fmt = get_chat_format(qwen3_tok)
    assert fmt.name == "qwen3" and isinstance(fmt.parser, Qwen3Parser)


def test_explicit_format_wins(qwen3_tok: Any, smollm2_tok: Any) -> None:
    assert get_chat_format(qwen3_tok, chat_format="hermes").name == "hermes"
    assert get_chat_format(smollm2_tok, chat_format="qwen3").name == "qwen3"
    custom = ChatFormat(qwen3_tok, HermesParser(allow_parallel_calls=False), name="mine")
    assert get_chat_format(qwen3_tok, chat_format=custom) is custom
    with pytest.raises(ValueError, match="hermes"):
        get_chat_format(qwen3_tok, chat_format="nonexistent")


@pytest.mark.parametrize("case", ["smollm2", "plain_template"])
def test_chatml_without_tools_gets_the_tools_template(case: str, request: pytest.FixtureRequest,
                                                      tmp_path: Path) -> None:  # fmt: skip
    """A ChatML template that renders no tools is detected by its turn markers and gets ours."""
    tok = request.getfixturevalue("smollm2_tok") if case == "smollm2" else build_tiny_tokenizer(tmp_path, PLAIN_CHATML)
    fmt = get_chat_format(tok)
    assert fmt.name == "chatml_tools" and fmt.chat_template == default_template()
    assert "chatml_tools.jinja" in fmt.template_source and "writes no" in fmt.template_source
    assert "<tools>" in fmt.render_text([{"role": "user", "content": "Hi"}], TOOLS)
    # The override still wins.
    assert get_chat_format(tok, "hermes").chat_template is None


@pytest.mark.parametrize("case", ["no_template", "unknown_syntax"])
def test_no_tool_syntax_is_a_clear_error(case: str, tmp_path: Path) -> None:
    template = PLAIN_CHATML if case == "no_template" else UNKNOWN_SYNTAX
    tok = build_tiny_tokenizer(tmp_path, template)
    if case == "no_template":
        tok.chat_template = None
    with pytest.raises(ValueError) as err:
        get_chat_format(tok)
    message = str(err.value)
    assert "'hermes'" in message and "'qwen3'" in message and "default_template()" in message, message


def test_available_formats_are_all_constructible(qwen3_tok: Any) -> None:
    names = chat.available_formats()
    assert {"hermes", "qwen3", "chatml_tools"} <= set(names)
    for name in names:
        fmt = get_chat_format(qwen3_tok, name)
        assert fmt.name == name and fmt.template_source


# ------------------------------------------------------------------ registry and packaging
def test_register_a_new_family(monkeypatch: pytest.MonkeyPatch, tiny_tok: Any) -> None:
    monkeypatch.setattr(registry, "_REGISTRY", registry._REGISTRY.copy())

    @register_parser("shouting")
    class ShoutingParser(ResponseParser):
        def parse(self, text: str) -> ParsedResponse:
            return ParsedResponse(content=text.upper())

        @classmethod
        def matches(cls, probe: TemplateProbe) -> bool:
            return False

    assert "shouting" in chat.available_parsers()
    assert get_chat_format(tiny_tok, "shouting").parse(get_chat_format(tiny_tok).encode("hi")).content == "HI"
    assert get_chat_format(tiny_tok).name == "hermes"  # detection unaffected
    with pytest.raises(ValueError, match="already registered"):
        register_parser("shouting")(HermesParser)


def test_default_template_is_the_packaged_file() -> None:
    path = Path(chat.__file__).parent / "templates" / "chatml_tools.jinja"
    assert default_template() == path.read_text(encoding="utf-8")


def test_encode_remembers_pieces_but_hands_out_fresh_lists(qwen3_tok: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``encode`` remembers what it tokenized (a rollout encodes the same pieces every turn): a
    caller that changes the list it got must not change the next caller's, and the memory is bounded."""
    import agentrl.chat.base as base

    fmt = get_chat_format(qwen3_tok)
    text = "<|im_start|>user\nWhat is 12 * 7?<|im_end|>\n<|im_start|>assistant\n"
    plain = list(qwen3_tok(text, add_special_tokens=False)["input_ids"])
    first = fmt.encode(text)
    first.append(-1)
    assert fmt.encode(text) == plain
    monkeypatch.setattr(base, "ENCODED_PIECES", 3)
    for i in range(10):
        assert fmt.encode(f"piece {i}") == list(qwen3_tok(f"piece {i}", add_special_tokens=False)["input_ids"])
    assert len(fmt._encoded) <= 3
