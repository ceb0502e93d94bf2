"""Checkpoints and run folders: no code runs on load, a reused output_dir cannot lose or mix runs,
resume does not log steps twice (issue 17, items 2, 3 and 9)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, get_scheduler

from agentrl.compute.optim.offload import OffloadedAdamW
from agentrl.train.checkpoint import (
    CheckpointError,
    checkpoint_dir,
    latest_checkpoint,
    load_checkpoint,
    open_run,
    prune_checkpoints,
    run_id_of,
    save_checkpoint,
)


def tiny_model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1, head_dim=32)
    return LlamaForCausalLM(cfg)


def trained(seed: int = 0, offload: bool = False):
    model = tiny_model(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = OffloadedAdamW(params, lr=1e-3) if offload else torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99))
    sched = get_scheduler("cosine", opt, num_warmup_steps=1, num_training_steps=10)
    loss = model(torch.tensor([[1, 2, 3, 4]]), labels=torch.tensor([[1, 2, 3, 4]])).loss
    loss.backward()
    opt.step()
    sched.step()
    return model, opt, sched


def save(run_dir: Path, step: int, seed: int = 0, **extra) -> Path:
    model, opt, sched = trained(seed)
    state = {"step": step, "data_pos": 2 * step, "epoch": 0, "order": [3, 1, 2, 0], "history": [{"step": step, "reward/mean": 0.5}], **extra}
    return save_checkpoint(checkpoint_dir(run_dir, step), model, None, opt, sched, state)


@pytest.mark.parametrize("offload", [False, True], ids=["adamw", "offloaded"])
def test_checkpoint_round_trip_loads_with_weights_only(tmp_path, offload):
    model, opt, sched = trained(0, offload)
    state = {"step": 3, "data_pos": 6, "epoch": 1, "order": [2, 0, 1], "history": [{"step": 3, "reward/mean": 0.25}], "policy_kind": "full"}
    path = save_checkpoint(checkpoint_dir(tmp_path, 3), model, None, opt, sched, state)
    torch.load(path / "trainer_state.pt", weights_only=True)  # plain data and tensors only

    fresh = tiny_model(1)
    params = [p for p in fresh.parameters() if p.requires_grad]
    opt2 = OffloadedAdamW(params, lr=1e-3) if offload else torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99))
    sched2 = get_scheduler("cosine", opt2, num_warmup_steps=1, num_training_steps=10)
    loaded = load_checkpoint(path, fresh, opt2, sched2)
    assert loaded["step"] == 3 and loaded["order"] == [2, 0, 1] and loaded["history"] == state["history"]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    assert sched2.state_dict()["last_epoch"] == sched.state_dict()["last_epoch"]
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


class Payload:
    """Pickles to a call that writes a marker file when unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def test_a_crafted_checkpoint_cannot_run_code(tmp_path):
    path = save(tmp_path / "run", 2)
    marker = tmp_path / "marker"
    blob = torch.load(path / "trainer_state.pt", weights_only=True)
    blob["state"]["evil"] = Payload(marker)
    torch.save(blob, path / "trainer_state.pt")
    model, opt, sched = trained(1)
    with pytest.raises(CheckpointError, match="not loaded .unpickling it could run code"):
        load_checkpoint(path, model, opt, sched)
    assert not marker.exists()

    with open(path / "trainer_state.pt", "wb") as f:  # a bare pickle, not even a torch file
        pickle.dump(Payload(marker), f)
    with pytest.raises(CheckpointError):
        load_checkpoint(path, model, opt, sched)
    assert not marker.exists()


# -- run folders -----------------------------------------------------------------------------


def test_a_folder_holding_another_run_is_refused_without_resume(tmp_path):
    run = tmp_path / "run"
    open_run(run, None)
    (run / "config.json").write_text("{}")
    open_run(run, None)  # a run that failed before logging anything leaves the folder reusable
    save(run, 8)
    (run / "metrics.jsonl").write_text('{"step": 8}\n')
    with pytest.raises(CheckpointError, match="already holds a run.*resume=latest"):
        open_run(run, None)
    with pytest.raises(CheckpointError, match="is a file"):
        open_run(run / "metrics.jsonl", None)


def test_pruning_keeps_this_runs_newest_checkpoints_and_never_another_runs(tmp_path):
    run = tmp_path / "run"
    mine = open_run(run, None)
    foreign = save(run, 8)  # written as another run's checkpoint (then the folder changes hands)
    meta = json.loads((foreign / "trainer_state.json").read_text())
    (foreign / "trainer_state.json").write_text(json.dumps({**meta, "run_id": "another-run"}))
    assert run_id_of(run) == mine
    for step in (1, 2, 10):
        save(run, step)
        prune_checkpoints(run, keep=2)
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    # by step number, not by name; step-000008 belongs to another run and is neither kept nor pruned by this one
    assert names == ["step-000002", "step-000008", "step-000010"]
    save(run, 100)
    prune_checkpoints(run, keep=1)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000008", "step-000100"]
    assert latest_checkpoint(run).name == "step-000100"


