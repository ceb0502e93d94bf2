"""``agentrl --help`` and ``agentrl <command> --help``: the commands, and every key with its type,
default and description, generated from the config models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.cli.help import config_keys
from agentrl.cli.main import COMMANDS, main
from agentrl.core.overrides import build
from agentrl.core.strict import ConfigError
from agentrl.rollout.config import EvalConfig
from agentrl.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


def test_top_level_help_lists_every_command(capsys):
    code, out = run(capsys, "--help")
    assert code == 0
    for name in COMMANDS:
        assert f"  {name} " in out


@pytest.mark.parametrize("command", [c for c, (_, _, model) in COMMANDS.items() if model])
def test_command_help_lists_every_key(command, capsys):
    code, out = run(capsys, command, "--help")
    assert code == 0 and "expected key=value" not in out
    from agentrl.cli.main import _load

    rows = config_keys(_load(COMMANDS[command][2]))
    assert rows
    for key, kind, default, doc in rows:
        assert f"\n  {key}  {kind}  (default: {default})\n      {doc}\n" in out + "\n", key
        assert doc, f"agentrl {command} --help: {key} has no description"


def test_train_help_shows_train_defaults_types_and_descriptions(capsys):
    _, out = run(capsys, "train", "-h")
    assert "  rollout.max_context  int  (default: 1024)\n      prompt + completion tokens" in out  # train's, not eval's 2048
    assert "  sampling.temperature  float  (default: 0.7)" in out
    assert "  lr_scheduler  one of: constant, constant_with_warmup, linear, cosine  (default: constant)" in out
    assert "  peft  section | null  (default: null)" in out and "  peft.r  int  (default: 16)" in out
    _, out = run(capsys, "eval", "--help")
    assert "  rollout.max_context  int  (default: 2048)" in out


def test_help_in_any_position_and_for_commands_without_keys(capsys):
    code, out = run(capsys, "train", "env=calculator", "--help")
    assert code == 0 and "learning_rate" in out
    code, out = run(capsys, "envs", "--help")
    assert code == 0 and "takes no keys" in out
    code, out = run(capsys, "view", "--help")
    assert code == 0 and "usage: agentrl view" in out
    for key in ("source  str  (default: required)", "out  str | null  (default: null)", "tokenizer  str | null  (default: null)"):
        assert f"\n  {key}\n      " in out, key


@pytest.mark.parametrize("model", [TrainConfig, EvalConfig])
def test_every_listed_default_is_accepted_back(model):
    """The listing is the model: each key with its shown default is a key the command knows, of the shown type."""
    for key, _, default, _ in config_keys(model):
        if default in ("see below", "required"):
            continue
        value = {"null": None, "true": True, "false": False}.get(default, default)
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                if value.startswith("("):
                    continue  # a tuple, shown as Python writes it
        node: dict = {}
        cursor = node
        *parents, last = key.split(".")
        for part in parents:
            cursor = cursor.setdefault(part, {})
        cursor[last] = value
        try:
            build(model, node)
        except ConfigError as exc:  # strict: a knob of another mode may not be set, even to its default
            assert "unknown key" not in str(exc) and ("no effect" in str(exc) or "only for backend" in str(exc)), (key, exc)


def test_console_script_help_runs_as_a_program():
    proc = subprocess.run([sys.executable, "-m", "agentrl.cli.main", "train", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "rollout.max_context" in proc.stdout and "Traceback" not in proc.stderr


def test_ci_runs_the_wheel_check_and_the_setup_script():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/ci_wheel.sh" in ci
    setup = (ROOT / "scripts" / "setup_test_machine.sh").read_text()
    assert "chromium" in setup and "apt-get install" in setup and "fetch_test_assets.py" in setup


def test_the_reward_summary_line_never_repeats_a_step():
    """A 1-step run printed "step 1: 0.250, step 1: 0.250"; a resumed run called its first step "step 1"."""
    from agentrl.cli.main import reward_summary

    assert reward_summary([{"step": 1, "reward/mean": 0.25}]) == "reward: 0.250 (step 1)\n"
    rows = [{"step": s, "reward/mean": s / 10} for s in (4, 5, 6)]
    assert reward_summary(rows) == "reward: first 1 steps 0.400 -> last 1 steps 0.600 (step 4: 0.400, step 6: 0.600)\n"
    assert reward_summary([]) == ""
