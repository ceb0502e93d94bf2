"""Coming from TRL: GRPOConfig's names, GRPOTrainer over the rollout engine, TRL's batched reward
functions once per group, and docs/from_trl.md's two scripts (issue 41)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import Dataset

from agentrl.core.errors import ConfigError, UserError
from agentrl.trl import TRL_NAMES, GRPOConfig, GRPOTrainer
from agentrl.trl.config import TRL_DEFAULTS, names_table

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "from_trl"
DOC = ROOT / "docs" / "from_trl.md"


def tasks(n: int = 32) -> Dataset:
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}], "answer": str(i + 1)} for i in range(n)])


def args(tmp_path: Path, **names) -> GRPOConfig:
    base = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4, max_completion_length=24, max_steps=1, report_to="none")
    return GRPOConfig(**{**base, **names})


# -- GRPOConfig -------------------------------------------------------------------------------------


def test_defaults_are_trls():
    import dataclasses

    trl = pytest.importorskip("trl")
    fields = {f.name: f for f in dataclasses.fields(trl.GRPOConfig)}  # the declared defaults (instantiating checks the device)
    for name, value in TRL_DEFAULTS.items():
        f = fields[name]
        theirs = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert theirs == value, name


def test_every_trl_name_the_issue_lists_is_mapped_or_refused_with_its_reason():
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "max_prompt_length", "max_completion_length", "num_train_epochs",
                 "warmup_ratio", "scale_rewards", "beta", "repetition_penalty", "generation_kwargs", "chat_template_kwargs", "log_completions", "push_to_hub"):  # fmt: skip
        assert name in TRL_NAMES and TRL_NAMES[name].note
    with pytest.raises(ConfigError, match="repetition_penalty=1.1 has no agentrl equivalent.*log-probs"):
        GRPOConfig(repetition_penalty=1.1)
    with pytest.raises(ConfigError, match="push_to_hub=True.*upload_folder"):
        GRPOConfig(push_to_hub=True)
    with pytest.raises(ConfigError, match="max_prompt_length=256.*rollout.max_context"):
        GRPOConfig(max_prompt_length=256)
    with pytest.raises(ConfigError, match="chat_template_kwargs.*model.chat_format"):
        GRPOConfig(chat_template_kwargs={"enable_thinking": False})
    GRPOConfig(repetition_penalty=1.0, remove_unused_columns=False)  # the values agentrl behaves as


def test_attributes_read_as_in_trl():
    cfg = GRPOConfig(output_dir="out", beta=0.04)
    assert (cfg.output_dir, cfg.beta, cfg.learning_rate, cfg.save_total_limit) == ("out", 0.04, 1e-6, None)
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        cfg.nonsense  # noqa: B018


def test_unknown_names_get_a_did_you_mean_and_agentrl_keys_are_accepted():
    with pytest.raises(ConfigError, match="unknown argument 'learnig_rate' \\(did you mean 'learning_rate'\\?\\)"):
        GRPOConfig(learnig_rate=1e-5)
    keys = GRPOConfig(**{"loss.beta": 0.04, "rollout.max_context": 2048}).to_keys(64)
    assert keys["loss.beta"] == 0.04 and keys["rollout.max_context"] == 2048


def test_batch_shape_epochs_warmup_and_sampling_convert_as_trl_counts_them():
    cfg = GRPOConfig(per_device_train_batch_size=16, gradient_accumulation_steps=2, num_generations=8, num_train_epochs=1, warmup_ratio=0.25,
                     steps_per_generation=4, scale_rewards=False, generation_kwargs={"min_tokens": 3}, loss_type="grpo", beta=0.04)  # fmt: skip
    keys = cfg.to_keys(num_tasks=64, world_size=1)
    assert keys["prompts_per_step"] == 4 and keys["max_steps"] == 16 and keys["warmup_steps"] == 4
    assert keys["steps_per_generation"] == 2  # TRL counts micro-steps
    assert keys["advantage_scale"] == "none" and keys["sampling.min_tokens"] == 3 and keys["loss.loss_type"] == "grpo" and keys["loss.beta"] == 0.04
    assert keys["learning_rate"] == 1e-6 and keys["adam_betas"] == (0.9, 0.999) and keys["lr_scheduler"] == "linear" and keys["sampling.temperature"] == 1.0
    assert keys["rollout.max_completion_tokens"] == keys["rollout.max_tokens_per_turn"] == 512
    with pytest.raises(ConfigError, match="not a multiple of num_generations=8"):
        GRPOConfig(per_device_train_batch_size=12, num_generations=8).to_keys(64, world_size=1)
    with pytest.raises(ConfigError, match="generation_kwargs\\['do_sample'\\]"):
        GRPOConfig(generation_kwargs={"do_sample": True}).to_keys(64)


def test_the_docs_table_is_the_code_s():
    text = DOC.read_text()
    start, end = text.index("<!-- names table"), text.index("<!-- end of names table -->")
    assert text[start:end].split("\n", 1)[1].strip() == names_table()


# -- batched rewards --------------------------------------------------------------------------------


def test_a_batched_reward_sees_its_whole_group_once(tmp_path):
    calls = []

    def longest(prompts, completions, completion_ids, answer, **kwargs):
        calls.append((len(prompts), len(set(answer)), all(isinstance(c, list) and c[0]["role"] == "assistant" for c in completions)))
        top = max(len(ids) for ids in completion_ids)
        return [1.0 if len(ids) == top else None for ids in completion_ids]

    trainer = GRPOTrainer(model="default", reward_funcs=longest, args=args(tmp_path), train_dataset=tasks())
    trainer.train()
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert calls and all(c == (4, 1, True) for c in calls)  # one call per group: its 4 completions, one task
    assert len(calls) == 2 and row["reward/longest"] == 1.0  # None where it does not apply: the rest are skipped, not 0
    assert trainer.cfg.prompts_per_step == 2 and trainer.cfg.num_generations == 4


def test_batched_reward_mistakes_fail_with_the_reward_s_name(tmp_path):
    def short(completions, **kwargs):
        return [1.0]

    with pytest.raises(Exception, match="reward 'short' raised TypeError: returned 1 values for 4 completions"):
        GRPOTrainer(model="default", reward_funcs=short, args=args(tmp_path), train_dataset=tasks()).train()

    def staged(completions, trainer_state, **kwargs):
        return [0.0] * len(completions)

    with pytest.raises(UserError, match="asks for .trainer_state., a TRL argument agentrl does not pass"):
        GRPOTrainer(model="default", reward_funcs=staged, args=args(tmp_path / "b"), train_dataset=tasks())
    assert not (tmp_path / "b" / "run").exists()  # before the run folder and the model
    clash = tasks().add_column("completions", ["x"] * 32)
    with pytest.raises(UserError, match="column .completions..*rename the column"):
        GRPOTrainer(model="default", reward_funcs=short, args=args(tmp_path / "c"), train_dataset=clash)


def test_trainer_level_mistakes_fail_before_the_model(tmp_path):
    with pytest.raises(ConfigError, match="reward_weights has 2 values for 1 reward functions"):
        GRPOTrainer(model="does/not/exist", reward_funcs=len, args=GRPOConfig(reward_weights=[1.0, 2.0]), train_dataset=tasks())
    with pytest.raises(ConfigError, match="callbacks has no agentrl equivalent"):
        GRPOTrainer(model="does/not/exist", reward_funcs=len, args=GRPOConfig(), train_dataset=tasks(), callbacks=[object()])
    with pytest.raises(ConfigError, match="from agentrl.trl import GRPOConfig"):
        GRPOTrainer(model="does/not/exist", reward_funcs=len, args={"learning_rate": 1e-5}, train_dataset=tasks())


def test_a_trl_batched_reward_from_the_command_line(tmp_path):
    from agentrl.cli.main import main

    reward = tmp_path / "trl_reward.py"
    reward.write_text("def short_answers(completions, answer, **kwargs):\n    return [1.0 if len(c) < 40 else 0.0 for c in completions]\n")
    run = tmp_path / "run"
    argv = ["train", "env=calculator", "model=default", "max_steps=1", "prompts_per_step=2", "num_generations=4", f"output_dir={run}",
            f"extra_rewards=[{{fn: '{reward}:short_answers', weight: 0.0}}]"]  # fmt: skip
    assert main(argv) == 0
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert "reward/short_answers" in row and "reward/correct" in row


# -- the two scripts of docs/from_trl.md --------------------------------------------------------------


def _run_script(name: str, tmp_path: Path, steps: int) -> list[dict]:
    env = {**os.environ, "MAX_STEPS": str(steps), "OUTPUT_DIR": str(tmp_path / name), "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(EXAMPLES / name)], env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", ["format_and_answer.py", "tool_factory.py"])
def test_the_doc_s_trl_script_is_the_example_but_for_its_import(name):
    ported = (EXAMPLES / name).read_text()
    trl = ported.replace("from agentrl.trl import GRPOConfig, GRPOTrainer", "from trl import GRPOConfig, GRPOTrainer")
    assert trl != ported and f"```python\n{trl.strip()}\n```" in DOC.read_text()


@pytest.mark.parametrize("name", ["format_and_answer.py", "tool_factory.py"])
def test_the_ported_scripts_train_two_steps(name, tmp_path):
    rows = _run_script(name, tmp_path, 2)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["rollout/episodes/errors"] == 0 for r in rows)
    if name == "tool_factory.py":
        assert any(r["reward/used_tool_reward"] > 0 for r in rows) and rows[0]["rollout/tools/calls"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["format_and_answer.py", "tool_factory.py"])
def test_the_ported_scripts_reward_rises(name, tmp_path):
    rows = _run_script(name, tmp_path, 30)
    first, last = [r["reward/mean"] for r in rows[:5]], [r["reward/mean"] for r in rows[-5:]]
    print(name, [round(r["reward/mean"], 3) for r in rows])
    # seen 2026-12-02 on the 2-core CPU: format_and_answer 0.425 -> 0.975, tool_factory 0.331 -> 0.550 (its correctness 0.13 -> 0.37)
    assert sum(last) / 5 > sum(first) / 5 + 0.1


def test_docs_name_every_key_they_map_to():
    from agentrl.train.config import TrainConfig

    own = set(TrainConfig.model_fields)
    for name, n in TRL_NAMES.items():
        if n.agentrl:
            assert n.agentrl.split(".")[0] in own, (name, n.agentrl)
    assert re.search(r"from agentrl\.trl import GRPOConfig, GRPOTrainer", DOC.read_text())


def test_a_batched_reward_that_raises_drops_its_group_when_asked(tmp_path):
    def flaky(completions, answer, **kwargs):
        if answer[0] == "1":
            raise ValueError("no answer key for 1")
        return [0.5] * len(completions)

    tasks_ = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}], "answer": str(i + 1)} for i in range(8)])
    trainer = GRPOTrainer(model="default", reward_funcs=flaky, args=args(tmp_path, per_device_train_batch_size=32, **{"rollout.reward_errors": "drop"}),
                          train_dataset=tasks_)  # fmt: skip
    trainer.train()
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["rollout/episodes/errors"] == 4 and row["rollout/episodes"] == 32  # the group of answer "1": counted, not silent
    with pytest.raises(Exception, match="reward 'flaky' raised ValueError: no answer key for 1"):
        GRPOTrainer(model="default", reward_funcs=flaky, args=args(tmp_path / "b", per_device_train_batch_size=32), train_dataset=tasks_).train()


def test_a_loaded_model_its_tokenizer_and_a_lora_config_object(tmp_path):
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from agentrl.compute.models import load_tokenizer, resolve_model

    path = resolve_model("default")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), load_tokenizer("default")

    def brief(completions, **kwargs):
        return [1.0 if len(c[0]["content"]) < 20 else 0.0 for c in completions]

    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=brief, args=args(tmp_path), train_dataset=tasks(), processing_class=tokenizer, peft_config=lora)
    trainer.train()
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["model"]["path"] == "default" and saved["peft"]["r"] == 4 and saved["peft"]["target_modules"] == ["q_proj", "v_proj"]
    merged = trainer.save_model(str(tmp_path / "merged"), merged=True)
    assert AutoModelForCausalLM.from_pretrained(merged).config.vocab_size == model.config.vocab_size


def test_a_reward_model_given_by_path_or_object_as_in_trl(tmp_path):
    """TRL loads a string in reward_funcs as AutoModelForSequenceClassification (num_labels=1) and
    scores prompt + completion; here through RewardModel, logged under the model's name."""
    import torch
    from transformers import AutoModelForSequenceClassification, LlamaConfig

    from agentrl.compute.models import load_tokenizer

    tokenizer = load_tokenizer("default")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, num_labels=1, pad_token_id=tokenizer.pad_token_id or 0)  # fmt: skip
    scorer = AutoModelForSequenceClassification.from_config(config)
    folder = tmp_path / "tiny-rm"
    scorer.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    trainer = GRPOTrainer(model="default", reward_funcs=[str(folder)], args=args(tmp_path), train_dataset=tasks())
    trainer.train()
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert "reward/tiny-rm" in row and row["reward/tiny-rm/std"] > 0  # a real model's scores vary over completions


def test_evaluate_on_the_eval_dataset_after_training(tmp_path):
    def answer_is_there(completions, answer, **kwargs):
        return [float(a in c[0]["content"]) for c, a in zip(completions, answer)]

    trainer = GRPOTrainer(model="default", reward_funcs=answer_is_there, args=args(tmp_path), train_dataset=tasks(), eval_dataset=tasks(6))
    trainer.train()
    out = trainer.evaluate()
    assert 0.0 <= out["eval/reward"] <= 1.0 and len(trainer.trainer.eval_results[1]) == 6
    import torch

    assert isinstance(trainer.model, torch.nn.Module) and trainer.processing_class is trainer.trainer.tokenizer  # TRL's attributes
    with pytest.raises(ConfigError, match="does not upload.*upload_folder"):
        trainer.push_to_hub()
    with pytest.raises(ConfigError, match="no eval_dataset"):
        GRPOTrainer(model="default", reward_funcs=answer_is_there, args=args(tmp_path / "b"), train_dataset=tasks()).evaluate()
