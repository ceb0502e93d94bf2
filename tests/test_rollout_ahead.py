"""Asynchronous rollouts with bounded staleness (``max_staleness``), on the bundled model, on CPU.

Real runs of the trainer: the background thread generates the next batches from its own copy of
the policy while the trainer trains; every step logs the staleness of the episodes it trained on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrl.core.overrides import build, parse_overrides
from agentrl.core.strict import ConfigError
from agentrl.train.config import TrainConfig
from agentrl.train.trainer import Trainer

SMALL = ["prompts_per_step=2", "num_generations=4", "micro_batch_size=4", "rollout.max_tokens_per_turn=32",
         "rollout.max_completion_tokens=160", "learning_rate=2e-5", "samples_per_log=1"]


def train(out, *extra: str) -> Trainer:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = Trainer(build(TrainConfig, parse_overrides([*SMALL, f"output_dir={out}", *extra])))
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    return trainer


def metrics(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("bound", "extra"), [(1, []), (2, []), (1, ["peft.r=8", "learning_rate=1e-3"])], ids=["1", "2", "1-lora"])
def test_staleness_is_bounded_logged_and_corrected(tmp_path, bound, extra):
    """A LoRA policy's copy is the base with the adapter merged in, refreshed with merged weights."""
    steps = 5
    trainer = train(tmp_path / "async", f"max_steps={steps}", f"max_staleness={bound}", *extra)
    rows = metrics(tmp_path / "async")
    assert [m["step"] for m in rows] == list(range(1, steps + 1))
    seen = [m["async/staleness"] for m in rows]
    versions = [m["async/policy_version"] for m in rows]
    print(f"max_staleness={bound}: staleness per step {seen}, behaviour policy versions {versions}")
    assert all(0 <= s <= bound for s in seen)
    assert all(m["step"] - 1 - v == s for m, v, s in zip(rows, versions, seen))
    assert seen[0] == 0  # the first batch is generated from the initial weights
    # the overlap happened: the batch after the first was generated while step 1 trained
    assert max(seen) >= 1
    # step 1: the copy holds exactly the policy's weights, so the sampler's log-probs are the trainer's
    assert rows[0]["loss/is_ratio/mean"] == pytest.approx(1.0, abs=1e-5)
    stale = [m for m in rows if m["async/staleness"] > 0]
    assert all(m["loss/is_ratio/max"] != 1.0 or m["loss/is_ratio/min"] != 1.0 for m in stale)  # the correction acts
    # the run's task order is the synchronous one: the checkpoint records the same data position
    sync = train(tmp_path / "sync", f"max_steps={steps}", *extra)
    assert (trainer.state.data_pos, trainer.state.epoch) == (sync.state.data_pos, sync.state.epoch)
    assert trainer.ahead is not None and not trainer.ahead._thread.is_alive()  # closed at the end


def test_staleness_zero_is_the_synchronous_loop(tmp_path):
    """max_staleness=0 builds no background rollouts: the run is the synchronous one. Two synchronous
    runs are not bit-identical themselves (the generator batches concurrent requests by arrival, so
    the sampler log-probs carry float noise that the sampler correction passes on), so the
    comparison is the same episodes and weights within the data-parallel tests' 1e-6, with the
    correction off as there (with it on, this noise moved weights by up to 1.2e-6 here)."""
    a = train(tmp_path / "default", "max_steps=2", "loss.sampler_is_mode=null")
    b = train(tmp_path / "zero", "max_steps=2", "max_staleness=0", "loss.sampler_is_mode=null")
    assert a.ahead is None and b.ahead is None
    wa = load_file(tmp_path / "default" / "checkpoints" / "step-000002" / "model.safetensors")
    wb = load_file(tmp_path / "zero" / "checkpoints" / "step-000002" / "model.safetensors")
    diff = max((wa[k] - wb[k]).abs().max().item() for k in wa)
    print(f"synchronous vs max_staleness=0: max |param difference| {diff:.3g}")
    assert diff <= 1e-6
    assert [m["reward/mean"] for m in metrics(tmp_path / "default")] == [m["reward/mean"] for m in metrics(tmp_path / "zero")]


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        (["max_staleness=1", "loss.sampler_is_mode=null"], "importance-sampling correction"),
        (["max_staleness=1", "generator=vllm"], "generator.backend=transformers"),
        (["rollout_device=cpu"], "rollout_device has no effect"),
        (["max_staleness=1", "distributed.strategy=fsdp"], "one process"),
    ],
)
def test_bad_async_settings_are_refused(keys, words):
    with pytest.raises(ConfigError) as err:
        build(TrainConfig, parse_overrides(keys))
    assert words in str(err.value)


