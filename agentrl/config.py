"""Strict pydantic configs and ``key=value`` overrides for the command line.

Unknown keys, wrong types and conflicting settings fail at load time with a message naming the
key. ``a.b=c`` sets nested fields; values are read as JSON when they parse (``3``, ``0.5``,
``true``, ``[1,2]``, ``null``) and as strings otherwise. ``config=path.yaml|json`` loads a file
first; command-line keys override it.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Literal, TypeVar

import pydantic
from pydantic import BaseModel, Field

from agentrl.generators.base import SamplingConfig
from agentrl.rollout.engine import RolloutConfig
from agentrl.strict import ConfigError, Strict

__all__ = ["ConfigError", "EvalConfig", "GeneratorSettings", "ModelSettings", "RolloutConfig", "SamplingConfig", "Strict", "build", "parse_overrides"]

T = TypeVar("T", bound=BaseModel)


class GeneratorSettings(Strict):
    """Which backend generates, and its knobs (a knob of another backend is an error).

    ``transformers``: batches concurrent requests over the policy module itself. ``vllm``: an
    in-process vLLM engine (docs/vllm.md). ``vllm-server``: a vLLM server started with
    ``agentrl vllm-serve``, possibly on another machine.
    """

    backend: Literal["transformers", "vllm", "vllm-server"] = Field("transformers", description="who generates (shortcut: generator=...)")
    # transformers
    max_batch_size: int = Field(256, ge=1, description="transformers: requests decoded together")
    gather_window_s: float = Field(0.005, ge=0, description="transformers: for callers other than the rollout engine (which says how many episodes run), how long after the last request a batch waits for more")
    cuda_graphs: bool | None = Field(
        None, description="static KV cache + CUDA-graph decode (4-5x faster decoding; docs/performance.md); null: on when the policy is on CUDA and the model supports it (one line says why not)"
    )
    compile_decode: bool | None = Field(
        None, description="torch.compile the graph-captured one-token decode step (fuses small kernels; ~20 s compile on first use); null: with cuda_graphs"
    )
    continuous_batching: bool = Field(
        False, description="with cuda_graphs: finished requests are answered at once and queued ones (the next turns of multi-turn episodes) take their rows while the batch runs; off by default until measured faster (docs/performance.md)"
    )
    sample_in_step: bool = Field(
        True, description="with compile_decode: the captured step also draws each row's next token (one tempered setting, no filters, no continuous batching), and its logits are not kept per graph (docs/performance.md)"
    )
    # vllm (colocated)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="fraction of GPU memory vLLM may take")
    max_model_len: int | None = Field(None, ge=16, description="vLLM context length (None: rollout.max_context)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="auto: float32 on CPU, bfloat16 on CUDA")
    enable_sleep_mode: bool = Field(False, description="CUDA only: free vLLM's GPU memory during training steps")
    enforce_eager: bool | None = Field(None, description="None: eager on CPU, CUDA graphs on GPU")
    # vllm-server
    url: str = Field("http://127.0.0.1:8000", description="base URL of an `agentrl vllm-serve` server")
    timeout_s: float = Field(60.0, gt=0, description="how long connection failures are retried (backoff) before giving up")
    request_timeout_s: float = Field(600.0, gt=0, description="how long one request may wait for its answer")

    @pydantic.model_validator(mode="after")
    def _knobs_match_backend(self) -> GeneratorSettings:
        owners = {
            "transformers": {"max_batch_size", "gather_window_s", "cuda_graphs", "compile_decode", "continuous_batching", "sample_in_step"},
            "vllm": {"gpu_memory_utilization", "max_model_len", "dtype", "enable_sleep_mode", "enforce_eager"},
            "vllm-server": {"url", "timeout_s", "request_timeout_s"},
        }
        if self.compile_decode and self.cuda_graphs is False:
            raise ValueError("compile_decode=true needs cuda_graphs (true or null): the compiled step is the one the graph captures")
        for backend, knobs in owners.items():
            stray = sorted(knobs & self.model_fields_set) if backend != self.backend else []
            if stray:
                raise ValueError(f"{', '.join(stray)}: only for backend={backend}, not backend={self.backend}")
        return self


def require_backend(settings: GeneratorSettings) -> None:
    """Fail at start-up, with one line on how to install it, when the chosen backend is missing."""
    if settings.backend == "vllm":
        import importlib.util

        from agentrl.generators.vllm_common import VLLM_INSTALL_HINT

        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(f"generator=vllm: {VLLM_INSTALL_HINT}")


class ModelSettings(Strict):
    path: str = Field("default", description="'default' (bundled), a local folder or a hub id")
    chat_format: str | None = Field(None, description="override detection: a name from agentrl.chat.available_formats() (hermes, qwen3, llama3, mistral, gpt_oss, ...; docs/chat_formats.md lists them all)")
    device: str | None = Field(None, description="cpu, cuda, cuda:1 ... (None: cuda when available)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="weights dtype for generation (auto: float32 on CPU, bfloat16 on CUDA)")

    @pydantic.field_validator("chat_format")
    @classmethod
    def _known_format(cls, name: str | None) -> str | None:
        from agentrl.chat import available_formats

        if name is not None and name not in available_formats():
            close = difflib.get_close_matches(name, available_formats(), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(f"unknown chat format {name!r}{hint}; known: {', '.join(available_formats())}")
        return name


ENV_DOC = "a registered name (agentrl envs), 'package.module:Class' or 'path/to/file.py:Class'"
ENV_ARGS_DOC = "keyword arguments for the environment's constructor (env_args.name=value)"


class CheckConfig(Strict):
    """``agentrl check``: run check_env on one environment."""

    env: str = Field("calculator", description=ENV_DOC)
    env_args: dict[str, Any] = Field(default_factory=dict, description=ENV_ARGS_DOC)


class EvalConfig(Strict):
    """``agentrl eval``: pass@k of a model on an environment's split."""

    env: str = Field("calculator", description=ENV_DOC)
    env_args: dict[str, Any] = Field(default_factory=dict, description=ENV_ARGS_DOC)
    model: ModelSettings = Field(default_factory=ModelSettings)
    split: str = Field("test", description="the environment's dataset split")
    n: int | None = Field(None, ge=1, description="tasks to evaluate (None: the whole split)")
    k: int = Field(1, ge=1, description="samples per task")
    seed: int = Field(0, description="environment seed of the first task (task i uses seed + i)")
    pass_threshold: float = Field(1.0, description="an episode passes when its reward >= this")
    output: str | None = Field(None, description="output folder (default outputs/eval-<env>-<time>)")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    generator: GeneratorSettings = Field(default_factory=GeneratorSettings)

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> EvalConfig:
        if self.k > 1 and self.sampling.temperature == 0:
            raise ValueError("k > 1 with sampling.temperature=0 draws the same sample k times; raise the temperature or set k=1")
        return self


