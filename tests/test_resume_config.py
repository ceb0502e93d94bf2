"""resume= knows its run: the saved config is loaded and checked (issue 41).

Before: resuming without env= trained the default environment from another environment's
checkpoint and overwrote its config.json; resuming a LoRA run without peft= raised AttributeError.
"""

from __future__ import annotations

import json

import pytest

from agentrl.cli.main import main
from agentrl.core.errors import ConfigError
from agentrl.train.build import config_from

SMALL = ["model=default", "prompts_per_step=2", "num_generations=4", "rollout.max_completion_tokens=96"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A 1-step LoRA run of the sokoban environment at a non-default learning rate, checkpointed."""
    run = tmp_path_factory.mktemp("resume") / "run"
    argv = ["train", "env=sokoban", *SMALL, "max_steps=1", "learning_rate=3e-4", "peft.r=4", f"output_dir={run}"]
    assert main(argv) == 0
    return run


def test_resume_takes_the_saved_config_and_the_keys_that_may_change(lora_run):
    cfg = config_from(None, None, {"resume": "latest", "output_dir": str(lora_run), "max_steps": 2})
    assert cfg.env == "sokoban" and cfg.learning_rate == 3e-4 and cfg.peft is not None and cfg.peft.r == 4
    assert cfg.max_steps == 2 and cfg.rollout.max_completion_tokens == 96


@pytest.mark.parametrize(
    "key,value",
    [("env", "calculator"), ("learning_rate", 1e-3), ("peft.r", 8), ("num_generations", 8), ("loss.loss_type", "grpo")],
)
def test_resume_refuses_a_key_that_changes_what_is_trained(lora_run, key, value):
    with pytest.raises(ConfigError, match=rf"resume=latest: {key}=.* differs from the run's {key}="):
        config_from(None, None, {"resume": "latest", "output_dir": str(lora_run), key: value})


def test_a_resumed_lora_run_without_peft_trains_on_and_keeps_its_config(lora_run, capsys):
    saved = json.loads((lora_run / "config.json").read_text())
    assert main(["train", "resume=latest", f"output_dir={lora_run}", "max_steps=2"]) == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (lora_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    after = json.loads((lora_run / "config.json").read_text())
    assert after["env"] == saved["env"] == "sokoban" and after["peft"] == saved["peft"] and after["max_steps"] == 2


def test_a_lora_run_resumes_after_its_base_folder_moved(tmp_path, capsys):
    """The base's folder is not what is trained: when the saved one is gone, model.path may point at
    its new place (and only then: a different base that still exists is refused)."""
    import shutil

    from agentrl.compute.models import resolve_model

    base, run = tmp_path / "base", tmp_path / "run"
    shutil.copytree(resolve_model("default"), base)
    argv = ["train", "env=calculator", f"model={base}", "prompts_per_step=2", "num_generations=4", "max_steps=1", "peft.r=4", f"output_dir={run}"]
    assert main(argv) == 0
    other = tmp_path / "other"
    shutil.copytree(base, other)
    with pytest.raises(ConfigError, match="model.path=.* differs from the run's model.path"):
        config_from(None, None, {"resume": "latest", "output_dir": str(run), "model.path": str(other)})
    moved = tmp_path / "moved"
    base.rename(moved)
    assert main(["train", "resume=latest", f"output_dir={run}", f"model.path={moved}", "max_steps=2"]) == 0, capsys.readouterr().err
    assert "resume: model.path was" in capsys.readouterr().out
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert json.loads((run / "config.json").read_text())["model"]["path"] == str(moved)
