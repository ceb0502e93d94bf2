"""Generation on its own ranks (``distributed.generator_ranks``) on CPU with gloo: generator ranks
beside trainer ranks in one job take the steps one process takes, bound their staleness, move only
the adapter when training LoRA, and a dead or hung rank of either kind ends the job in one line.

The launches are real ``torchrun`` runs (or processes given the rendezvous variables by hand) of
``python -m agentrl train`` on the bundled model; the reference is the one-process run of the same
configuration through the Python API (helpers from test_distributed.py, same tolerance).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_distributed import ROOT, assert_same_run, env_vars, free_port, metrics, reference, run, samples, train_args

from agentrl.compute.models import resolve_model
from agentrl.compute.reference import load_policy
from agentrl.core.overrides import build, parse_overrides
from agentrl.core.strict import ConfigError
from agentrl.train.config import TrainConfig
from agentrl.train.trainer import Trainer


def torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1", "--master_port", str(free_port())]


def versions(run_dir: Path) -> list[tuple[int, int]]:
    """(step, policy_version) of every logged trajectory."""
    return [(rec["step"], rec["policy_version"]) for rec in samples(run_dir)]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_one_generator_two_trainers_equal_one_process(tmp_path, strategy):
    """1 generator rank + 2 trainer ranks (data parallel, or FSDP2-sharded: each full tensor is
    gathered before the broadcast) at max_staleness=0: the weights, the sampled episodes and the
    metrics of one process with the same global batch."""
    one = reference(tmp_path / "one")
    many = tmp_path / "many"
    run([*torchrun(3), *train_args(many, "distributed.generator_ranks=1", f"distributed.strategy={strategy}")])
    assert_same_run(one, many)
    logged = metrics(many)
    assert [m["async/staleness"] for m in logged] == [0.0, 0.0]
    assert [m["async/policy_version"] for m in logged] == [0.0, 1.0]
    assert versions(many) and all(version == step - 1 for step, version in versions(many))
    assert all(m["sync/weight_tensors"] == 50 for m in logged)  # every tensor of the bundled model (tied head left out)


def test_lora_adapter_only_sync_and_staleness_one(tmp_path):
    """LoRA with max_staleness=1: each sync broadcasts the adapter's factors and nothing else (their
    count and bytes), and no trajectory's policy version lags its step by more than 1."""
    many = tmp_path / "many"
    lora = ["peft.r=8", "loss.loss_type=grpo", "learning_rate=1e-4"]
    run([*torchrun(3), *train_args(many, *lora, "distributed.generator_ranks=1", "max_staleness=1", "loss.sampler_is_mode=truncate", "max_steps=3")])
    peft = TrainConfig(peft={"r": 8}).peft.model_dump()
    policy, _ = load_policy(resolve_model("default"), torch.float32, "cpu", peft)
    from peft import get_peft_model_state_dict

    adapter = get_peft_model_state_dict(policy)
    adapter_bytes = sum(t.numel() * t.element_size() for t in adapter.values())  # fp32 on CPU
    full_bytes = sum(t.numel() * t.element_size() for n, t in policy.get_base_model().state_dict().items() if "lora_" not in n)
    assert adapter and all("lora_" in n for n in adapter) and adapter_bytes < full_bytes / 10
    logged = metrics(many)
    assert [m["step"] for m in logged] == [1, 2, 3]
    for m in logged:
        assert m["sync/weight_tensors"] == len(adapter)
        assert m["sync/weight_bytes"] == adapter_bytes
        assert 0 <= m["async/staleness"] <= 1
    lags = [step - 1 - version for step, version in versions(many)]
    print(f"adapter tensors per sync: {len(adapter)}, {adapter_bytes} bytes of {full_bytes}; staleness per step {[m['async/staleness'] for m in logged]}; trajectory lags {sorted(set(lags))}")
    assert lags and all(0 <= lag <= 1 for lag in lags)
    assert logged[0]["async/staleness"] == 0  # the first batch is sampled by the starting weights


def test_two_machines_over_loopback(tmp_path):
    """Two "machines" (torchrun --nnodes 2, one process each) meeting at 127.0.0.1: machine 1 is the
    generator rank, machine 0 the (single) trainer; the run is one process's."""
    one = reference(tmp_path / "one")
    many = tmp_path / "many"
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node), "--nproc_per_node", "1",
             "--master_addr", "127.0.0.1", "--master_port", port, *train_args(many, "distributed.generator_ranks=1")],
            cwd=ROOT, env=env_vars(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for node in (0, 1)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-4000:]
    assert_same_run(one, many)