def test_resume_latest_never_loads_another_runs_checkpoint(tmp_path):
    run = tmp_path / "run"
    open_run(run, None)
    save(run, 4)
    other = tmp_path / "other"
    open_run(other, None)
    stray = save(other, 8)
    stray.rename(run / "checkpoints" / "step-000008")  # another run's newer checkpoint lands here
    assert latest_checkpoint(run).name == "step-000004"
    open_run(run, "latest")
    assert latest_checkpoint(run).name == "step-000004"


def test_resume_into_another_runs_folder_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    open_run(a, None)
    ckpt = save(a, 2)
    open_run(b, None)
    save(b, 2)
    (b / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(CheckpointError, match="holds another run"):
        open_run(b, str(ckpt))
    fresh = tmp_path / "c"
    assert open_run(fresh, str(ckpt)) == run_id_of(a)  # a new folder may continue it


def test_resume_cuts_the_logs_back_to_the_resumed_step(tmp_path):
    run = tmp_path / "run"
    open_run(run, None)
    save(run, 2)
    save(run, 4)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": s / 10}) + "\n" for s in range(7)) + '{"step": 7, "rew')
    (run / "samples.jsonl").write_text("".join(json.dumps({"step": s, "messages": []}) + "\n" for s in (1, 1, 2, 3, 4, 5, 6)))
    open_run(run, "latest")
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3, 4]
    assert [json.loads(x)["step"] for x in (run / "samples.jsonl").read_text().splitlines()] == [1, 1, 2, 3, 4]


def test_resume_from_an_earlier_checkpoint_sets_later_ones_aside(tmp_path):
    run = tmp_path / "run"
    open_run(run, None)
    two = save(run, 2)
    save(run, 4)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3, 4)))
    open_run(run, str(two))
    assert latest_checkpoint(run) == two
    assert (run / "checkpoints" / "step-000004.superseded-1" / "trainer_state.json").is_file()
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]


# -- through the trainer -----------------------------------------------------------------------

SMALL = ["prompts_per_step=2", "num_generations=2", "micro_batch_size=4", "rollout.max_tokens_per_turn=16",
         "rollout.max_completion_tokens=64", "log_every=1", "save_every=1"]


def train_config(out: Path, *extra: str):
    from agentrl.core.overrides import build, parse_overrides
    from agentrl.train.config import TrainConfig

    return build(TrainConfig, parse_overrides([*SMALL, f"output_dir={out}", *extra]))


def test_trainer_resume_logs_each_step_once_and_refuses_a_reused_folder(tmp_path):
    from agentrl.train.trainer import Trainer

    Trainer(train_config(tmp_path, "max_steps=2")).train()
    steps = lambda name: [json.loads(x)["step"] for x in (tmp_path / name).read_text().splitlines()]  # noqa: E731
    assert steps("metrics.jsonl") == [1, 2]
    with pytest.raises(CheckpointError, match="already holds a run"):
        Trainer(train_config(tmp_path, "max_steps=1"))  # refused before a model loads; the old run stays whole
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000001", "step-000002"]

    (tmp_path / "checkpoints" / "step-000002").rename(tmp_path / "keep-2")  # as if killed before saving step 2
    resumed = Trainer(train_config(tmp_path, "max_steps=2", "resume=latest"))
    assert resumed.step == 1
    resumed.train()
    assert steps("metrics.jsonl") == [1, 2]  # step 2 logged once, not twice
    assert sorted(set(steps("samples.jsonl"))) == [1, 2] and steps("samples.jsonl") == sorted(steps("samples.jsonl"))


# -- state added after issue 17: the curriculum, FSDP2 -----------------------------------------


def test_a_crafted_curriculum_state_cannot_run_code_on_resume(tmp_path):
    """``TrainState.curriculum`` travels in the same trainer-state file, read through ``resume_run``
    (the path FSDP2 checkpoints take too, through ``sharded.checkpoint_views``)."""
    from agentrl.train.state import TrainState, resume_run

    run = tmp_path / "run"
    open_run(run, None)
    marker = tmp_path / "marker"
    save(run, 2, curriculum={"pos": {"1": 0}, "rng": Payload(marker)})
    model, opt, sched = trained(1)
    with pytest.raises(CheckpointError, match="unpickling it could run code"):
        resume_run("latest", run, TrainState.start(4, 0), model, opt, sched)
    assert not marker.exists()


