"""Dynamic sampling and the difficulty curriculum: each mechanism on its own, then both in a real run."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from agentrl.core.overrides import build, parse_overrides
from agentrl.core.strict import ConfigError
from agentrl.core.trajectory import Trajectory, TrajectoryGroup
from agentrl.env.registry import register
from agentrl.environments.calculator import CalculatorEnv
from agentrl.train.config import CurriculumConfig, DynamicSamplingConfig, TrainConfig, skipped_bundled_defaults
from agentrl.train.curriculum import Curriculum
from agentrl.train.draw import GroupDraw, train_seed
from agentrl.train.selection import GroupSelector, informative
from agentrl.train.state import TrainState
from agentrl.train.trainer import Trainer


def group(rewards: list[float], difficulty: int = 1, errors: int = 0) -> TrajectoryGroup:
    trajs = [Trajectory(task={}, seed=0, reward=r) for r in rewards]
    trajs += [Trajectory(task={}, seed=0, reward=0.0, error="boom") for _ in range(errors)]
    return TrajectoryGroup(task={"difficulty": difficulty}, seed=0, trajectories=trajs)


def test_informative_needs_varied_rewards_of_finished_episodes():
    assert informative(group([0, 1, 0, 0]))
    assert not informative(group([1, 1, 1, 1]))
    assert not informative(group([0, 0, 0, 0]))
    assert not informative(group([1], errors=3)), "one finished episode has no spread"
    assert not informative(group([0.5, 0.6]), min_std=0.1)


def test_selector_keeps_varied_groups_refills_and_stops_at_its_bound():
    settings = DynamicSamplingConfig(enabled=True, max_rounds=2, max_draw_factor=4)
    sel = GroupSelector(target=4, settings=settings)
    sel.add([group([0, 1]), group([0, 0]), group([1, 1]), group([0, 0])])
    assert len(sel.kept) == 1 and sel.dropped == 3
    # keep rate 1/4 so far: 3 missing groups need 12 tasks, within the cap of 4 per missing group
    assert sel.next_draw() == 12
    sel.add([group([1, 0])] * 5 + [group([0, 0])] * 7)
    assert len(sel.kept) == 4 and sel.surplus == 2 and sel.next_draw() == 0
    m = sel.metrics()
    assert m == {"sampling/groups_drawn": 16.0, "sampling/groups_kept": 4.0, "sampling/groups_dropped": 10.0, "sampling/groups_surplus": 2.0, "sampling/rounds": 2.0}

    stuck = GroupSelector(target=2, settings=settings)
    for _ in range(5):
        if stuck.rounds and not stuck.next_draw():
            break
        stuck.add([group([0, 0]), group([0, 0])])
    assert stuck.rounds == 3, "one first round plus max_rounds refills"
    assert stuck.next_draw() == 0
    assert len(stuck.selected()) == 2, "nothing varied: the step still trains on the first groups drawn"


class ScriptedRollout:
    """A rollout whose groups vary exactly for tasks with an even ``i``; records every call."""

    def __init__(self):
        self.calls: list[tuple[list[int], int]] = []

    def __call__(self, tasks, seed):
        self.calls.append(([t["i"] for t in tasks], seed))
        groups = [TrajectoryGroup(task=t, seed=seed, trajectories=[Trajectory(task=t, seed=seed, reward=r) for r in ([0, 1] if t["i"] % 2 == 0 else [1, 1])]) for t in tasks]
        return groups, 0.5


def test_group_draw_refills_with_the_round_seed_and_reports_what_it_kept():
    """GroupDraw, the trainer's only source of groups: the run's task order, the batch's seed,
    dynamic sampling's refill rounds (seed + 100_003 x round), the selection's metrics."""
    data = [{"i": i} for i in range(40)]
    base = ["prompts_per_step=2", "steps_per_generation=2", "seed=5"]
    plain_rollout, ds_rollout = ScriptedRollout(), ScriptedRollout()
    plain_state, ds_state = TrainState.start(len(data), 5), TrainState.start(len(data), 5)
    plain = GroupDraw(build(TrainConfig, parse_overrides(base)), data, plain_state, plain_rollout)
    ds = GroupDraw(build(TrainConfig, parse_overrides([*base, "dynamic_sampling.enabled=true", "dynamic_sampling.max_rounds=3"])), data, ds_state, ds_rollout)
    order = [data[i]["i"] for i in plain_state.order]

    step = plain.next()
    assert step.train is step.drawn and len(step.train) == 4 and step.metrics == {} and step.seconds == 0.5
    assert plain_rollout.calls == [(order[:4], train_seed(5, 0))]

    step = ds.next()
    first = ds_rollout.calls[0]
    assert first == (order[:4], train_seed(5, 0))
    assert all(s == train_seed(5, 0) + 100_003 * r for r, (_, s) in enumerate(ds_rollout.calls))
    assert [t for tasks, _ in ds_rollout.calls for t in tasks] == order[: sum(len(t) for t, _ in ds_rollout.calls)]
    assert all(g.task["i"] % 2 == 0 for g in step.train) and len(step.drawn) > len(step.train)
    assert step.metrics["sampling/rounds"] == len(ds_rollout.calls) and step.seconds == 0.5 * len(ds_rollout.calls)
    assert step.metrics["sampling/groups_drawn"] == len(step.drawn)


def test_curriculum_draws_more_from_informative_buckets_and_keeps_a_floor():
    data = [{"difficulty": d, "i": i} for i in range(300) for d in (1, 2, 3)]
    cur = Curriculum(data, CurriculumConfig(key="difficulty", floor=0.1, smoothing=0.5), seed=0)
    first = Counter(t["difficulty"] for t in cur.next_tasks(600))
    assert all(150 < first[d] < 250 for d in (1, 2, 3)), first  # unseen buckets: equal weight
    # level 1 always solved, level 3 never: only level 2 varies
    cur.update([group([1, 1], 1), group([0, 1], 2), group([0, 0], 3)] * 4, informative)
    w = cur.weights()
    assert w["2"] > 0.8 and w["1"] == pytest.approx(w["3"]) and w["1"] > 0
    drawn = Counter(t["difficulty"] for t in cur.next_tasks(1000))
    assert drawn[2] > 750 and drawn[1] > 30 and drawn[3] > 30, drawn
    assert set(cur.metrics()) == {f"curriculum/difficulty={d}/{k}" for d in (1, 2, 3) for k in ("weight", "informative_rate")}


def test_curriculum_walks_each_bucket_without_repeats_and_resumes_exactly():
    data = [{"difficulty": 1 + i % 2, "i": i} for i in range(20)]
    cur = Curriculum(data, CurriculumConfig(key="difficulty"), seed=3)
    first = [t["i"] for t in cur.next_tasks(10)]
    saved = json.loads(json.dumps(cur.state_dict()))  # it travels in trainer_state.json
    rest = [t["i"] for t in cur.next_tasks(25)]
    again = Curriculum(data, CurriculumConfig(key="difficulty"), seed=3)
    again.load_state_dict(saved)
    assert [t["i"] for t in again.next_tasks(25)] == rest
    by_bucket: dict[int, list[int]] = {1: [], 2: []}
    for i in first + rest:
        by_bucket[1 + i % 2].append(i)
    for seq in by_bucket.values():  # a bucket repeats a task only after it has served all of its tasks
        assert len(set(seq[:10])) == min(10, len(seq))


def test_background_rollouts_refuse_dynamic_sampling():
    with pytest.raises(ConfigError, match="max_staleness > 0 draws its tasks in the background"):
        build(TrainConfig, parse_overrides(["max_staleness=1", "loss.sampler_is_mode=truncate", "dynamic_sampling.enabled=true"]))
    build(TrainConfig, parse_overrides(["max_staleness=1", "loss.sampler_is_mode=truncate", "curriculum.key=difficulty"]))  # combines


def test_a_curriculum_drawn_ahead_gives_the_trainer_the_same_tasks_whenever_groups_come_back():
    """The background thread draws batch T before the batches in front of it are back; the
    trainer draws T later, knowing more. Both fold in only the groups of batches before T - lag,
    so they draw the same tasks, and those groups do steer the draw."""
    from agentrl.train.draw import AheadTasks

    data = [{"difficulty": d, "i": i} for i in range(200) for d in (1, 2, 3)]
    settings = CurriculumConfig(key="difficulty", floor=0.05, smoothing=0.5)
    trainer = AheadTasks(TrainState(seed=0, order=[]), data, Curriculum(data, settings, seed=0), lag=2, min_std=0.0)
    batch = [trainer.next_tasks(0, 8)]  # the trainer's first draw; the background clones it after
    ahead = trainer.clone()
    ahead_draws = {}

    def back(t: int) -> list[TrajectoryGroup]:  # only level 2 varies
        return [group([0, 1] if task["difficulty"] == 2 else [1, 1], task["difficulty"]) for task in batch[t]]

    for t in range(12):
        # the background is two batches ahead: it draws t + 1 and t + 2 while only batches < t are back
        for target in (t + 1, t + 2):
            if target not in ahead_draws:
                ahead_draws[target] = [x["i"] * 10 + x["difficulty"] for x in ahead.next_tasks(target, 8)]
        if t > 0:
            batch.append(trainer.next_tasks(t, 8))
            assert [x["i"] * 10 + x["difficulty"] for x in batch[t]] == ahead_draws[t], f"batch {t} differs"
        groups = back(t)
        ahead.observe(t, groups)
        trainer.observe(t, groups)
    late = Counter(x["difficulty"] for b in batch[6:] for x in b)
    assert late[2] > late[1] + late[3], late  # the informative level is drawn most once its groups count
    saved = json.loads(json.dumps(trainer.state.curriculum))  # travels in trainer_state.json, pending batches too
    assert [t for t, _ in saved["pending"]] == [9, 10, 11]  # the last draw (11) folded in batches < 9
    resumed = AheadTasks(TrainState(seed=0, order=[], curriculum=saved), data, Curriculum(data, settings, seed=0), lag=2, min_std=0.0)
    resumed.curriculum.load_state_dict(saved)
    assert resumed.next_tasks(13, 8) == trainer.next_tasks(13, 8)


def test_curriculum_key_must_be_a_task_field():
    with pytest.raises(ConfigError, match="curriculum.key: the tasks have no field 'level'"):
        Curriculum([{"difficulty": 1}], CurriculumConfig(key="level"), seed=0)


class TunedCalculator(CalculatorEnv):
    train_defaults = {"advantage": "turn", "learning_rate": 3e-5, "dynamic_sampling": {"enabled": True, "max_rounds": 5}}


def test_environment_train_defaults_apply_where_the_user_sets_nothing():
    register("tuned-calculator-test", TunedCalculator, overwrite=True)
    cfg = build(TrainConfig, parse_overrides(["env=tuned-calculator-test", "dynamic_sampling.max_rounds=1", "learning_rate=1e-4"]))
    assert cfg.advantage == "turn" and cfg.dynamic_sampling.enabled and cfg.dynamic_sampling.max_rounds == 1 and cfg.learning_rate == 1e-4
    calc = build(TrainConfig, parse_overrides([]))  # the default environment is the calculator, tuned for 90 steps
    assert (calc.advantage, calc.max_steps, calc.learning_rate) == ("turn", 90, 5e-4)
    assert (calc.guidance.enabled, calc.guidance.keep, calc.guidance.weight) == (True, "above_mean", 4.0)
    assert calc.env_args == {"train_difficulty": [1, 2, 3]}
    mine = build(TrainConfig, parse_overrides(["env_args.seed=3", "guidance.weight=2"]))
    assert mine.env_args == {"seed": 3, "train_difficulty": [1, 2, 3]} and mine.guidance.weight == 2 and mine.guidance.enabled, "nested defaults merge key by key"
    assert build(TrainConfig, parse_overrides(["env_args.train_difficulty=[1,2]"])).env_args == {"train_difficulty": [1, 2]}
    assert build(TrainConfig, parse_overrides(["advantage=episode"])).advantage == "episode"
    pretrained = build(TrainConfig, parse_overrides(["model=some/pretrained-model"]))
    assert (pretrained.learning_rate, pretrained.max_steps) == (1e-4, 60), "the bundled model's learning rate and steps are not a pretrained model's"
    assert (pretrained.advantage, pretrained.guidance.enabled, pretrained.env_args) == ("turn", True, {"train_difficulty": [1, 2, 3]})
    assert skipped_bundled_defaults(pretrained) == {"max_steps": 90, "learning_rate": 5e-4}
    assert skipped_bundled_defaults(build(TrainConfig, parse_overrides(["model=x", "learning_rate=3e-5"]))) == {"max_steps": 90}
    assert skipped_bundled_defaults(calc) == {}
    other = build(TrainConfig, parse_overrides(["env=search"]))
    assert (other.advantage, other.max_steps) == ("episode", 60), "an environment without train_defaults gets the global ones"
    math = build(TrainConfig, parse_overrides(["env=math_python", "rollout.max_completion_tokens=256"]))
    assert (math.advantage, math.prompts_per_step, math.rollout.max_tokens_per_turn, math.rollout.max_completion_tokens) == ("turn", 8, 128, 256)
    assert build(TrainConfig, parse_overrides(["env=no-such-env"])).advantage == "episode", "unknown names fail later, in one place"


SMALL = ["prompts_per_step=2", "num_generations=4", "micro_batch_size=4", "rollout.max_tokens_per_turn=32", "rollout.max_completion_tokens=160", "learning_rate=1e-4"]


def test_a_curriculum_with_rollouts_ahead_in_a_real_run(tmp_path):
    """The trainer checks at every step that the background drew its tasks (test above: the
    mechanism); here a real run finishes with the curriculum learning and checkpointed."""
    cfg = build(TrainConfig, parse_overrides([
        *SMALL, "max_steps=4", f"output_dir={tmp_path}", "max_staleness=1", "curriculum.key=difficulty",
        "env_args.difficulty=[1,2,3]", "sampling.temperature=1.0",
    ]))
    trainer = Trainer(cfg)
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    assert all("curriculum/difficulty=3/weight" in m and 0 <= m["async/staleness"] <= 1 for m in lines)
    state = json.loads((tmp_path / "checkpoints" / "step-000004" / "trainer_state.json").read_text())
    assert set(state["curriculum"]["orders"]) == {"1", "2", "3"} and [t for t, _ in state["curriculum"]["pending"]] == [2, 3]
    assert sum(state["curriculum"]["seen"].values()) == 2 * 2  # batches 0 and 1 folded in (lag 1), two groups each


def test_dynamic_sampling_and_curriculum_in_a_real_run(tmp_path):
    cfg = build(TrainConfig, parse_overrides([
        *SMALL, "max_steps=2", f"output_dir={tmp_path}", "dynamic_sampling.enabled=true", "dynamic_sampling.max_rounds=1",
        "curriculum.key=difficulty", "env_args.difficulty=[1,2,3]", "sampling.temperature=1.0",
    ]))
    trainer = Trainer(cfg)
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        drawn, kept, dropped, surplus = (m[f"sampling/groups_{k}"] for k in ("drawn", "kept", "dropped", "surplus"))
        assert drawn == kept + dropped + surplus and kept <= 2 and 1 <= m["sampling/rounds"] <= 2
        # rollout metrics cover every drawn group; demonstrated episodes (the default guidance) are counted apart
        assert m["rollout/episodes"] + m.get("rollout/guided", 0) == 4 * drawn, "rollout metrics cover every drawn group"
        if kept:  # the batch trains on varied groups only; the logged reward is every drawn episode's
            assert 0 < m["reward/kept_mean"] < 1
        assert "curriculum/difficulty=3/weight" in m
    state = json.loads((tmp_path / "checkpoints" / "step-000002" / "trainer_state.json").read_text())
    assert set(state["curriculum"]["orders"]) == {"1", "2", "3"}


def test_a_pretrained_model_is_told_which_bundled_defaults_it_does_not_get(tmp_path, capsys):
    """Never silent: the run names the skipped keys and the values it uses instead, before any model loads."""
    with pytest.raises(Exception):  # the folder does not exist: the message must come before that failure
        Trainer(env="calculator", model=str(tmp_path / "no-such-model"), output_dir=str(tmp_path / "run"))
    out = capsys.readouterr().out
    assert "env=calculator: not applying its defaults tuned on the bundled model (max_steps=90, learning_rate=0.0005)" in out
    assert "this run uses max_steps=60, learning_rate=0.0001" in out