def launch_by_hand(out: Path, timeout: int) -> list[subprocess.Popen]:
    """Rank 0 and 1 train, rank 2 generates; no torchrun agent, so each survivor must stop itself."""
    args = [sys.executable, *train_args(out, "distributed.generator_ranks=1", f"distributed_timeout_s={timeout}", "max_steps=30", "save_final=false")]
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3"}
    return [
        subprocess.Popen(args, cwd=ROOT, env=env_vars(**common, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(3)
    ]


@pytest.mark.parametrize("fault", ["kill-generator", "stall-generator", "kill-trainer"])
def test_dead_or_hung_rank_ends_the_job_with_one_line(tmp_path, fault):
    """After step 1, the generator rank is killed or stopped (SIGSTOP: hung), or trainer rank 1 is
    killed: the others stop with one line naming the rank and what it was doing, within the timeout."""
    timeout = 40  # also bounds the rendezvous of three processes loading side by side
    procs = launch_by_hand(tmp_path, timeout)
    victim = procs[1] if fault == "kill-trainer" else procs[2]
    try:
        deadline = time.monotonic() + 240
        while not ((tmp_path / "metrics.jsonl").is_file() and (tmp_path / "metrics.jsonl").read_text().strip()):
            assert time.monotonic() < deadline and procs[0].poll() is None, procs[0].communicate()[1][-3000:]
            time.sleep(0.2)
        os.kill(victim.pid, signal.SIGSTOP if fault == "stall-generator" else signal.SIGKILL)
        hit = time.monotonic()
        _, err0 = procs[0].communicate(timeout=timeout + 60)
        took = time.monotonic() - hit
        last = err0.strip().splitlines()[-1] if err0.strip() else ""
        print(f"[{fault}] rank 0 exited {procs[0].returncode} {took:.1f}s after the fault: {last}")
        assert procs[0].returncode == 1, err0[-3000:]
        assert "Traceback" not in err0, err0[-3000:]
        assert took <= timeout + 20, took  # the timeout, plus telling the hung generator to stop (5 s) and leaving
        if fault == "kill-trainer":
            assert "a collective with the other ranks failed" in last, last
            _, err2 = procs[2].communicate(timeout=timeout + 30)
            print(f"[{fault}] rank 2 exited {procs[2].returncode}: {err2.strip().splitlines()[-1]}")
            gen = err2.strip().splitlines()[-1]
            assert procs[2].returncode == 1, err2[-3000:]
            # it failed sending to the dead trainer, or heard first from trainer 0 that the trainers failed
            assert "rank 1 (trainer 1) died, stalled" in gen or "the trainer ranks stopped with an error" in gen, gen
        else:
            assert last.startswith("agentrl train: rank 0 (trainer 0) of 3: waiting for the batch of step 2 from rank 2 (generator 0) failed"), last
            assert "rank 2 (generator 0) died, stalled" in last, last
            if fault == "stall-generator":  # it stopped while rolling out (or just before): its last note says so
                assert "it was last rolling out the batch of step 2" in last or "it was last waiting for weights" in last, last
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_bad_layouts_are_refused(monkeypatch):
    """Before any model loads: no launcher, no trainer left, and the settings that do not combine."""
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ConfigError, match="torchrun"):
        Trainer(env="calculator", **{"distributed.generator_ranks": 1})
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="leaves no trainer rank"):
        Trainer(env="calculator", **{"distributed.generator_ranks": 2})
    for keys, match in [
        (["curriculum.key=difficulty"], "curriculum"),
        (["dynamic_sampling.enabled=true"], "dynamic_sampling"),
        (["max_staleness=1", "rollout_device=cpu"], "rollout_device"),
        (["max_staleness=1", "loss.sampler_is_mode=null"], "sampler importance-sampling"),
    ]:
        with pytest.raises(ConfigError, match=match):
            build(TrainConfig, parse_overrides(["distributed.generator_ranks=1", *keys]))


def test_ctrl_c_finishes_the_step_saves_and_stops_the_generator(tmp_path):
    """SIGINT to every process, as a terminal's Ctrl-C sends it: the generator rank ignores it, the
    trainers finish the step, save it, and tell the generator to stop; nobody fails."""
    procs = launch_by_hand(tmp_path, 40)
    try:
        deadline = time.monotonic() + 240
        while not ((tmp_path / "metrics.jsonl").is_file() and (tmp_path / "metrics.jsonl").read_text().strip()):
            assert time.monotonic() < deadline and procs[0].poll() is None, procs[0].communicate()[1][-3000:]
            time.sleep(0.2)
        for p in procs:
            os.kill(p.pid, signal.SIGINT)
        outs = [p.communicate(timeout=120) for p in procs]
        codes = [p.returncode for p in procs]
        print(f"[ctrl-c] exit codes {codes}; rank 0: {outs[0][0].strip().splitlines()[-1]}")
        assert codes == [130, 130, 0], [err[-2000:] for _, err in outs]
        assert all("Traceback" not in err for _, err in outs)
        step = metrics(tmp_path)[-1]["step"]
        assert f"interrupted: stopped after step {step}" in outs[0][0]
        assert (tmp_path / "checkpoints" / f"step-{step:06d}" / "trainer_state.json").is_file()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
