"""Ctrl-C during `agentrl train`: the step finishes, a checkpoint is written, one line, no traceback, resumable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from agentrl.train.trainer import Trainer

ARGS = ["prompts_per_step=2", "num_generations=2", "micro_batch_size=4", "rollout.max_tokens_per_turn=24", "rollout.max_completion_tokens=96", "save_every=0"]


CURRICULUM = ["dynamic_sampling.enabled=true", "dynamic_sampling.max_rounds=1", "curriculum.key=difficulty", "env_args.difficulty=[1,2,3]"]


def test_ctrl_c_saves_a_resumable_checkpoint_and_prints_one_line(tmp_path):
    interrupt_and_resume(tmp_path, [])


@pytest.mark.slow
def test_ctrl_c_with_dynamic_sampling_and_curriculum(tmp_path):
    """The checkpoint written on Ctrl-C carries the curriculum's state, and the resumed run starts from it."""
    interrupt_and_resume(tmp_path, CURRICULUM)


def interrupt_and_resume(tmp_path, extra: list[str]) -> None:
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "agentrl.cli.main", "train", *ARGS, *extra, "max_steps=500", f"output_dir={run}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 1):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no training step within 240 s"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in out + err, err
    lines = [x for x in out.splitlines() if x.startswith("interrupted")]
    assert len(lines) == 1, out
    step = int(lines[0].split("after step ")[1].split(",")[0])
    assert 1 <= step < 500
    ckpt = run / "checkpoints" / f"step-{step:06d}"
    assert json.loads((ckpt / "trainer_state.json").read_text())["step"] == step
    assert str(ckpt) in lines[0] and "resume=latest" in lines[0]

    from agentrl.core.overrides import build, parse_overrides
    from agentrl.train.config import TrainConfig

    resumed = Trainer(build(TrainConfig, parse_overrides([*ARGS, *extra, f"max_steps={step + 1}", f"output_dir={run}", "resume=latest"])))
    assert resumed.step == step
    if extra:
        saved = json.loads((ckpt / "trainer_state.json").read_text())["curriculum"]
        assert resumed.draw.curriculum is not None and resumed.draw.curriculum.state_dict() == saved
    resumed.train()
    assert (run / "checkpoints" / f"step-{step + 1:06d}" / "trainer_state.json").is_file()


def test_time_limit_stops_after_the_step_that_passes_it_with_a_resumable_checkpoint(tmp_path, capsys):
    """``time_limit_min`` bounds a run on a slow machine (issue 47's 60-minute budget): the first step
    that ends past the limit is the last, it is checkpointed, one line says so, and resume continues."""
    from agentrl.core.overrides import build, parse_overrides
    from agentrl.train.config import TrainConfig

    run = tmp_path / "run"
    trainer = Trainer(build(TrainConfig, parse_overrides([*ARGS, "max_steps=50", "time_limit_min=0.0001", f"output_dir={run}"])))
    trainer.train()
    assert trainer.step == 1 and not trainer.interrupted
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("time limit")]
    assert len(lines) == 1 and "after step 1 of 50" in lines[0] and "resume=latest" in lines[0], lines
    assert json.loads((run / "checkpoints" / "step-000001" / "trainer_state.json").read_text())["step"] == 1
    resumed = Trainer(build(TrainConfig, parse_overrides([*ARGS, "max_steps=2", "time_limit_min=600", f"output_dir={run}", "resume=latest"])))
    assert resumed.step == 1 and resumed.cfg.time_limit_min == 600, "a resumed run takes a new time limit"
    resumed.train()
    assert resumed.step == 2 and (run / "checkpoints" / "step-000002" / "trainer_state.json").is_file()
