"""examples/multinode/node.sh, the per-node launcher the sbatch template runs, as two "nodes" over
loopback: Slurm's variables and a stand-in ``scontrol`` (the real one is not here) give each
node its rank and node 0's address; the two torchrun launches meet and train FSDP2-sharded, and
the result equals one process's."""

from __future__ import annotations

import os
import subprocess
import sys

from test_distributed import ROOT, assert_same_run, env_vars, free_port, reference, train_args

SCRIPT = ROOT / "examples" / "multinode" / "node.sh"


def test_node_script_two_slurm_nodes_over_loopback_equal_one(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"  # `scontrol show hostnames LIST`: node 0 is this host
    scontrol.write_text("#!/bin/sh\nprintf '127.0.0.1\\nlocalhost\\n'\n")
    scontrol.chmod(0o755)
    extra = ["distributed.strategy=fsdp"]
    one = reference(tmp_path / "one", *extra)
    many = tmp_path / "many"
    common = {"SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[01-02]", "MASTER_PORT": str(free_port()), "NPROC_PER_NODE": "1",
              "PYTHON": sys.executable, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    args = train_args(many, *extra)[3:]  # the keys after "-m agentrl train"
    procs = [
        subprocess.Popen([str(SCRIPT), *args], cwd=ROOT, env=env_vars(**common, SLURM_NODEID=str(node)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in (0, 1)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for node, (p, (_, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, err[-4000:]
        assert f"node {node} of 2: 1 process(es), rendezvous at 127.0.0.1:" in err
    assert_same_run(one, many)


def test_node_script_without_an_address_says_so(tmp_path):
    env = {k: v for k, v in env_vars().items() if k not in ("MASTER_ADDR", "SLURM_JOB_NODELIST")}
    done = subprocess.run([str(SCRIPT), "max_steps=1"], cwd=ROOT, env={**env, "NNODES": "2", "NODE_RANK": "1"}, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "set MASTER_ADDR to the address of node 0" in done.stderr
