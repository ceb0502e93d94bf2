"""Data parallel on CPU with gloo: N processes take the steps one process takes, across "machines" too,
and a dead or stalled rank ends the run with a clear error instead of a hang.

The multi-process runs are real launches (``accelerate launch``, ``torchrun``, or processes given
the rendezvous variables by hand) of ``python -m agentrl train`` on the bundled model; the
one-process reference is the same configuration through the Python API.

Why the sampler importance-sampling correction is off in these comparisons: each rank's generator
decodes only its own episodes, so its batches (padding widths) differ from one process's and the
sampler log-probs differ by float noise; the sampled tokens are the same (the per-episode seeds
depend on the global task index, asserted below). Through the correction's weights and Adam that
noise moved parameters by 2e-7 in the loopback test's configuration, but by up to 3.6e-6 with
advantage_scale=batch and steps_per_generation=2 (lr 2e-5; one process against itself with other
generation batches moved them by 1.8e-7). With the correction off the learning path itself is
compared: it agreed to 6e-8 or better.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrl.core.overrides import build, parse_overrides
from agentrl.environments.calculator import CalculatorEnv
from agentrl.train.config import TrainConfig
from agentrl.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "prompts_per_step=2",
    "num_generations=4",
    "micro_batch_size=3",  # 8 rows per step: uneven micro-batches on one process (3+3+2) and on each rank (padded path)
    "micro_batch_tokens=300",  # packed (the default): a group's ~370 tokens split in two units, several micro-batches
    "rollout.max_tokens_per_turn=32",
    "rollout.max_completion_tokens=160",
    "learning_rate=2e-5",
    "max_steps=2",
    "samples_per_log=1",
    "loss.sampler_is_mode=null",  # see the module docstring
    # the test split's one- and two-call tasks, not the default run's three-call ones: the longer
    # episodes put the FSDP comparison's float noise (Adam on near-zero gradients) at 2.7e-6, over TOL
    "env_args.train_difficulty=[1,2]",
]
TOL = 1e-6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env_vars(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


def reference(out: Path, *extra: str) -> Path:
    """The one-process run of the same configuration, on one thread like each launched process
    (two OpenMP threads on a loaded two-core machine made a step 30x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        Trainer(build(TrainConfig, parse_overrides([*SMALL, f"output_dir={out}", *extra]))).train()
    finally:
        torch.set_num_threads(threads)
    return out


def run(cmd: list[str], timeout: float = 300, **extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=ROOT, env=env_vars(**extra), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(cmd[:6])} ... exited {done.returncode}:\n{done.stderr[-4000:]}"
    return done


def train_args(out: Path, *extra: str) -> list[str]:
    return ["-m", "agentrl", "train", *SMALL, f"output_dir={out}", "distributed_timeout_s=120", *extra]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    ckpt = run_dir / "checkpoints" / "step-000002"
    files = sorted(ckpt.glob("*.safetensors"))
    assert files, f"no weights in {ckpt}"
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update({f"{f.name}:{k}": v for k, v in load_file(f).items()})
    return out


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_same_run(one: Path, many: Path) -> float:
    """Same weights within TOL, same rollouts (rewards, token counts), one metrics line per step."""
    a, b = final_weights(one), final_weights(many)
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"max |param difference| {one.name} vs {many.name}: {worst:.3g}")
    assert worst <= TOL, worst
    ma, mb = metrics(one), metrics(many)
    assert [m["step"] for m in mb] == [m["step"] for m in ma]  # rank 0 alone writes
    for x, y in zip(ma, mb):
        for key in ("reward/mean", "reward/std", "rollout/episodes", "rollout/tokens/sampled", "adv/advantages/std"):
            if key in x:
                assert y[key] == pytest.approx(x[key], rel=1e-6, abs=1e-9), key
        if "loss/loss" in x:  # not on the step-0 eval record
            assert y["loss/loss"] == pytest.approx(x["loss/loss"], rel=1e-3, abs=1e-7)
    sa, sb = samples(one), samples(many)
    assert len(sa) == len(sb) > 0
    noise = 0.0
    for x, y in zip(sa, sb):  # the same episodes were sampled
        assert [s["completion_ids"] for s in x["samples"]] == [s["completion_ids"] for s in y["samples"]]
        for p, q in zip(x["samples"], y["samples"]):
            # null: a demonstrated token, which no sampler drew (guidance), on both runs alike
            assert [u is None for u in p["logprobs"]] == [v is None for v in q["logprobs"]]
            noise = max([noise, *(abs(u - v) for u, v in zip(p["logprobs"], q["logprobs"]) if u is not None)])
    print(f"max |sampler logprob difference|: {noise:.3g}")
    return worst


def samples(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]


def test_two_processes_equal_one_dapo_batch_scale_accelerate_launch(tmp_path):
    """dapo's token mean over the global batch, advantage_scale=batch (statistics over all ranks),
    two optimizer steps from one generation batch (old log-probs, rows split per step)."""
    # 4 tasks: two groups in each of the two steps, so each rank trains whole groups and computes
    # each shared prompt from the same rows as one process (agentrl.compute.parallel.distributed.group_cuts)
    extra = ["advantage_scale=batch", "steps_per_generation=2", "prompts_per_step=4"]
    one = reference(tmp_path / "one", *extra)
    many = tmp_path / "many"
    # --multi_gpu is accelerate's torchrun-style launcher; on a machine without GPUs each process
    # then runs gloo on CPU (accelerate's --cpu launches several processes only through mpirun)
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
              "--main_process_port", str(free_port()), "--mixed_precision", "no", "--dynamo_backend", "no"]
    run([*launch, *train_args(many, *extra)])
    assert_same_run(one, many)
    assert json.loads((many / "checkpoints" / "step-000002" / "trainer_state.json").read_text())["world_size"] == 2