def test_async_vs_dp_benchmark_logic_on_cpu():
    """benchmarks/async_vs_dp.py's one-process modes on CPU: a RESULT line with the staleness seen."""
    root = Path(__file__).resolve().parents[1]
    small = ["--cpu", "--steps", "3", "--prompts", "2", "--generations", "4", "--tokens", "32", "--micro", "4"]
    results = {}
    for mode in ("sync", "async"):
        done = subprocess.run([sys.executable, "benchmarks/async_vs_dp.py", "--mode", mode, *small], cwd=root, capture_output=True, text=True,
                              timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr[-3000:]
        line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
        results[mode] = json.loads(line.removeprefix("RESULT "))
    print(results)
    assert results["sync"]["staleness"] is None and results["sync"]["steps"] == 3
    assert len(results["async"]["staleness"]) == 3 and all(0 <= s <= 1 for s in results["async"]["staleness"])
    assert all(r["episodes_per_s"] > 0 for r in results.values())


def test_background_failure_stops_the_run_with_a_clear_error(tmp_path):
    """The background generator fails at its second batch: the trainer raises one error that says
    which step and why, instead of waiting forever, and the background thread is stopped."""
    from agentrl.rollout.ahead import RolloutAheadError

    trainer = Trainer(build(TrainConfig, parse_overrides([*SMALL, f"output_dir={tmp_path}", "max_steps=3", "max_staleness=1"])))
    original, calls = trainer.ahead.generator.begin_rollout, []

    def failing() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("CUDA error: an illegal memory access (simulated)")
        original()

    trainer.ahead.generator.begin_rollout = failing
    with pytest.raises(RolloutAheadError, match=r"background rollout for step 1 failed: RuntimeError: CUDA error"):
        trainer.train()
    assert not trainer.ahead._thread.is_alive()
    assert [m["step"] for m in metrics(tmp_path)] == [1]


def race_a_compiled_call_with_tracing() -> torch.Tensor:
    """Call a dynamo-compiled function on this thread while another thread is inside FX tracing
    (as AOTAutograd is while the learner compiles its layers)."""
    import threading

    compiled = torch.compile(lambda x: x * 2 + 1, backend="eager")
    inside, release = threading.Event(), threading.Event()

    def traced(x):
        inside.set()
        release.wait(30)
        return x + 1

    tracer = threading.Thread(target=torch.fx.symbolic_trace, args=(traced,))
    tracer.start()
    assert inside.wait(30)
    try:
        return compiled(torch.ones(3))
    finally:
        release.set()
        tracer.join()


def test_the_generators_compiled_step_survives_the_learner_compiling_on_another_thread(tmp_path):
    """With rollouts ahead, the generation copy's compiled decode step runs on its own thread while
    the learner's first steps compile its layers. FX's tracing flag is one for the process, so that
    call raised "using FX to symbolically trace a dynamo-optimized function" and every episode of
    the batch failed (H200, tests/test_generator_cuda.py). Starting rollouts ahead allows it."""
    from agentrl.compute.compile_layers import allow_compiled_calls_beside_tracing

    # torch's default, restored after by dynamo's own patch: pytest's monkeypatch deletes the
    # setting on undo, which hid it from torch.utils.checkpoint in every later test
    before = torch._dynamo.config.error_on_nested_fx_trace
    with torch._dynamo.config.patch(error_on_nested_fx_trace=True):
        allow_compiled_calls_beside_tracing()
        assert torch.equal(race_a_compiled_call_with_tracing(), torch.full((3,), 3.0))
    # and the trainer's rollouts ahead turn it on
    with torch._dynamo.config.patch(error_on_nested_fx_trace=True):
        train(tmp_path, "max_steps=1", "max_staleness=1")
        assert torch.equal(race_a_compiled_call_with_tracing(), torch.full((3,), 3.0))
    assert torch._dynamo.config.error_on_nested_fx_trace is before
