"""A loss of the user's own (an installed plugin, or a plain file), selected from the CLI, trains the bundled model."""

from __future__ import annotations

import json
import sys

import pytest

from agentrl.cli.main import main
from agentrl.learn.losses import LOSSES

PLUGIN = '''
import torch

from agentrl.learn.losses import register_loss


@register_loss("test_plugin_reinforce", aggregation="sequence_mean")
def plain_reinforce(inp):
    """REINFORCE with the PPO ratio, no clipping: minus ratio x advantage per token."""
    return -inp.ratio * inp.advantages, {"plugin/calls": torch.ones(())}
'''

SMALL = [
    "prompts_per_step=2",
    "num_generations=4",
    "micro_batch_size=4",
    "rollout.max_tokens_per_turn=32",
    "rollout.max_completion_tokens=160",
    "max_steps=2",
    "save_final=false",
]


def install_plugin(tmp_path, monkeypatch) -> str:
    """An installed plugin: a module plus an entry point in the ``agentrl.losses`` group, the way a
    pip-installed package publishes it (a .dist-info folder on sys.path). Selected by its name."""
    site = tmp_path / "site"
    (site / "my_agentrl_losses").mkdir(parents=True)
    (site / "my_agentrl_losses" / "__init__.py").write_text(PLUGIN)
    info = site / "my_agentrl_losses-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-agentrl-losses\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[agentrl.losses]\ntest_plugin_reinforce = my_agentrl_losses\n")
    monkeypatch.syspath_prepend(str(site))
    return "test_plugin_reinforce"


def user_file(tmp_path, monkeypatch) -> str:
    """A plain file of the user's, nothing installed: selected as ``path/to/file.py:name``."""
    path = tmp_path / "my_losses.py"
    path.write_text(PLUGIN)
    return f"{path}:test_plugin_reinforce"


@pytest.mark.parametrize("source", [install_plugin, user_file], ids=["installed-plugin", "user-file"])
def test_user_loss_selected_by_name_trains_two_steps(source, tmp_path, monkeypatch, capsys):
    loss_type = source(tmp_path, monkeypatch)
    out = tmp_path / "run"
    try:
        code = main(["train", "env=calculator", *SMALL, f"loss.loss_type={loss_type}", f"output_dir={out}"])
        assert code == 0, capsys.readouterr().err
        steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [s["step"] for s in steps] == [1, 2]
        assert all(s["loss/plugin/calls"] == 1.0 for s in steps)  # the user's function computed the loss
        assert all(s["grad_norm"] > 0 for s in steps)
        assert "clip_ratio/region" not in " ".join(steps[0])  # and not a built-in one
    finally:
        LOSSES.pop("test_plugin_reinforce", None)
        sys.modules.pop("my_agentrl_losses", None)


def test_unknown_loss_is_one_clear_error(capsys):
    assert main(["train", "env=calculator", "loss.loss_type=no_such_loss"]) == 2
    err = capsys.readouterr().err
    assert "loss.loss_type" in err and "no_such_loss" in err and "register_loss" in err
