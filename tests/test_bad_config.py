"""Every bad configuration is one clear line on stderr, a non-zero exit, no traceback, and (where
the mistake does not need the model) no model load: the CLI runs in-process with model loading
made to fail loudly, so a case that reaches it fails the test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.cli.main import main

ENVS = '''
from datasets import Dataset
from agentrl.env.environment import ToolEnvironment

NOT_CALLABLE = 42

class Raising(ToolEnvironment):
    def __init__(self, **kw):
        raise RuntimeError("the environment's __init__ failed on purpose")

class Empty(ToolEnvironment):
    def load_dataset(self, split):
        return Dataset.from_list([])

class NotAnEnv:
    pass

def not_a_reward():
    pass

A_STRING = "not callable"
'''

# (case id, command line, text the one line must contain). {tmp} is the fixture folder.
CASES = [
    ("unknown key", "train lerning_rate=1e-3", "did you mean learning_rate"),
    ("unknown nested key", "train rollout.max_tokens=8", "rollout.max_tokens: unknown key"),
    ("packing knob without packing", "train pack_sequences=false micro_batch_tokens=512", "no effect with pack_sequences=false"),
    ("wrong type", "train max_steps=abc", "max_steps"),
    ("below bound", "train max_steps=0", "max_steps"),
    ("group of one", "train num_generations=1", "num_generations"),
    ("greedy training", "train sampling.temperature=0", "temperature > 0"),
    ("top_p out of range", "train sampling.top_p=1.5", "sampling.top_p"),
    ("unknown chat format", "train model.chat_format=nope", "unknown chat format 'nope'"),
    ("chat format typo", "eval model.chat_format=hermess", "did you mean hermes"),
    ("invalid YAML", "train config={tmp}/bad.yaml", "bad.yaml"),
    ("invalid JSON", "train config={tmp}/bad.json", "bad.json"),
    ("config not a mapping", "train config={tmp}/list.yaml", "must be a mapping"),
    ("config file missing", "train config={tmp}/missing.yaml", "config file not found"),
    ("not key=value", "train calculator", "expected key=value"),
    ("value used as section", "train model=foo model.path.x=1", "is a value, not a section"),
    ("env file syntax error", "train env={tmp}/syntax.py:Env", "syntax error"),
    ("env not callable", "train env={tmp}/envs.py:NOT_CALLABLE", "not an environment class"),
    ("env __init__ raises", "train env={tmp}/envs.py:Raising", "failed on purpose"),
    ("env not an Environment", "train env={tmp}/envs.py:NotAnEnv", "not an Environment"),
    ("env unknown name", "train env=nope", "unknown environment 'nope'"),
    ("env file missing", "train env={tmp}/missing.py:Env", "file not found"),
    ("env attribute missing", "train env={tmp}/envs.py:Missing", "has no attribute 'Missing'"),
    ("env module missing", "train env=no_such_module_xyz:Env", "cannot import"),
    ("env_args not accepted", "train env_args.bogus=1", "bogus"),
    ("empty dataset", "train env={tmp}/envs.py:Empty", "split has no tasks"),
    ("eval split missing", "eval split=nope", "'nope'"),
    ("output_dir is a file", "train output_dir={tmp}/a_file", "exists and is not a folder"),
    ("output_dir under a file", "train output_dir={tmp}/a_file/run", "is a file, not a folder"),
    ("eval output is a file", "eval output={tmp}/a_file", "exists and is not a folder"),
    ("resume=latest without output_dir", "train resume=latest", "resume=latest needs output_dir"),
    ("resume=latest, no checkpoint", "train resume=latest output_dir={tmp}/empty_run", "no checkpoint of this run under"),
    ("resume from a missing folder", "train resume={tmp}/no_run", "holds no checkpoints"),
    ("missing model path", "train model={tmp}/no_model", "no such folder"),
    ("model path is a file", "eval model={tmp}/a_file", "is a file, not a model folder"),
    ("hub id not cached offline", "train model=nobody-xyz/no-such-model", "not in the Hugging Face cache"),
    ("max_context too small", "train rollout.max_context=16", "rollout.max_context=16 leaves no room"),
    ("max_context below bound", "train rollout.max_context=8", "rollout.max_context"),
    ("knob of another backend", "train generator.url=http://x", "only for backend=vllm-server"),
    ("vllm not installed", "train generator=vllm", "generator=vllm"),
    ("ref mix half set", "train ref_mix_alpha=0.5", "ref_mix_alpha and ref_mix_every"),
    ("eval knob without eval", "train eval_tasks=5", "no effect without eval_every"),
    ("unknown tracker", "train report_to=[foo]", "report_to.0: Input should be 'tensorboard', 'wandb' or 'trackio'"),
    ("extra reward missing file", 'train \'extra_rewards=[{{"fn":"{tmp}/nope.py:f"}}]\'', "file not found"),
    ("extra reward not callable", 'train \'extra_rewards=[{{"fn":"{tmp}/envs.py:A_STRING"}}]\'', "not callable"),
    ("unknown loss type", "train loss.loss_type=nope", "loss"),
    ("eval k>1 greedy", "eval k=2 temperature=0", "k > 1"),
    ("eval n=0", "eval n=0", "n:"),
    ("check env raises", "check env={tmp}/envs.py:Raising", "failed on purpose"),
    ("doctor missing model", "doctor model={tmp}/no_model", "no_model"),
    ("unknown command", "trian", "unknown command 'trian' (did you mean train?)"),
    # keys added after issue 17: dynamic sampling, curriculum, FSDP2, asynchronous rollouts
    ("dynamic_sampling.max_rounds negative", "train dynamic_sampling.max_rounds=-1", "dynamic_sampling.max_rounds"),
    ("dynamic_sampling.min_std negative", "train dynamic_sampling.min_std=-0.5", "dynamic_sampling.min_std"),
    ("dynamic_sampling.max_draw_factor below 1", "train dynamic_sampling.max_draw_factor=0.5", "dynamic_sampling.max_draw_factor"),
    ("dynamic_sampling.enabled not a bool", "train dynamic_sampling.enabled=maybe", "dynamic_sampling.enabled"),
    ("dynamic_sampling key typo", "train dynamic_sampling.min_sdt=0.1", "did you mean dynamic_sampling.min_std"),
    ("curriculum.floor above 1", "train curriculum.floor=2", "curriculum.floor"),
    ("curriculum.smoothing of 1", "train curriculum.smoothing=1", "curriculum.smoothing"),
    ("curriculum.key not a task field", "train curriculum.key=level", "curriculum.key: the tasks have no field 'level'"),
    ("curriculum.key on eval", "eval curriculum.key=difficulty", "curriculum"),
    ("distributed.strategy unknown", "train distributed.strategy=zero3", "distributed.strategy"),
    ("fsdp with LoRA", "train distributed.strategy=fsdp peft.r=8", "LoRA"),
    ("fsdp with a reference model", "train distributed.strategy=fsdp loss.beta=0.1", "loss.beta > 0"),
    ("max_staleness negative", "train max_staleness=-1", "max_staleness"),
    ("max_staleness not a number", "train max_staleness=abc", "max_staleness"),
    ("max_staleness without IS correction", "train max_staleness=1 loss.sampler_is_mode=null", "sampler importance-sampling correction"),
    ("max_staleness with dynamic sampling", "train max_staleness=1 loss.sampler_is_mode=truncate dynamic_sampling.enabled=true",
     "dynamic_sampling (refill rounds within a step)"),
    ("max_staleness with fsdp", "train max_staleness=1 loss.sampler_is_mode=truncate distributed.strategy=fsdp", "fsdp needs several"),
    ("rollout_device without max_staleness", "train rollout_device=cuda:1", "rollout_device has no effect"),
    ("rollout_device not a device", "train max_staleness=1 loss.sampler_is_mode=truncate rollout_device=banana", "rollout_device=banana"),
    ("rollout_device absent GPU", "train max_staleness=1 loss.sampler_is_mode=truncate rollout_device=cuda:7", "CUDA device"),
    # env_args of the environments added after issue 17, and the sandbox options of math_python
    ("math_python unknown kind", "train env=math_python env_args.kinds=[nope]", "unknown problem kinds"),
    ("math_python unknown argument", "train env=math_python env_args.bogus=1", "bogus"),
    ("math_python empty train split", "train env=math_python env_args.num_train=0", "split has no tasks"),
    ("sokoban size out of range", "train env=sokoban env_args.size=20", "sokoban size must be 5 to 9"),
    ("sokoban boxes out of range", "eval env=sokoban env_args.boxes=0", "sokoban boxes must be 1 to 3"),
    ("search k of 0", "train env=search env_args.k=0", "search k"),
    ("search test split too big", "train env=search env_args.num_test=100000", "split has no tasks"),
    ("sandbox unknown option", "train env=math_python env_args.sandbox.bogus=1", "bogus"),
    ("sandbox isolation unknown", "train env=math_python env_args.sandbox.isolation=docker", "sandbox isolation must be"),
    ("sandbox timeout of 0", "train env=math_python env_args.sandbox.timeout_s=0", "sandbox timeout_s must be positive"),
    ("sandbox memory not a number", "train env=math_python env_args.sandbox.memory_mb=lots", "sandbox memory_mb"),
    ("sandbox max_open_files of 0", "train env=math_python env_args.sandbox.max_open_files=0", "sandbox max_open_files must be positive"),
    ("sandbox contradiction", "eval env=math_python env_args.sandbox.isolation=none env_args.sandbox.require_isolation=true",
     "contradicts require_isolation"),
    ("sandbox not a mapping", "train env=math_python env_args.sandbox=3", "sandbox"),
]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bad")
    (d / "bad.yaml").write_text("max_steps: [1, 2\n")
    (d / "bad.json").write_text('{"max_steps": 1,')
    (d / "list.yaml").write_text("- 1\n- 2\n")
    (d / "syntax.py").write_text("class Env(:\n    pass\n")
    (d / "envs.py").write_text(ENVS)
    (d / "a_file").write_text("x")
    return d


@pytest.fixture()
def no_model_load(monkeypatch):
    """Loading weights is a test failure here: every case must be caught before that."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded for a configuration error")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_at_least_32_cases():
    assert len(CASES) >= 32 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("argv", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_config_is_one_line(argv, expected, tmp, no_model_load, capsys, monkeypatch):
    monkeypatch.chdir(tmp)
    args = [a.format(tmp=tmp) for a in _split(argv)]
    code = main(args)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0, (argv, out, err)
    assert "Traceback" not in err + out
    assert len(lines) == 1, err
    assert expected in lines[0], lines[0]


def test_debug_shows_the_traceback(tmp, no_model_load):
    with pytest.raises(Exception, match="failed on purpose"):
        main(["check", f"env={tmp}/envs.py:Raising", "--debug"])


def test_a_raising_reward_shows_the_real_exception(tmp_path, capsys, monkeypatch):
    """Runtime, with the bundled model: the failing reward's own message reaches the one line."""
    (tmp_path / "r.py").write_text(
        "from agentrl.environments.calculator import CalculatorEnv\n"
        "def broken(completion, **kw):\n    raise ValueError('reward exploded on purpose')\n"
        "class Env(CalculatorEnv):\n    def __init__(self, **kw):\n        super().__init__(**kw)\n"
        "        from agentrl.env.environment import Reward\n        self.rewards = [Reward(broken)]\n"
    )
    monkeypatch.chdir(tmp_path)
    code = main(["train", f"env={tmp_path}/r.py:Env", "max_steps=1", "prompts_per_step=2", "num_generations=2",
                 f"output_dir={tmp_path}/run", "rollout.max_tokens_per_turn=8", "rollout.max_completion_tokens=16"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err  # the reward's bug is a user error (issue 41)
    assert "reward 'broken' raised ValueError: reward exploded on purpose" in err, err


def _split(argv: str) -> list[str]:
    import shlex

    return shlex.split(argv)


def test_cases_are_json_safe():
    # the extra_rewards cases carry JSON on the command line; keep them parseable
    for _, argv, _ in CASES:
        if "extra_rewards=" in argv:
            json.loads(argv.split("extra_rewards=", 1)[1].rstrip("'").replace("{{", "{").replace("}}", "}").replace("{tmp}", "/x"))
