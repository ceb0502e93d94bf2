"""benchmarks/gpu_vs_trl.py reports every ratio against each TRL path that ran, refuses bad
arguments before a model is built, and returns what it measured when a run outlives the deadline."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import gpu_vs_trl as bench  # noqa: E402


def result(framework: str, step: float, peak: float, **extra: object) -> dict:
    return {"row": "8x8x256", "framework": framework, "step_s": step, "gen_s": step / 2, "train_s": step / 2,
            "learn_s": step / 2, "sampled_tokens": 16384, "peak_gib": peak, "first_step_end_s": 90.0, "first_step_s": 70.0, **extra}


def agentrl_line(text: str) -> list[str]:
    line = next(row for row in text.splitlines() if row.startswith("| 8x8x256 | agentrl |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_the_agentrl_row_carries_one_ratio_per_trl_path():
    text = bench.table([result("agentrl", 1.0, 6.0), result("trl", 10.0, 8.0), result("trl_cb", 20.0, 60.0)])
    cells = agentrl_line(text)
    assert cells[-3] == "10.00x faster / 20.00x faster"
    assert cells[-2] == "10.00x / 20.00x"  # learner: TRL's seconds over agentrl's
    assert cells[-1] == "0.75x / 0.10x"
    assert cells[9] == "90.0 (70.0)"  # first step end (first step)
    assert "| 8x8x256 | TRL (continuous batching) | 20.00 |" in text


def test_a_trl_path_that_failed_or_did_not_run_reads_as_a_dash():
    text = bench.table([result("agentrl", 2.0, 6.0), {"row": "8x8x256", "framework": "trl", "error": "killed after 80 s (--deadline)"}])
    cells = agentrl_line(text)
    assert cells[-3] == ""  # no TRL path to compare with: no ratio, not a made-up one
    assert "failed: killed after 80 s" in text
    cb_only = agentrl_line(bench.table([result("agentrl", 2.0, 6.0), result("trl_cb", 3.0, 12.0)]))
    assert cb_only[-3] == "- / 1.50x faster"


def args(**keys: object) -> argparse.Namespace:
    base = {"frameworks": "agentrl,trl", "rows": "8x8x256", "lora": None, "model": None, "shape": None, "cpu": False}
    return argparse.Namespace(**{**base, **keys})


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"frameworks": "agentrl,trl_fast"}, "trl_fast"),
        ({"rows": "8x8"}, "'8x8'"),
        ({"rows": "mt8x0"}, "'mt8x0'"),
        ({"rows": "mt8x8", "lora": 16}, "--lora"),
        ({"frameworks": "agentrl_offload,trl", "lora": 16}, "--lora"),
        ({"cpu": True, "model": "/nonexistent/folder"}, "/nonexistent/folder"),
    ],
)
def test_bad_arguments_stop_before_any_model_is_built(keys: dict, named: str):
    with pytest.raises(SystemExit) as stop:
        bench.check_args(args(**keys))
    assert named in str(stop.value)


def test_good_arguments_give_the_frameworks_in_run_order():
    assert bench.check_args(args(frameworks="agentrl,trl_cb,trl", lora=16)) == ["agentrl", "trl_cb", "trl"]


def test_weights_report_what_a_run_trained():
    model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 10).to(torch.bfloat16))
    model[0].requires_grad_(False)
    assert bench.weights(model) == {"trainable_m": 0.0, "dtypes": ["bfloat16", "float32"], "trainable_dtypes": ["bfloat16"]}


def test_a_worker_past_the_deadline_is_killed_with_its_children(tmp_path: Path):
    # the worker starts a grandchild (as torch.compile's workers are) that would outlive a plain kill
    marker = tmp_path / "grandchild-alive"
    script = tmp_path / "worker.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import sys, time; time.sleep(2); open(sys.argv[1], \"w\")', sys.argv[1]])\n"
        "print('RESULT {\"partial\": true}', flush=True)\n"
        "time.sleep(30)\n"
    )
    t = time.perf_counter()
    stdout, stderr = bench.run_worker([sys.executable, str(script), str(marker)], tmp_path / "w.log", timeout=1.0)
    assert time.perf_counter() - t < 10
    assert "killed after 1 s (--deadline)" in stderr
    assert 'RESULT {"partial": true}' in stdout  # what the log held before the kill comes back
    time.sleep(2.5)
    assert not marker.exists()