SHORTCUTS = {"model": "model.path", "temperature": "sampling.temperature", "generator": "generator.backend"}


def parse_overrides(args: list[str], shortcuts: dict[str, str] | None = None) -> dict[str, Any]:
    """``["a.b=1", "c=x"]`` → ``{"a": {"b": 1}, "c": "x"}``; ``config=file`` is loaded first."""
    shortcuts = SHORTCUTS if shortcuts is None else shortcuts
    result: dict[str, Any] = {}
    pairs = []
    args = list(args)
    for i, arg in enumerate(args):  # --config FILE / --config=FILE are config=FILE
        if arg == "--config" and i + 1 < len(args):
            args[i], args[i + 1] = f"config={args[i + 1]}", ""
        elif arg.startswith("--config="):
            args[i] = "config=" + arg.split("=", 1)[1]
    for arg in (a for a in args if a):
        key, sep, raw = arg.partition("=")
        if not sep or not key:
            raise ConfigError(f"expected key=value, got {arg!r}")
        if key == "config":
            result = _deep_merge(result, load_file(raw))
        else:
            pairs.append((shortcuts.get(key, key), raw))
    for key, raw in pairs:
        node = result
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{key}: {part} is a value, not a section")
        node[parts[-1]] = _value(raw)
    return result


def build(model: type[T], overrides: dict[str, Any]) -> T:
    """Validate ``overrides`` into ``model``, turning pydantic errors into one readable message."""
    try:
        return model.model_validate(overrides)
    except pydantic.ValidationError as exc:
        lines = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"])
            msg = " ".join(str(err["msg"]).removeprefix("Value error, ").split())
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
                close = difflib.get_close_matches(str(err["loc"][-1]), _fields_at(model, err["loc"][:-1]), n=1)
                if close:
                    msg += f" (did you mean {'.'.join([*map(str, err['loc'][:-1]), close[0]])}?)"
            lines.append(f"{key}: {msg}" if key else msg)
        raise ConfigError("invalid configuration: " + "; ".join(lines)) from None


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the (nested) config section at ``loc``, for did-you-mean hints."""
    current: Any = model
    for part in loc:
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        current = field.annotation
        for arg in getattr(current, "__args__", ()) or ():  # Optional[Section]
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                current = arg
    return list(getattr(current, "model_fields", {}))


def load_file(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    text = p.read_text()
    if p.suffix in (".yaml", ".yml"):
        import yaml  # transformers depends on PyYAML

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(f"config file {p}: invalid YAML at{where}: {problem}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config file {p}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping")
    return data


def _value(raw: str) -> Any:
    """JSON when it parses; a list or mapping written without quotes (``[tensorboard]``) as YAML reads it; else the string."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        pass
    if raw[:1] in "[{":
        import yaml

        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            return raw
        if isinstance(value, (list, dict)):
            return value
    return raw


def _deep_merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