def test_lora_two_processes_equal_one_torchrun(tmp_path):
    extra = ["peft.r=8", "loss.loss_type=grpo", "learning_rate=1e-4"]
    one = reference(tmp_path / "one", *extra)
    many = tmp_path / "many"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    run([*torchrun, *train_args(many, *extra)])
    assert_same_run(one, many)


def test_two_machines_over_loopback_equal_one(tmp_path):
    """Two "machines" (torchrun --nnodes 2, one process each) meeting at 127.0.0.1, with a periodic
    eval whose 3 tasks split unevenly over the ranks, and the sampler correction on (here its
    noise stayed at 2e-7: see the module docstring)."""
    extra = ["eval_every=2", "eval_tasks=3", "loss.sampler_is_mode=truncate"]  # the correction on, as by default
    one = reference(tmp_path / "one", *extra)
    many = tmp_path / "many"
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node), "--nproc_per_node", "1",
             "--master_addr", "127.0.0.1", "--master_port", port, *train_args(many, *extra)],
            cwd=ROOT, env=env_vars(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for node in (0, 1)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-4000:]
    assert_same_run(one, many)
    ea = [m["eval/reward"] for m in metrics(one) if "eval/reward" in m]
    eb = [m["eval/reward"] for m in metrics(many) if "eval/reward" in m]
    assert len(eb) == 2 and eb == pytest.approx(ea)  # before training and at step 2


class FaultyCalculator(CalculatorEnv):
    """The calculator, except that on rank 1 the second step's rollout never finishes: the process
    exits (``AGENTRL_TEST_FAULT=exit``) or blocks forever (``stall``)."""

    resets = 0

    async def reset(self, task=None, seed=None):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():  # training's rollouts, not the checks before the model loads
            FaultyCalculator.resets += 1
        if os.environ.get("RANK") == "1" and FaultyCalculator.resets > 4:  # rank 1 has 4 episodes per step
            if os.environ["AGENTRL_TEST_FAULT"] == "exit":
                os._exit(17)
            time.sleep(3600)
        return await super().reset(task, seed)


@pytest.mark.parametrize("fault", ["exit", "stall"])
def test_dead_or_stalled_rank_fails_with_clear_error(tmp_path, fault):
    """Processes started by hand (no torchrun agent to kill the survivor): rank 0 must itself fail
    with the error that names the cause, within the collective timeout, not hang."""
    # also bounds the rendezvous: two ranks loading side by side on a busy 2-core machine can start
    # more than 10 s apart (seen: "1/2 clients joined" after 11 s), so leave room for that
    timeout = 40
    code, err, other = launch_with_fault(tmp_path, fault, timeout)
    # step 1 completed on both ranks before rank 1 failed in step 2
    assert [m["step"] for m in metrics(tmp_path)] == [1]
    assert code == 1, err[-3000:]
    assert "a collective with the other ranks failed" in err and f"distributed_timeout_s={timeout}s" in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    if fault == "exit":
        assert other == 17


def launch_with_fault(out: Path, fault: str, timeout: int, *extra: str) -> tuple[int, str, int | None]:
    """Two ranks of ``agentrl train`` on FaultyCalculator started by hand (no torchrun agent to stop
    the survivor), rank 1 given ``fault``. Returns rank 0's exit code and stderr, and rank 1's exit
    code (None when it was still running 30 s after rank 0 ended and had to be killed)."""
    spec = f"env={Path(__file__).resolve()}:FaultyCalculator"
    args = [sys.executable, *train_args(out, spec, f"distributed_timeout_s={timeout}", *extra)]
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "AGENTRL_TEST_FAULT": fault}
    procs = [
        subprocess.Popen(args, cwd=ROOT, env=env_vars(**common, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in (0, 1)
    ]
    try:
        start = time.monotonic()
        _, err = procs[0].communicate(timeout=240)
        print(f"[{fault}] rank 0 exited {procs[0].returncode} after {time.monotonic() - start:.1f}s: {err.strip().splitlines()[-1] if err.strip() else ''}")
        try:
            other: int | None = procs[1].wait(timeout=30)
        except subprocess.TimeoutExpired:
            other = None
        return procs[0].returncode, err, other
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_resume_one_process_checkpoint_with_two_processes(tmp_path):
    """The batch, the data order and the optimizer state are global: a checkpoint written by one
    process continues under two as the one-process run continued."""
    one = reference(tmp_path / "one", "save_every=1")
    many = tmp_path / "many"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    done = run([*torchrun, *train_args(many, f"resume={one / 'checkpoints' / 'step-000001'}")])
    assert "written by 1 process(es), continuing with 2" in done.stdout
    a, b = final_weights(one), final_weights(many)
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"max |param difference| after resuming at world size 2: {worst:.3g}")
    assert worst <= TOL, worst
    assert [m["step"] for m in metrics(many)] == [2]
    assert metrics(many)[0]["reward/mean"] == metrics(one)[1]["reward/mean"]
