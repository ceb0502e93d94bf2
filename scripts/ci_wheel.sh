#!/usr/bin/env bash
# CI: the package as a user gets it. Build the wheel, check it holds every source file, install it
# WITHOUT -e into a fresh virtual environment, and run the CLI from outside the repository (so
# nothing can be imported from the checkout by accident).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
started=$(date +%s)

python3 -m venv "$work/venv"
. "$work/venv/bin/activate"
pip install -q torch==2.13.0                       # a bare torch requirement would pull a CUDA build
pip wheel -q --no-deps -w "$work/dist" "$repo"
wheel=$(ls "$work"/dist/agentrl-*.whl)
python "$repo/scripts/check_wheel.py" "$wheel" "$repo"
pip install -q "$wheel"

cd "$work"                                          # outside the repository
python -c "import agentrl, sys; assert '/site-packages/' in agentrl.__file__, agentrl.__file__; print('agentrl from', agentrl.__file__)"
agentrl --help >/dev/null
agentrl train --help | grep -q "rollout.max_context"
agentrl envs
agentrl doctor model=default
agentrl eval env=calculator n=8 output="$work/eval"
test -s "$work/eval/results.jsonl" && test -s "$work/eval/summary.json"
echo "ci_wheel: passed in $(( $(date +%s) - started )) s"
