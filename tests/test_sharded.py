"""FSDP2 sharded training on CPU with gloo (``distributed.strategy=fsdp``): two processes holding half
of the weights, gradients and AdamW state each take the steps one unsharded process takes, and
their checkpoints are ordinary model folders that resume sharded or unsharded.

The launches are real ``torchrun`` runs of ``python -m agentrl train`` on the bundled model (tied
embeddings, so the tied head is sharded with the embedding); the reference is the one-process run
of the same configuration through the Python API (helpers from test_distributed.py).
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from test_distributed import (
    TOL,
    assert_same_run,
    final_weights,
    free_port,
    launch_with_fault,
    metrics,
    reference,
    run,
    train_args,
)

from agentrl.core.overrides import build, parse_overrides
from agentrl.core.strict import ConfigError
from agentrl.train.config import TrainConfig

# 3 tasks x 3 episodes x 2 optimizer steps per generation batch: 9 rows per step, 5 and 4 per
# rank, micro-batches of 2: one rank runs 3 forwards, the other 2 real ones plus a zero-weighted
# one (every FSDP forward is collective), in the old-logprob pass and in the training passes
UNEVEN = ["distributed.strategy=fsdp", "prompts_per_step=3", "num_generations=3", "steps_per_generation=2", "micro_batch_size=2", "save_every=1"]
# a resume at step 1 must not fall inside a generation batch: one optimizer step per batch (9 rows,
# 5 and 4 per rank: the zero-weighted forward in the training pass)
PER_STEP = [*UNEVEN[:3], "steps_per_generation=1", *UNEVEN[4:]]


def torchrun(out, *extra: str) -> None:
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    return run([*launch, *train_args(out, *extra)])


def worst(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_fsdp_two_processes_equal_one_and_checkpoints_are_plain_folders(tmp_path):
    one = reference(tmp_path / "one", *UNEVEN)  # one process: "nothing to shard", the unsharded path
    many = tmp_path / "many"
    torchrun(many, *UNEVEN)
    assert_same_run(one, many)
    for step in (1, 2):  # both checkpoints, each written by rank 0 from the gathered weights
        ckpt = many / "checkpoints" / f"step-{step:06d}"
        assert sorted(p.name for p in ckpt.glob("*.safetensors")) == ["model.safetensors"]
        assert json.loads((ckpt / "trainer_state.json").read_text())["world_size"] == 2
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(many / "checkpoints" / "step-000002")  # a normal model folder
    assert not any(hasattr(p, "full_tensor") for p in model.parameters())

    # the sharded checkpoint of step 1 continues unsharded (optimizer state keyed by name) as the one-process run did
    one, many, again = tmp_path / "one-b", tmp_path / "many-b", tmp_path / "again"
    reference(one, *PER_STEP)
    torchrun(many, *PER_STEP, "max_steps=1")
    reference(again, *PER_STEP, f"resume={many / 'checkpoints' / 'step-000001'}")
    diff = worst(final_weights(one), final_weights(again))
    print(f"sharded checkpoint resumed by one process: max |param difference| {diff:.3g}")
    assert diff <= TOL
    assert [m["step"] for m in metrics(again)] == [2]


@pytest.mark.parametrize("source", ["one", "many"])
def test_fsdp_resumes_sharded_and_unsharded_checkpoints(tmp_path, source):
    """Step 1's checkpoint, written by one process (optimizer state keyed by index) or by two sharded
    processes (keyed by name), resumed by two sharded processes, ends step 2 as one process did."""
    one = reference(tmp_path / "one", *PER_STEP)
    ckpt = one / "checkpoints" / "step-000001"
    if source == "many":
        torchrun(tmp_path / "many", *PER_STEP, "max_steps=1")
        ckpt = tmp_path / "many" / "checkpoints" / "step-000001"
    resumed = tmp_path / "resumed"
    torchrun(resumed, *PER_STEP, f"resume={ckpt}")
    diff = worst(final_weights(one), final_weights(resumed))
    print(f"resumed {source}'s checkpoint under fsdp: max |param difference| {diff:.3g}")
    assert diff <= TOL
    assert metrics(resumed)[0]["reward/mean"] == metrics(one)[1]["reward/mean"]


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        (["peft.r=8"], "LoRA"),
        (["loss.beta=0.04"], "reference model"),
        (["optimizer_offload=true"], "optimizer_offload"),
        (["generator=vllm"], "generator.backend=transformers"),
    ],
)
def test_fsdp_refuses_what_it_does_not_shard(keys, words):
    with pytest.raises(ConfigError) as err:
        build(TrainConfig, parse_overrides(["distributed.strategy=fsdp", *keys]))
    assert "distributed.strategy=fsdp" in str(err.value) and words in str(err.value)


@pytest.mark.parametrize("shape", ["tiny", "tiny-tied"])
def test_fsdp_7b_benchmark_logic_on_cpu(tmp_path, shape):
    """benchmarks/fsdp_7b.py with a tiny shape (untied head like Qwen2.5-7B, tied like 0.5B): two
    sharded gloo processes take the steps one unsharded process takes (same per-tensor-seeded
    weights, same losses), and gather the copy."""
    bench = ["benchmarks/fsdp_7b.py", "--shape", shape, "--cpu", "--tokens", "64", "--prompt", "16", "--steps", "3"]
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    sharded = run([*launch, *bench, "--json", str(tmp_path / "sharded.json")])
    run([sys.executable, *bench, "--single", "--json", str(tmp_path / "single.json")])
    a, b = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("sharded", "single"))
    assert a["outcome"] == b["outcome"] == "ok" and a["world"] == 2 and b["world"] == 1
    print(f"losses sharded {a['losses']} single {b['losses']}")
    assert a["losses"] == pytest.approx(b["losses"], abs=1e-6) and len(set(a["losses"])) == 3  # the weights moved
    assert a["gather_s"] > 0 and "bf16 generation copy" in sharded.stdout


NO_PYDANTIC = """
import runpy, sys
class Hide:  # the lent GPU machine has no pydantic: make importing it fail here too
    def find_spec(self, name, path=None, target=None):
        if name == "pydantic" or name.startswith("pydantic."):
            raise ImportError("pydantic hidden for this test")
sys.meta_path.insert(0, Hide())
sys.argv = ["benchmarks/fsdp_7b.py", *sys.argv[1:]]
runpy.run_path("benchmarks/fsdp_7b.py", run_name="__main__")
assert "pydantic" not in sys.modules
"""


def test_fsdp_7b_benchmark_runs_without_pydantic():
    done = run([sys.executable, "-c", NO_PYDANTIC, "--shape", "tiny", "--cpu", "--single", "--tokens", "32", "--prompt", "8", "--steps", "2"])
    assert '"outcome": "ok"' in done.stdout


def test_fsdp_dead_rank_fails_with_clear_error(tmp_path):
    """Rank 1 exits during step 2's rollout of a sharded run; rank 0 (started by hand, no torchrun
    agent to stop it) fails with the error that names the cause, not a hang, as under data parallel."""
    code, err, other = launch_with_fault(tmp_path, "exit", 40, "distributed.strategy=fsdp")
    assert [m["step"] for m in metrics(tmp_path)] == [1]
    assert code == 1, err[-3000:]
    assert "a collective with the other ranks failed" in err and "Traceback" not in err, err[-3000:]
    assert other == 17
