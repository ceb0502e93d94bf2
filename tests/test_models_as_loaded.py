"""Models as users load them (issue 41, item 5): the base's dtype, LoraConfig objects, QLoRA's check,
pre-loaded models, ``save_model`` and adapter checkpoints whose base folder moves.

Before: the policy always loaded in float32 (``model.dtype`` was ignored by training); a
``LoraConfig`` object and a model object were turned into their repr (``File name too long``);
no ``save_model``; a LoRA checkpoint recorded its base as given relative to the working folder.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from agentrl import Trainer
from agentrl.compute.models import load_model, load_tokenizer
from agentrl.core.strict import ConfigError

SMALL = dict(prompts_per_step=2, num_generations=4, micro_batch_size=4, **{"rollout.max_tokens_per_turn": 32, "rollout.max_completion_tokens": 160})

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers' deprecation notes inside peft


def trainable(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer._module().named_parameters() if p.requires_grad}


def changed(before: dict[str, torch.Tensor], trainer: Trainer) -> bool:
    now = dict(trainer._module().named_parameters())
    return any(not torch.equal(v, now[n].detach()) for n, v in before.items())


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory):
    """The bundled model saved into a folder of its own (a user's base model)."""
    folder = tmp_path_factory.mktemp("models") / "base"
    load_model("default", dtype=torch.float32, device="cpu").save_pretrained(folder)
    load_tokenizer("default").save_pretrained(folder)
    return folder


# -- (a) the base's dtype -----------------------------------------------------------------------


def test_lora_with_a_bf16_base_keeps_float32_adapter_weights_and_trains(tmp_path):
    trainer = Trainer(env="calculator", max_steps=1, output_dir=str(tmp_path), peft={"r": 4}, **{"model.dtype": "bfloat16"}, **SMALL)
    params = dict(trainer._module().named_parameters())
    base = {p.dtype for n, p in params.items() if "lora_" not in n}
    lora = {(p.dtype, p.requires_grad) for n, p in params.items() if "lora_" in n}
    assert base == {torch.bfloat16}, base  # before: float32 whatever model.dtype said
    assert lora == {(torch.float32, True)}, lora
    before = trainable(trainer)
    assert trainer.train()["step"] == 1
    assert changed(before, trainer)


def test_auto_dtype_keeps_float32_for_full_fine_tuning_and_on_cpu():
    from agentrl.train.model_source import policy_dtype

    assert policy_dtype("auto", "full", cuda=False) == torch.float32
    assert policy_dtype("auto", "lora", cuda=False) == torch.float32
    assert policy_dtype("auto", "full", cuda=True) == torch.float32  # master weights
    assert policy_dtype("bfloat16", "full", cuda=False) == torch.bfloat16  # asked for


def test_full_fine_tuning_in_float16_is_one_error_before_the_run_folder(tmp_path):
    with pytest.raises(ConfigError, match=r"model.dtype=float16 with full fine-tuning: .*loss scaling"):
        Trainer(env="calculator", max_steps=1, output_dir=str(tmp_path / "run"), **{"model.dtype": "float16"}, **SMALL)
    assert not (tmp_path / "run").exists()


# -- (b) LoraConfig objects, every field; QLoRA ------------------------------------------------


def test_a_lora_config_object_keeps_every_field_and_config_json_holds_plain_data(tmp_path):
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules={"q_proj", "v_proj"}, use_rslora=True, bias="lora_only", layers_to_transform=[0])
    trainer = Trainer(env="calculator", max_steps=1, output_dir=str(tmp_path), peft=lora, **SMALL)
    built = trainer._module().peft_config["default"]
    assert (built.r, built.lora_alpha, built.use_rslora, built.bias, built.layers_to_transform) == (4, 8, True, "lora_only", [0])
    assert set(built.target_modules) == {"q_proj", "v_proj"}
    saved = json.loads((tmp_path / "config.json").read_text())["peft"]
    assert saved["use_rslora"] is True and saved["target_modules"] == ["q_proj", "v_proj"] and saved["bias"] == "lora_only"
    assert saved["r"] == 4 and saved["lora_alpha"] == 8 and saved["layers_to_transform"] == [0]
    assert "LoraConfig(" not in (tmp_path / "config.json").read_text()