def test_a_real_curriculum_state_survives_the_safe_loader(tmp_path):
    """The curriculum's own state is plain data that ``weights_only`` accepts, and draws the same tasks after."""
    from agentrl.train.config import CurriculumConfig
    from agentrl.train.curriculum import Curriculum
    from agentrl.train.state import TrainState, resume_run

    data = [{"difficulty": 1 + i % 3, "i": i} for i in range(30)]
    cur = Curriculum(data, CurriculumConfig(key="difficulty"), seed=5)
    cur.next_tasks(7)
    run = tmp_path / "run"
    open_run(run, None)
    save(run, 2, curriculum=cur.state_dict())
    expected = [t["i"] for t in cur.next_tasks(20)]
    state = TrainState.start(4, 0)
    model, opt, sched = trained(1)
    resume_run("latest", run, state, model, opt, sched)
    again = Curriculum(data, CurriculumConfig(key="difficulty"), seed=5)
    again.load_state_dict(state.curriculum)
    assert [t["i"] for t in again.next_tasks(20)] == expected


def test_nothing_in_the_package_unpickles_without_weights_only():
    """Every ``torch.load`` passes ``weights_only=True`` and nothing calls pickle's loaders: a new
    checkpoint path (FSDP2's, a future one) cannot reopen issue 17's item 2 unnoticed."""
    import ast

    root = Path(__file__).resolve().parents[1]
    bad: list[str] = []
    for folder in ("agentrl", "environments", "tools"):
        for file in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(file.read_text(), str(file))):
                if not isinstance(node, ast.Call):
                    continue
                name = ast.unparse(node.func)
                where = f"{file.relative_to(root)}:{node.lineno} {name}"
                if name.endswith(("pickle.load", "pickle.loads", "Unpickler", "marshal.loads", "dill.load", "dill.loads")):
                    bad.append(where)
                if name == "torch.load" or name.endswith(".torch.load"):
                    flag = next((k.value for k in node.keywords if k.arg == "weights_only"), None)
                    if not (isinstance(flag, ast.Constant) and flag.value is True):
                        bad.append(where + " without weights_only=True")
    assert not bad, bad


CURRICULUM = ("dynamic_sampling.enabled=true", "dynamic_sampling.max_rounds=1", "curriculum.key=difficulty",
              "env_args.difficulty=[1,2,3]", "sampling.temperature=1.0")  # fmt: skip


def test_resume_restores_the_curriculum_from_the_checkpoint(tmp_path):
    """Through the trainer: a resumed run's curriculum continues from the checkpoint's state, not afresh."""
    from agentrl.train.trainer import Trainer

    Trainer(train_config(tmp_path, "max_steps=1", *CURRICULUM)).train()
    saved = json.loads((tmp_path / "checkpoints" / "step-000001" / "trainer_state.json").read_text())["curriculum"]
    resumed = Trainer(train_config(tmp_path, "max_steps=2", "resume=latest", *CURRICULUM))
    assert resumed.step == 1 and resumed.draw.curriculum is not None
    assert resumed.draw.curriculum.state_dict() == saved
    assert sum(saved["pos"].values()) > 0, "the first step drew tasks, so a fresh curriculum would differ"


@pytest.mark.slow
def test_resume_with_dynamic_sampling_and_curriculum_continues_the_same_run(tmp_path):
    """2 steps straight, and 1 step then ``resume=latest`` to 2, draw the same tasks and log step 2
    once, with the same numbers (about a minute on 2 CPU cores)."""
    from agentrl.train.trainer import Trainer

    straight, split = tmp_path / "straight", tmp_path / "split"
    Trainer(train_config(straight, "max_steps=2", *CURRICULUM)).train()
    Trainer(train_config(split, "max_steps=1", *CURRICULUM)).train()
    Trainer(train_config(split, "max_steps=2", "resume=latest", *CURRICULUM)).train()

    def logged(run: Path) -> list[dict]:
        return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]

    assert [m["step"] for m in logged(split)] == [1, 2]
    a, b = logged(straight)[1], logged(split)[1]
    for key in ("sampling/groups_drawn", "sampling/groups_kept", "reward/mean", "curriculum/difficulty=2/weight"):
        assert a[key] == b[key], key
    state = lambda run: json.loads((run / "checkpoints" / "step-000002" / "trainer_state.json").read_text())["curriculum"]  # noqa: E731
    assert state(straight)["pos"] == state(split)["pos"] and state(straight)["orders"] == state(split)["orders"]
