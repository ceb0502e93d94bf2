"""Trackers for real: TensorBoard receives the run's scalars and flat hparams (issue 41: it crashed at start)."""

from __future__ import annotations

import json

import pytest

from agentrl.cli.main import main
from agentrl.core.overrides import build
from agentrl.observe.trackers import flat_hparams
from agentrl.train.config import TrainConfig

SMALL = [
    "env=calculator",
    "model=default",
    "max_steps=2",
    "prompts_per_step=2",
    "num_generations=4",
    "save_final=false",
]
# What a TRL user reads, under agentrl's names (docs/from_trl.md has the table).
DOCUMENTED = [
    "reward/mean", "reward/group_std", "reward/correct", "reward/correct/std", "completions/mean_length",
    "completions/clipped_ratio", "loss/kl/mean", "loss/clip_ratio/region", "loss/entropy/mean",
]  # fmt: skip


def test_the_config_reaches_trackers_as_flat_scalars():
    flat = flat_hparams(json.loads(json.dumps(build(TrainConfig, {}).model_dump(), default=str)))
    assert flat["sampling.temperature"] == 0.7 and flat["peft"] == "null" and flat["report_to"] == "[]"
    assert all(isinstance(v, int | float | str | bool) for v in flat.values())


def test_report_to_takes_one_tracker_as_a_string():
    assert build(TrainConfig, {"report_to": "tensorboard"}).report_to == ["tensorboard"]
    assert build(TrainConfig, {"report_to": "none"}).report_to == []


@pytest.mark.parametrize("report_to", ["report_to=[tensorboard]", "report_to=tensorboard"])
def test_tensorboard_writes_event_files_with_the_documented_scalars(report_to, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    assert main(["train", *SMALL, "loss.beta=0.04", report_to, f"output_dir={run}"]) == 0  # beta > 0: a KL to log
    events = sorted(run.rglob("events.out.tfevents.*"))
    assert events, list(run.rglob("*"))
    tags: set[str] = set()
    steps: dict[str, list[int]] = {}
    for path in events:
        acc = EventAccumulator(str(path))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            tags.add(tag)
            steps[tag] = [e.step for e in acc.Scalars(tag)]
    missing = [t for t in DOCUMENTED if t not in tags]
    assert not missing, sorted(tags)
    assert steps["reward/mean"] == [1, 2]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(0 <= r["reward/group_std"] for r in rows) and all(r["completions/mean_length"] > 0 for r in rows)


def test_wandb_offline_receives_the_scalars_and_the_flat_config(tmp_path, monkeypatch):
    """W&B in offline mode (no account, no network): the run's file holds the step scalars and the
    flat config (wandb 0.31 keeps both, protobuf-encoded, in offline-run-*/run-*.wandb)."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    assert main(["train", *SMALL, "report_to=wandb", f"output_dir={run}"]) == 0
    [record] = list(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
    data = record.read_bytes()
    assert all(name.encode() in data for name in ("reward/mean", "reward/group_std", "completions/mean_length", "sampling.temperature"))


def test_trackio_receives_the_scalars(tmp_path, monkeypatch):
    """trackio keeps runs in a local SQLite database (TRACKIO_DIR, read when trackio is imported)."""
    import sqlite3
    import sys

    if "trackio" in sys.modules:
        pytest.skip("trackio was imported before this test could point it at a temporary folder")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    pytest.importorskip("trackio")
    run = tmp_path / "run"
    assert main(["train", *SMALL, "report_to=trackio", f"output_dir={run}"]) == 0
    [db] = list((tmp_path / "trackio").glob("*.db"))
    rows = sqlite3.connect(db).execute("SELECT step, metrics FROM metrics ORDER BY step").fetchall()
    assert [step for step, _ in rows] == [1, 2]
    logged = json.loads(rows[-1][1])
    assert all(isinstance(logged[k], float) for k in ("reward/mean", "reward/group_std", "completions/mean_length"))