def test_any_lora_config_field_as_a_key_and_a_misspelt_one_named():
    from agentrl.core.overrides import build, parse_overrides
    from agentrl.train.config import TrainConfig

    cfg = build(TrainConfig, parse_overrides(["peft.use_rslora=true", "peft.modules_to_save=[lm_head]"]))
    assert cfg.peft.lora_fields()["use_rslora"] is True and cfg.peft.r == 16  # agentrl's defaults for the rest
    from agentrl.compute.adapters import lora_config

    assert lora_config(cfg.peft.lora_fields()).modules_to_save == ["lm_head"]
    with pytest.raises(ConfigError, match=r"peft.use_rslor: unknown key \(did you mean peft.use_rslora\?\)"):
        build(TrainConfig, parse_overrides(["peft.use_rslor=true"]))
    from peft import IA3Config, LoraConfig

    from agentrl.train.build import config_from

    with pytest.raises(ConfigError, match="peft: IA3Config is not supported"):
        config_from(None, None, {"peft": IA3Config()})
    with pytest.raises(ConfigError, match="task_type='SEQ_CLS'"):
        config_from(None, None, {"peft": LoraConfig(task_type="SEQ_CLS")})
    assert TrainConfig(peft=LoraConfig(r=2, use_dora=True)).peft.lora_fields()["use_dora"] is True  # the object, validated directly


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for machines without CUDA")
def test_qlora_without_cuda_is_one_line_before_any_model_loads(tmp_path):
    with pytest.raises(ConfigError, match=r"peft.load_in_4bit=true \(QLoRA\) needs CUDA and bitsandbytes: no CUDA device here"):
        Trainer(env="calculator", max_steps=1, output_dir=str(tmp_path / "run"), **{"peft.load_in_4bit": True}, **SMALL)
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="QLoRA needs CUDA")
def test_qlora_trains_a_step_on_cuda(tmp_path):
    pytest.importorskip("bitsandbytes")
    trainer = Trainer(env="calculator", max_steps=1, output_dir=str(tmp_path / "run"), **{"peft.load_in_4bit": True, "peft.r": 4}, **SMALL)
    module = trainer._module()
    assert getattr(module.get_base_model(), "is_loaded_in_4bit", False)
    before = trainable(trainer)
    trainer.train()
    assert changed(before, trainer)
    merged = trainer.save_model(tmp_path / "merged", merged=True)
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(merged)
    assert not any("lora" in n for n in plain.state_dict())


# -- (c) pre-loaded models ---------------------------------------------------------------------


def test_a_preloaded_model_and_tokenizer_train_and_config_json_names_it(tmp_path):
    model = load_model("default", dtype=torch.float32, device="cpu")
    tokenizer = load_tokenizer("default")
    trainer = Trainer(env="calculator", model=model, tokenizer=tokenizer, max_steps=1, output_dir=str(tmp_path), **SMALL)
    assert trainer._module() is model and trainer.tokenizer is tokenizer and trainer.policy_kind == "full"
    text = (tmp_path / "config.json").read_text()
    assert json.loads(text)["model"]["path"] == "default"  # the bundled model's folder, by its name
    assert "Qwen2ForCausalLM(" not in text and "Linear(" not in text
    before = trainable(trainer)
    trainer.train()
    assert changed(before, trainer)


def test_a_preloaded_model_without_tokenizer_loads_it_from_its_folder_and_takes_a_lora_config(tmp_path, base_folder):
    from peft import LoraConfig

    model = load_model(base_folder, dtype=torch.float32, device="cpu")
    trainer = Trainer(env="calculator", model=model, peft=LoraConfig(r=4, target_modules="all-linear"), max_steps=1, output_dir=str(tmp_path), **SMALL)
    assert trainer.policy_kind == "lora" and trainer.tokenizer.name_or_path == str(base_folder)
    assert json.loads((tmp_path / "config.json").read_text())["model"]["path"] == str(base_folder)
    trainer.train()


