"""Generation on its own ranks (``distributed.generator_ranks``) on CPU with gloo: generator ranks
beside trainer ranks in one job take the steps one process takes, bound their staleness, move only
the adapter when training LoRA, and a dead or hung rank of either kind ends the job in one line.

The launches are real ``torchrun`` runs (or processes given the rendezvous variables by hand) of
``python -m agentrl train`` on the bundled model; the reference is the one-process run of the same
configuration through the Python API (helpers from test_distributed.py, same tolerance).
"""

from __future__ import annotations

import sys
from pathlib import Path

from test_distributed import assert_same_run, free_port, metrics, reference, run, samples, train_args


def torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1", "--master_port", str(free_port())]


def versions(run_dir: Path) -> list[tuple[int, int]]:
    """(step, policy_version) of every logged trajectory."""
    return [(rec["step"], rec["policy_version"]) for rec in samples(run_dir)]


def test_one_generator_two_trainers_equal_one_process(tmp_path):
    """1 generator rank + 2 data-parallel trainer ranks at max_staleness=0: the weights, the sampled
    episodes and the metrics of one process with the same global batch."""
    one = reference(tmp_path / "one")
    many = tmp_path / "many"
    run([*torchrun(3), *train_args(many, "distributed.generator_ranks=1")])
    assert_same_run(one, many)
    logged = metrics(many)
    assert [m["async/staleness"] for m in logged] == [0.0, 0.0]
    assert [m["async/policy_version"] for m in logged] == [0.0, 1.0]
    assert versions(many) and all(version == step - 1 for step, version in versions(many))
    assert all(m["sync/weight_tensors"] == 50 for m in logged)  # every tensor of the bundled model (tied head left out)
