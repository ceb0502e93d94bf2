"""Shared builders for chat-format tests: a tiny real tokenizer, and the offline model tokenizers.

``build_tiny_tokenizer`` trains a byte-level BPE in milliseconds with the same kind of special and
added tokens as Qwen (ChatML specials; tool/think tags as added, non-special tokens), so template
and bridge logic is tested through a genuine ``transformers`` tokenizer without downloads.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from agentrl.chat import default_template

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAG_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
_CORPUS = [
    "You are a helpful assistant. You may call these tools:",
    '{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",',
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}',
    '{"name": "add", "arguments": {"a": 1, "b": 2.5, "flag": true, "nested": {"list": [1, 2, null]}}}',
    "user\nWhat is the weather in Paris? assistant\nLet me check that for you.",
    "system\nuser\nassistant\ntool\nThe answer is 42. Thanks! Sunny, 21 degrees.",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"()[]{}<>/\\-_+=*&^%$#@~`|",
]


def build_tiny_tokenizer(
    directory: Path,
    chat_template: str | None = None,
    special_tokens: list[str] | None = None,
    tag_tokens: list[str] | None = None,
    eos: str = "<|im_end|>",
    bos: str | None = None,
) -> PreTrainedTokenizerFast:
    """Train, save to ``directory`` and reload a tiny tokenizer using ``chat_template``.

    Defaults: ChatML specials and agentrl's ChatML + tools template; other families pass their
    control tokens (e.g. Mistral's ``[INST]``, ``[TOOL_CALLS]``) and end tokens.
    """
    special_tokens = SPECIAL_TOKENS if special_tokens is None else special_tokens
    tag_tokens = TAG_TOKENS if tag_tokens is None else tag_tokens
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in tag_tokens])
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=eos,
        bos_token=bos,
        pad_token=special_tokens[0],
        chat_template=default_template() if chat_template is None else chat_template,
    )
    directory.mkdir(parents=True, exist_ok=True)
    wrapped.save_pretrained(directory)
    return AutoTokenizer.from_pretrained(directory)


def assets_dir() -> Path:
    return Path(os.environ.get("AGENTRL_TEST_ASSETS", Path.home() / ".cache" / "agentrl" / "test-assets"))


def load_asset_tokenizer(name: str) -> Any:
    """An offline model tokenizer (``qwen3`` or ``smollm2``); fails loudly when assets are missing."""
    path = assets_dir() / name
    if not (path / "tokenizer_config.json").exists():
        pytest.fail(
            f"offline test tokenizer {name!r} not found at {path}; run `python scripts/fetch_test_assets.py` "
            "(or point AGENTRL_TEST_ASSETS at a folder that has it)",
            pytrace=False,
        )
    return AutoTokenizer.from_pretrained(path)


# Small reusable conversation pieces.
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
    },
}
TOOLS = [WEATHER_TOOL, ADD_TOOL]


def tool_call(name: str, arguments: Any, call_id: str | None = None) -> dict[str, Any]:
    """An OpenAI-style ``tool_calls`` entry."""
    out: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id is not None:
        out["id"] = call_id
    return out


def tool_result(content: str, name: str = "get_weather", call_id: str = "call_0") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


# ----------------------------------------------------------------------------- TRL's vendored templates
# Each original template of TRL 1.16.0 (fetched by scripts/fetch_test_assets.py, never committed) is
# paired with the family's own offline tokenizer where one exists; otherwise with Qwen3's tokenizer
# plus the family's control tokens added as special tokens ("base + added" in docs/chat_formats.md).
TRL_TEMPLATE_TOKENIZER: dict[str, tuple[str, tuple[str, ...]]] = {
    "qwen2_5": ("qwen3", ()),
    "qwen3": ("qwen3", ()),
    "qwen3_instruct_2507": ("qwen3", ()),
    "qwen3_5_think": ("qwen3", ()),
    "qwen3_5_nothink": ("qwen3", ()),
    "qwen3_6": ("qwen3", ()),
    "qwen3_8": ("qwen3", ()),
    "qwen3_vl": ("qwen3", ()),
    "llama3_1": ("llama3", ()),
    "llama3_2": ("llama3", ()),
    "deepseekv3": ("deepseek_v3", ()),
    "gptoss": ("gpt_oss", ()),
    "gemma4": ("gemma3", ("<|turn>", "<turn|>", "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>",
                          "<|tool_response>", "<tool_response|>", "<|channel>", "<channel|>", "<|think|>", '<|"|>')),
    "glm4moe": ("qwen3", ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
                          "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "/nothink")),
    "nemotron_3_nano": ("qwen3", ()),
    "lfm2": ("qwen3", ("<|startoftext|>", "<|tool_list_start|>", "<|tool_list_end|>", "<|tool_call_start|>",
                       "<|tool_call_end|>", "<|tool_response_start|>", "<|tool_response_end|>")),
    "muse_glimmer": ("qwen3", ("<|start|>", "<|message|>", "<|eot|>", "<|eom|>", "<|patch|>", "<|video|>")),
    "cohere2": ("qwen3", ("<BOS_TOKEN>", "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|SYSTEM_TOKEN|>",
                          "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>",
                          "<|START_ACTION|>", "<|END_ACTION|>", "<|START_TOOL_RESULT|>", "<|END_TOOL_RESULT|>",
                          "<|START_THINKING|>", "<|END_THINKING|>")),
}  # fmt: skip


def trl_template(name: str) -> str:
    path = assets_dir() / "trl_templates" / f"{name}.jinja"
    if not path.exists():
        pytest.fail(f"TRL chat template {name!r} not found at {path}; run `python scripts/fetch_test_assets.py`", pytrace=False)
    return path.read_text(encoding="utf-8")


def trl_tokenizer(name: str) -> Any:
    """The tokenizer template ``name`` is tested on, with the family's control tokens added (cached:
    callers set ``chat_template`` themselves)."""
    return _paired_tokenizer(*trl_pairing(name))


@functools.cache
def _paired_tokenizer(base: str, added: tuple[str, ...]) -> Any:
    tok = load_asset_tokenizer(base)
    missing = [t for t in added if t not in tok.get_vocab()]
    if missing:
        tok.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
    return tok


def trl_tokenizer_folder(name: str, directory: Path, template: str | None = None) -> Path:
    """A tokenizer folder as a checkpoint of family ``name`` ships it: its tokenizer, its template."""
    tok = trl_tokenizer(name)
    before = tok.chat_template
    tok.chat_template = trl_template(name) if template is None else template
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tok.save_pretrained(directory)
    finally:
        tok.chat_template = before
    return directory


def trl_original_templates() -> list[str]:
    """Names of TRL's original (not ``*_training``) templates, from the fetched folder."""
    folder = assets_dir() / "trl_templates"
    if not folder.exists():
        pytest.fail(f"TRL chat templates not found at {folder}; run `python scripts/fetch_test_assets.py`", pytrace=False)
    return sorted(p.stem for p in folder.glob("*.jinja") if not p.stem.endswith("_training"))


