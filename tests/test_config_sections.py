"""Config sections merge, never reset: one key of a section keeps the command's defaults for the others.

Before issue 41, ``sampling.top_p=0.9`` raised training's temperature from 0.7 to 1.0 (the class
default) and ``rollout.max_completion_tokens=512`` reset the per-turn cap and the context.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from pydantic import BaseModel

from agentrl.cli.help import config_keys
from agentrl.cli.main import COMMANDS, main
from agentrl.core.errors import ConfigError
from agentrl.core.overrides import build, parse_overrides
from agentrl.train.config import TrainConfig

REQUIRED = {"vllm-serve": {"model": "default"}}


def _model(spec: str) -> type[BaseModel]:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _sections(config: BaseModel, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], BaseModel]]:
    out = []
    for name in type(config).model_fields:
        value = getattr(config, name)
        if isinstance(value, BaseModel):
            out.append(((*path, name), value))
            out += _sections(value, (*path, name))
    return out


def _nested(path: tuple[str, ...], key: str, value: Any) -> dict[str, Any]:
    data: dict[str, Any] = {key: value}
    for part in reversed(path):
        data = {part: data}
    return data


def _cases() -> list[tuple[str, tuple[str, ...], str]]:
    cases = []
    for command, (_, _, spec) in COMMANDS.items():
        if spec is None:
            continue
        default = build(_model(spec), dict(REQUIRED.get(command, {})))
        for path, section in _sections(default):
            cases += [(command, path, key) for key in type(section).model_fields]
    return cases


@pytest.mark.parametrize("command,path,key", _cases(), ids=lambda x: ".".join(x) if isinstance(x, tuple) else str(x))
def test_setting_one_key_of_a_section_keeps_the_commands_defaults_for_the_others(command, path, key):
    model = _model(COMMANDS[command][2])
    base = dict(REQUIRED.get(command, {}))
    default = build(model, base)
    section = default
    for part in path:
        section = getattr(section, part)
    value = section.model_dump(by_alias=True)[type(section).model_fields[key].alias or key]
    try:
        config = build(model, {**base, **_nested(path, key, value)})
    except ConfigError as exc:  # a knob that does nothing under the command's defaults is refused, naming it
        named = key in str(exc) or key.rsplit("_", 1)[0] + "_*" in str(exc)
        assert named and ("no effect" in str(exc) or "only for" in str(exc)), exc
        return
    got = config
    for part in path:
        got = getattr(got, part)
    assert got.model_dump() == section.model_dump()


def test_train_sampling_and_rollout_keep_their_train_defaults():
    cfg = build(TrainConfig, parse_overrides(["sampling.top_p=0.9"]))
    assert (cfg.sampling.temperature, cfg.sampling.top_p) == (0.7, 0.9)
    cfg = build(TrainConfig, parse_overrides(["rollout.max_completion_tokens=512"]))
    assert (cfg.rollout.max_tokens_per_turn, cfg.rollout.max_completion_tokens, cfg.rollout.max_context) == (
        64,
        512,
        1024,
    )
    cfg = build(TrainConfig, parse_overrides(["rollout.max_completion_tokens=128", "sampling.min_tokens=120"]))
    assert cfg.sampling.temperature == 0.7 and cfg.rollout.max_tokens_per_turn == 64


def test_environment_defaults_stay_above_the_commands_and_below_the_users():
    cfg = build(TrainConfig, parse_overrides(["env=math_python", "rollout.max_context=2048"]))
    assert (cfg.rollout.max_tokens_per_turn, cfg.rollout.max_completion_tokens, cfg.rollout.max_context) == (
        128,
        320,
        2048,
    )
    cfg = build(TrainConfig, parse_overrides(["guidance.weight=2.0"]))  # calculator's guidance defaults kept
    assert cfg.guidance.enabled and cfg.guidance.keep == "above_mean" and cfg.guidance.weight == 2.0


def test_help_shows_what_a_run_uses(capsys):
    rows = {key: default for key, _, default, _ in config_keys(TrainConfig)}
    cfg = build(TrainConfig, {})
    assert rows["sampling.temperature"] == str(cfg.sampling.temperature) == "0.7"
    assert main(["train", "env=math_python", "sampling.top_p=0.9", "--help"]) == 0
    out = capsys.readouterr().out
    assert "rollout.max_tokens_per_turn  int  (default: 128)" in out
    assert "sampling.temperature  float  (default: 0.7)" in out and "sampling.top_p  float  (default: 0.9)" in out
    assert main(["train", "sampling.nope=1", "--help"]) == 2
    assert "sampling.nope: unknown key" in capsys.readouterr().err


@pytest.mark.parametrize("key,suggested", [("beta", "loss.beta"), ("epsilon", "loss.epsilon"), ("delta", "loss.delta"), ("top_p", "sampling.top_p")])
def test_did_you_mean_searches_the_nested_sections(key, suggested):
    """Before issue 41 ``epsilon`` suggested ``precision``, ``delta`` ``model``, ``beta`` nothing."""
    with pytest.raises(ConfigError, match=rf"{key}: unknown key \(did you mean {suggested}\?\)"):
        build(TrainConfig, {key: 1})
