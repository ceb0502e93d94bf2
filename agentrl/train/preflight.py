"""Checks of a train or eval config that need the file system, the environment or the tokenizer,
run before any model loads so a mistake costs seconds, not a model load.

Every failure is a ``ConfigError`` with one line that names the key and the problem; the CLI
prints it without a traceback. Pure config checks (types, bounds, conflicting keys, known chat
format names) live on the pydantic models themselves; this module holds only what a model
validator cannot see.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from agentrl.core.strict import ConfigError

PROMPTS_CHECKED = 16  # the first tasks of the split whose prompts must fit rollout.max_context


def preflight_train(cfg: Any, env: Any = None, tokenizer: Any = None) -> Any:
    """Everything ``agentrl train`` (and ``Trainer``) can check before loading weights (``cfg``: a ``TrainConfig``).

    ``env``: an environment instance given to ``Trainer`` (else ``cfg.env`` is built); ``tokenizer``:
    the one given with a pre-loaded model (else ``model.path``'s is loaded to prove it). Returns the
    environment, so a caller that can take one need not build it twice.
    """
    from agentrl.generators.config import require_backend

    check_output_dir("output_dir", cfg.output_dir)
    check_resume(cfg.resume, cfg.output_dir)
    require_backend(cfg.generator)
    check_device("rollout_device", cfg.rollout_device)
    env = build_env(cfg.env, cfg.env_args) if env is None else env
    tasks = check_dataset(env, cfg.env, "train")
    if cfg.eval_every:
        check_dataset(env, cfg.env, "test")
    check_task_field("curriculum.key", cfg.curriculum.key, tasks)
    for i, reward in enumerate(cfg.extra_rewards):
        check_callable(f"extra_rewards[{i}].fn", reward.fn)
    if tokenizer is None:  # a tokenizer given with a pre-loaded model: no path to prove
        tokenizer = check_model(cfg.model.path)
    check_prompts_fit(env, tasks, tokenizer, cfg.model.chat_format, cfg.rollout.max_context)
    return env


def preflight_eval(cfg: Any) -> Any:
    """Everything ``agentrl eval`` can check before loading weights (``cfg``: an ``EvalConfig``); returns the environment."""
    from agentrl.generators.config import require_backend

    check_output_dir("output", cfg.output)
    require_backend(cfg.generator)
    env = build_env(cfg.env, cfg.env_args)
    tasks = check_dataset(env, cfg.env, cfg.split)
    check_rewards(env, tasks)
    tokenizer = check_model(cfg.model.path)
    check_prompts_fit(env, tasks, tokenizer, cfg.model.chat_format, cfg.rollout.max_context)
    return env


def check_output_dir(key: str, path: str | None) -> None:
    """The run/output folder must be a folder (or creatable): not a file, nor under one."""
    if path is None:
        return
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{key}={path}: exists and is not a folder")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{key}={path}: {parent} is a file, not a folder")
            if not os.access(parent, os.W_OK):
                raise ConfigError(f"{key}={path}: {parent} is not writable")
            break


def check_resume(resume: str | None, output_dir: str | None) -> None:
    """``resume=`` must name a checkpoint that exists (found now, not after the model loaded)."""
    if resume is None:
        return
    if resume == "latest" and output_dir is None:
        raise ConfigError("resume=latest needs output_dir=<the run folder to continue> (the default run folder is new each time)")
    from agentrl.train.checkpoint import resolve_resume

    try:
        resolve_resume(resume, Path(output_dir or "."))
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None


def build_env(spec: str, env_args: dict[str, Any]) -> Any:
    """The environment ``spec`` names, with any failure to import or construct it as one line."""
    from agentrl.env.registry import UnknownEnvironment, resolve

    try:
        factory = resolve(spec)
    except UnknownEnvironment as exc:  # kept as itself (a UserError): Python callers catch it by type
        raise type(exc)(f"env={spec}: {exc}") from None
    except SyntaxError as exc:
        raise ConfigError(f"env={spec}: syntax error in {exc.filename} line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:  # the module raised while importing
        raise ConfigError(f"env={spec}: importing it raised {_describe(exc)}") from None
    if not callable(factory):
        raise ConfigError(f"env={spec}: {type(factory).__name__} object is not an environment class or factory")
    try:
        env = factory(**env_args)
    except Exception as exc:
        raise ConfigError(f"env={spec}: constructing it with env_args={env_args} raised {_describe(exc)}") from None
    if not all(callable(getattr(env, name, None)) for name in ("reset", "step", "dataset")):
        raise ConfigError(f"env={spec}: built a {type(env).__name__}, which is not an Environment (needs reset, step and dataset)")
    return env


def check_dataset(env: Any, spec: str, split: str) -> list[Any]:
    """The first tasks of ``split``; an empty or unreadable split is an error here, not an IndexError later."""
    try:
        data = env.dataset(split)
        tasks = [data[i] for i in range(min(PROMPTS_CHECKED, len(data)))]
    except Exception as exc:
        raise ConfigError(f"env={spec}: reading its {split!r} split raised {_describe(exc)}") from None
    if not tasks:
        raise ConfigError(f"env={spec}: the {split!r} split has no tasks")
    return tasks


def check_task_field(key: str, field: str | None, tasks: list[Any]) -> None:
    """``field`` (e.g. ``curriculum.key``) must be a field of the tasks, found before the model loads."""
    if field is None or not tasks:
        return
    row = tasks[0]
    columns = sorted(row) if isinstance(row, dict) else []
    if field not in columns:
        raise ConfigError(f"{key}: the tasks have no field {field!r} (they have {columns})")


def check_rewards(env: Any, tasks: list[Any]) -> None:
    """Every reward's arguments, against an episode reset on the first task (``agentrl.env.reward_check``)."""
    import anyio

    from agentrl.env.reward_check import check_env_rewards

    if tasks and isinstance(tasks[0], dict):
        anyio.run(check_env_rewards, env, dict(tasks[0]))


def check_device(key: str, spec: str | None) -> None:
    """A device name such as ``cuda:1`` must parse and exist on this machine."""
    if spec is None:
        return
    import torch

    try:
        device = torch.device(spec)
    except Exception as exc:
        raise ConfigError(f"{key}={spec}: not a device name (e.g. cpu, cuda, cuda:1): {_describe(exc)}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if count == 0 or (device.index or 0) >= count:
            raise ConfigError(f"{key}={spec}: this machine has {count} CUDA device(s)")


def check_callable(key: str, target: str) -> None:
    from agentrl.env.registry import UnknownEnvironment, load_object

    try:
        obj = load_object(target)
    except UnknownEnvironment as exc:
        raise ConfigError(f"{key}={target}: {exc}") from None
    except Exception as exc:
        raise ConfigError(f"{key}={target}: importing it raised {_describe(exc)}") from None
    if not callable(obj):
        raise ConfigError(f"{key}={target}: {type(obj).__name__} object is not callable")


def check_model(spec: str) -> Any:
    """The tokenizer of ``model.path`` (cheap next to the weights): proves the path before the model loads."""
    from agentrl.compute.models import load_tokenizer, resolve_model

    path = resolve_model(spec)
    local = Path(path).expanduser()
    looks_local = local.exists() or path.startswith((".", "/", "~")) or path.count("/") > 1
    if looks_local and not local.is_dir():
        raise ConfigError(f"model.path={spec}: no such folder" if not local.exists() else f"model.path={spec}: is a file, not a model folder")
    if not looks_local and _hub_offline() and not _hub_cached(path):
        raise ConfigError(f"model.path={spec}: not a local folder, and not in the Hugging Face cache (the hub is offline)")
    try:
        return load_tokenizer(path)
    except Exception as exc:
        raise ConfigError(f"model.path={spec}: cannot load its tokenizer: {_describe(_root(exc))}") from None


def check_prompts_fit(env: Any, tasks: list[Any], tokenizer: Any, chat_format: str | None, max_context: int) -> None:
    """Every checked task's prompt must leave room for at least one sampled token."""
    import anyio

    from agentrl.chat import get_chat_format

    try:
        fmt = get_chat_format(tokenizer, chat_format)
    except Exception as exc:
        raise ConfigError(f"model.chat_format: {_describe(exc)}") from None
    longest = 0
    for i, task in enumerate(tasks):
        try:
            messages, _ = anyio.run(functools.partial(env.reset, task=task, seed=i))
        except Exception as exc:
            raise ConfigError(f"env: reset(task={i}) raised {_describe(exc)}") from None
        longest = max(longest, len(fmt.render(messages, env.tool_schemas() or None)))
    if longest >= max_context:
        raise ConfigError(
            f"rollout.max_context={max_context} leaves no room to generate: prompts are up to {longest} tokens; "
            f"set rollout.max_context above {longest}"
        )


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())  # one line
    if len(text) > 300:
        text = text[:300] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _root(exc: BaseException) -> BaseException:
    """The first exception of a chain (a hub error wrapped three times reads best at its source)."""
    seen = set()
    while (exc.__cause__ or exc.__context__) is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return exc


def _hub_offline() -> bool:
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except Exception:
        return False


def _hub_cached(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str) or isinstance(
            try_to_load_from_cache(repo_id, "tokenizer_config.json"), str
        )
    except Exception:
        return False