def trl_pairing(name: str) -> tuple[str, tuple[str, ...]]:
    """The tokenizer a TRL template is tested on: the table above, else by family name, else Qwen3's."""
    if name in TRL_TEMPLATE_TOKENIZER:
        return TRL_TEMPLATE_TOKENIZER[name]
    for prefix, pairing in (("gemma4", TRL_TEMPLATE_TOKENIZER["gemma4"]), ("diffusion_gemma", TRL_TEMPLATE_TOKENIZER["gemma4"]),
                            ("gemma", ("gemma3", ())), ("llama", ("llama3", ())), ("deepseek", ("deepseek_v3", ())),
                            ("lfm2", TRL_TEMPLATE_TOKENIZER["lfm2"]), ("cohere", TRL_TEMPLATE_TOKENIZER["cohere2"]),
                            ("nemotron", ("qwen3", ()))):  # fmt: skip
        if name.startswith(prefix):
            return pairing
    return ("qwen3", ())


def trl_family_tokenizer(name: str) -> Any:
    """A fresh tokenizer of family ``name`` whose own chat template is TRL's ``name`` template, as a
    checkpoint ships it (not the shared cached one: callers may change it)."""
    base, added = trl_pairing(name)
    tok = load_asset_tokenizer(base)
    missing = [t for t in added if t not in tok.get_vocab()]
    if missing:
        tok.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
    if "<|startoftext|>" in added:  # LFM2's BOS, which its templates write first
        tok.bos_token = "<|startoftext|>"
    tok.chat_template = trl_template(name)
    return tok


# ----------------------------------------------------------------------------- llama.cpp's real templates
# llama.cpp keeps chat templates copied from model repositories (models/templates, in llama-cpp-python's
# sdist; fetched by scripts/fetch_test_assets.py, never committed): the families TRL does not vendor.
def llamacpp_template(name: str) -> str:
    """The real template ``name`` (a file stem of llama.cpp's models/templates)."""
    path = assets_dir() / "llamacpp_templates" / f"{name}.jinja"
    if not path.exists():
        pytest.fail(f"llama.cpp chat template {name!r} not found at {path}; run `python scripts/fetch_test_assets.py`", pytrace=False)
    return path.read_text(encoding="utf-8")


def tokenizer_with(base: str, added: tuple[str, ...], template: str, bos: str | None = None) -> Any:
    """A fresh offline tokenizer ``base`` with ``added`` control tokens (as special tokens) and ``template``
    as its own chat template, as a checkpoint of that family ships it."""
    tok = load_asset_tokenizer(base)
    missing = [t for t in added if t not in tok.get_vocab()]
    if missing:
        tok.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
    if bos is not None:
        tok.bos_token = bos
    tok.chat_template = template
    return tok