def test_a_peft_model_object_trains_its_adapter_and_records_its_settings(tmp_path):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(load_model("default", dtype=torch.float32, device="cpu"), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    trainer = Trainer(env="calculator", model=model, max_steps=1, output_dir=str(tmp_path), **SMALL)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model"]["path"] == "default" and saved["peft"]["r"] == 2 and saved["peft"]["target_modules"] == ["q_proj"]
    before = trainable(trainer)
    assert before and all("lora_" in n for n in before)
    trainer.train()
    assert changed(before, trainer)
    with pytest.raises(ConfigError, match="already a PEFT model"):
        Trainer(env="calculator", model=model, peft={"r": 4}, max_steps=1, output_dir=str(tmp_path / "again"), **SMALL)


def test_a_model_object_without_name_or_path_or_a_wrong_dtype_is_one_line(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentrl.compute.models import bundled_model_path

    config = AutoConfig.from_pretrained(bundled_model_path())
    config.name_or_path = ""  # built in memory: from no folder, no hub id
    anonymous = AutoModelForCausalLM.from_config(config)
    with pytest.raises(ConfigError, match="model: the model object has no name_or_path"):
        Trainer(env="calculator", model=anonymous, max_steps=1, output_dir=str(tmp_path / "a"), **SMALL)
    model = load_model("default", dtype=torch.float32, device="cpu")
    with pytest.raises(ConfigError, match="model.dtype=bfloat16: the model given is float32"):
        Trainer(env="calculator", model=model, max_steps=1, output_dir=str(tmp_path / "b"), **{"model.dtype": "bfloat16"}, **SMALL)
    with pytest.raises(ConfigError, match="seed: a object object is not a config value"):
        Trainer(env="calculator", seed=object(), max_steps=1, output_dir=str(tmp_path / "c"), **SMALL)
    assert not any((tmp_path / k).exists() for k in "abc")


# -- (d) save_model ------------------------------------------------------------------------------


def test_save_model_writes_the_adapter_or_a_merged_transformers_folder(tmp_path):
    from transformers import AutoModelForCausalLM

    trainer = Trainer(env="calculator", max_steps=1, output_dir=str(tmp_path / "run"), peft={"r": 4}, learning_rate=1e-2, **SMALL)
    trainer.train()
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        expected = trainer._module()(ids).logits
    adapter = trainer.save_model(tmp_path / "adapter")
    assert (adapter / "adapter_model.safetensors").is_file() and (adapter / "base_model.json").is_file()
    assert json.loads((adapter / "base_model.json").read_text())["given"] == "default"
    merged = trainer.save_model(tmp_path / "merged", merged=True)
    assert not (merged / "adapter_config.json").exists() and (merged / "tokenizer_config.json").is_file()
    plain = AutoModelForCausalLM.from_pretrained(merged)
    assert not any("lora" in n for n in plain.state_dict())
    with torch.no_grad():
        assert torch.allclose(plain(ids).logits, expected, atol=1e-4)
        assert torch.allclose(trainer._module()(ids).logits, expected)  # the training module is untouched
    from peft import AutoPeftModelForCausalLM

    with torch.no_grad():
        assert torch.allclose(AutoPeftModelForCausalLM.from_pretrained(adapter, dtype=torch.float32)(ids).logits, expected, atol=1e-5)


def test_save_model_of_full_fine_tuning_is_a_transformers_folder(tmp_path):
    from transformers import AutoModelForCausalLM

    trainer = Trainer(env="calculator", max_steps=1, output_dir=str(tmp_path / "run"), save_final=False, **SMALL)
    out = trainer.save_model(tmp_path / "model", merged=True)
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert torch.equal(AutoModelForCausalLM.from_pretrained(out)(ids).logits, trainer._module()(ids).logits)


# -- (e) adapter checkpoints whose base moves ----------------------------------------------------


def test_a_lora_checkpoint_finds_its_base_after_both_move_and_names_the_key_when_only_the_base_moved(tmp_path, base_folder, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(base_folder, work / "base")
    monkeypatch.chdir(work)
    Trainer(env="calculator", max_steps=1, output_dir="run", **{"model.path": "base", "peft.r": 4}, **SMALL).train()
    checkpoint = "run/checkpoints/step-000001"
    assert json.loads((work / checkpoint / "base_model.json").read_text()) == {"given": "base", "relative_path": "../../../base"}
    moved = tmp_path / "moved"
    monkeypatch.chdir(tmp_path)
    work.rename(moved)  # the base and the run move together (another machine, another folder)
    again = Trainer(env="calculator", max_steps=1, output_dir=str(tmp_path / "cont"), **{"model.path": str(moved / checkpoint)}, **SMALL)
    assert again.policy_kind == "adapter"  # before: 'base' was looked for in the working folder
    (moved / "base").rename(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match=r"its base model base is not found .*pass model.base=<its folder or hub id>"):
        Trainer(env="calculator", max_steps=1, output_dir=str(tmp_path / "cont2"), **{"model.path": str(moved / checkpoint)}, **SMALL)
    assert not (tmp_path / "cont2").exists()
    pointed = Trainer(
        env="calculator", max_steps=1, output_dir=str(tmp_path / "cont3"), **{"model.path": str(moved / checkpoint), "model.base": str(tmp_path / "elsewhere")}, **SMALL
    )
    assert pointed.policy_kind == "adapter"
    with pytest.raises(ConfigError, match="model.base: only for an adapter folder"):
        Trainer(env="calculator", max_steps=1, output_dir=str(tmp_path / "cont4"), **{"model.base": str(tmp_path / "elsewhere")}, **SMALL)


def test_an_adapter_checkpoint_of_the_bundled_model_records_default(tmp_path):
    trainer = Trainer(env="calculator", max_steps=1, output_dir=str(tmp_path / "run"), **{"peft.r": 4}, **SMALL)
    trainer.train()
    checkpoint = tmp_path / "run" / "checkpoints" / "step-000001"
    assert json.loads((checkpoint / "base_model.json").read_text()) == {"given": "default"}
    from agentrl.compute.adapters import adapter_base
    from agentrl.compute.models import bundled_model_path

    assert adapter_base(checkpoint) == str(bundled_model_path())
    # peft's own record stays an absolute folder that transformers and vLLM can load from anywhere
    assert json.loads((checkpoint / "adapter_config.json").read_text())["base_model_name_or_path"] == str(bundled_model_path())


def test_eval_decodes_an_adapter_checkpoint_merged_with_the_adapters_logits(tmp_path):
    """``agentrl eval model=<adapter>`` folds the LoRA layers into the base once (issue 47: the
    unmerged wrappers cost every decoded token two extra products per linear layer)."""
    from agentrl.cli.main import load_generation
    from agentrl.compute.adapters import fold_adapters
    from agentrl.core.overrides import build
    from agentrl.rollout.config import EvalConfig

    trainer = Trainer(env="calculator", max_steps=1, output_dir=str(tmp_path / "run"), peft={"r": 4}, learning_rate=1e-2, **SMALL)
    trainer.train()
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        expected = trainer._module()(ids).logits
    adapter = trainer.save_model(tmp_path / "adapter")
    loaded = load_model(adapter, dtype=torch.float32, device="cpu")
    assert any("lora" in n for n in loaded.state_dict())
    assert fold_adapters(loaded) > 0 and not any("lora" in n for n in loaded.state_dict())
    assert fold_adapters(loaded) == 0, "folding twice finds nothing left"
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, expected, atol=1e-4)
    cfg = build(EvalConfig, {"model": {"path": str(adapter)}})
    generator, _ = load_generation(cfg.model, cfg.generator)
    assert not any("lora" in n for n in generator.model.state_dict())
    with torch.no_grad():
        assert torch.allclose(generator.model(ids).logits, expected, atol=1e-4)
