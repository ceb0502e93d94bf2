"""The ``agentrl`` command: ``train``, ``eval``, ``envs``, ``check``, ``doctor``, ``view``, ``vllm-serve``.

Arguments are ``key=value`` overrides of a strict pydantic config (``agentrl eval env=calculator
model=default n=100 k=4 sampling.temperature=0.7``); ``config=file.yaml`` loads a file first.
Errors in user input print one clear line and exit with status 2.
"""

from __future__ import annotations

import datetime as dt
import sys
from typing import Any

from agentrl.core.errors import UserError

# name -> (one-line summary, "module:function(args) -> int", "module:ConfigModel" listed by --help or None)
COMMANDS: dict[str, tuple[str, str, str | None]] = {
    "train": ("train a model on an environment with GRPO (agentrl train env=calculator)", "agentrl.cli.main:cmd_train", "agentrl.train.config:TrainConfig"),
    "eval": ("evaluate a model on an environment (pass@k, results.jsonl, summary.json)", "agentrl.cli.main:cmd_eval", "agentrl.rollout.config:EvalConfig"),
    "envs": ("list the environments make() knows", "agentrl.cli.main:cmd_envs", None),
    "check": ("run check_env on an environment: agentrl check env=<name|module:Class|file.py:Class>", "agentrl.cli.main:cmd_check", "agentrl.env.config:CheckConfig"),
    "doctor": ("check a tokenizer's chat template for tool calling and token fidelity (agentrl doctor model=...)", "agentrl.doctor:main", "agentrl.doctor:DoctorConfig"),
    "view": ("write an HTML page of a run's or an eval's trajectories (agentrl view <run folder|results.jsonl>)", "agentrl.cli.view:main", None),
    "vllm-serve": ("start a vLLM generation server for training (agentrl vllm-serve model=...)", "agentrl.generators.vllm.serve:main", "agentrl.generators.vllm.serve:ServeConfig"),
}
HELP_FLAGS = ("-h", "--help", "help")
USAGE = "usage: agentrl <command> [key=value ...] [--debug]\n\ncommands:\n" + "\n".join(
    f"  {name:<11} {summary}" for name, (summary, _, _) in COMMANDS.items()
) + "\n\nagentrl <command> --help lists the command's keys. --debug shows the traceback of an error.\n"


def main(argv: list[str] | None = None) -> int:
    """Run one command. A mistake in the input is one line on stderr and exit status 2; any other
    failure is one line and status 1; ``--debug`` re-raises it with its traceback instead."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if not argv or argv[0] in HELP_FLAGS:
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(command, list(COMMANDS), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        print(f"agentrl: unknown command {command!r}{hint}; agentrl --help lists the commands", file=sys.stderr)
        return 2
    if any(a in HELP_FLAGS for a in rest) and command != "view":  # view prints its own usage
        try:
            print(command_help(command, [a for a in rest if a not in HELP_FLAGS]))
        except BrokenPipeError:  # agentrl train --help | head
            pass
        except UserError as exc:  # the keys given with --help do not validate
            print(f"agentrl {command}: {_one_line(str(exc))}", file=sys.stderr)
            return 2
        return 0

    try:
        code = _load(COMMANDS[command][1])(rest)
    except KeyboardInterrupt:
        print(f"agentrl {command}: interrupted", file=sys.stderr)
        code = 130
    except Exception as exc:
        if debug:
            raise
        user_error = isinstance(exc, (UserError, FileNotFoundError))
        what = str(exc) if user_error else f"{type(exc).__name__}: {exc}"
        print(f"agentrl {command}: {_one_line(what)}" + ("" if user_error else " (--debug shows the traceback)"), file=sys.stderr)
        code = 2 if user_error else 1
    if "torch" in sys.modules:  # a launched multi-process run leaves its process group here (never returns then)
        from agentrl.compute.parallel.distributed import leave_process_group
        from agentrl.compute.parallel.layout import leave_job

        leave_process_group(code)
        leave_job(code)  # a disaggregated job's ranks outside a trainer group of two or more
    return code


def command_help(command: str, keys: list[str] | None = None) -> str:
    """``agentrl <command> --help``: the summary and every key, generated from the command's config model.

    With ``keys`` (``agentrl train env=math_python --help``), the defaults shown are what a run with
    those keys would use: the environment's ``train_defaults`` and the keys themselves applied.
    """
    from agentrl.cli.help import format_help
    from agentrl.core.overrides import SHORTCUTS, build, parse_overrides

    summary, _, model = COMMANDS[command]
    usage = f"usage: agentrl {command} [key=value ...]\n\n{summary}"
    shortcuts = SHORTCUTS if command in ("train", "eval") else None
    config_model = _load(model) if model else None
    used = None
    if config_model is not None and keys:
        used = build(config_model, parse_overrides(keys, shortcuts={} if shortcuts is None else None))
        usage += f"\n\ndefaults below: what a run with {' '.join(keys)} uses"
    return format_help(usage, config_model, shortcuts, defaults=used)


def _load(target: str) -> Any:
    import importlib

    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 1000 else text[:1000] + "..."


def cmd_train(args: list[str]) -> int:
    """``Trainer`` with the command line's keys: the same thing ``Trainer(**keys).train()`` does."""
    from agentrl.compute.parallel.distributed import DistributedError
    from agentrl.compute.parallel.fsdp import ShardingError
    from agentrl.core.overrides import build, parse_overrides
    from agentrl.learn.batch import EmptyBatchError
    from agentrl.rollout.ahead import RolloutAheadError
    from agentrl.train.config import TrainConfig
    from agentrl.train.disaggregated import serve_if_generator
    from agentrl.train.preflight import preflight_train
    from agentrl.train.resume_config import resume_overrides
    from agentrl.train.trainer import Trainer

    try:
        cfg = build(TrainConfig, resume_overrides(parse_overrides(args)))  # resume=: the saved config, checked
        if cfg.distributed.generator_ranks:
            preflight_train(cfg)
            if serve_if_generator(cfg):  # this rank generates until the trainers stop
                return 0
        trainer = Trainer(cfg)  # runs preflight_train first, as it does for Python callers
        trainer.train()
    except (EmptyBatchError, DistributedError, RolloutAheadError, ShardingError) as exc:  # every episode failed / a peer rank died / ...: the cause, in one line
        print(f"agentrl train: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a second Ctrl-C: the step was abandoned
        print("agentrl train: interrupted; no checkpoint written for the unfinished step (the last saved one is kept)", file=sys.stderr)
        return 130
    if trainer.interrupted:
        return 130
    if not trainer.is_main:  # data parallel: rank 0 reports
        return 0
    history = [h for h in trainer.history if "reward/mean" in h]  # not the step-0 eval record of eval_every
    print(reward_summary(history), end="")
    print(f"run folder: {trainer.run_dir} (metrics.jsonl, samples.jsonl, reward_curve.png, checkpoints/)")
    return 0


def cmd_envs(args: list[str]) -> int:
    from agentrl.env.registry import registered

    for name in registered():
        print(name)
    return 0


def cmd_check(args: list[str]) -> int:
    from agentrl.core.overrides import build, parse_overrides
    from agentrl.env.check import EnvCheckError, check_env
    from agentrl.env.config import CheckConfig
    from agentrl.train.preflight import build_env

    cfg = build(CheckConfig, parse_overrides(args, shortcuts={}))
    try:
        check_env(build_env(cfg.env, cfg.env_args))
    except EnvCheckError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    print(f"{cfg.env}: ok")
    return 0


def cmd_eval(args: list[str]) -> int:
    from agentrl.core.overrides import build, parse_overrides
    from agentrl.generators import run_with
    from agentrl.rollout.config import EvalConfig
    from agentrl.rollout.engine import RolloutEngine
    from agentrl.rollout.evaluation import evaluate, format_summary, summarize, write_results
    from agentrl.train.preflight import preflight_eval

    cfg = build(EvalConfig, parse_overrides(args))
    env = preflight_eval(cfg)
    tasks = list(env.dataset(cfg.split))
    if cfg.n is not None:
        tasks = tasks[: cfg.n]
    generator, chat_format = load_generation(cfg.model, cfg.generator)
    engine = RolloutEngine(generator, chat_format, cfg.rollout, cfg.sampling)

    total = len(tasks) * cfg.k
    with progress_bar(f"eval {cfg.env}", total) as advance:

        async def run() -> Any:
            try:
                return await evaluate(engine, env, tasks, cfg.k, cfg.seed, on_episode=lambda _t: advance())
            finally:
                await generator.close()

        generator.begin_rollout()
        groups, elapsed = run_with(generator, run)
    summary = summarize(groups, cfg.k, cfg.pass_threshold, elapsed)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = write_results(cfg.output or f"outputs/eval-{cfg.env.replace('/', '_').replace(':', '_')}-{stamp}", groups, summary, cfg.model_dump())
    print(f"agentrl eval  env={cfg.env}  model={cfg.model.path}  split={cfg.split}")
    print(format_summary(summary))
    print(f"wrote {out / 'results.jsonl'} and {out / 'summary.json'}")
    return 0


def load_generation(model_cfg: Any, gen_cfg: Any) -> tuple[Any, Any]:
    """Tokenizer, chat format and the configured generator (``generator.backend``) for a model config."""
    import torch

    from agentrl.chat import get_chat_format
    from agentrl.compute.adapters import fold_adapters
    from agentrl.compute.models import load_model, load_tokenizer, pad_token_id
    from agentrl.generators import build_generator
    from agentrl.generators.config import require_backend

    require_backend(gen_cfg)
    tokenizer = load_tokenizer(model_cfg.path)
    chat_format = get_chat_format(tokenizer, model_cfg.chat_format)
    pad = pad_token_id(tokenizer, chat_format.stop_token_ids)
    model = None
    if gen_cfg.decodes_the_policy:  # the vLLM backends load the checkpoint themselves
        dtype = None if model_cfg.dtype == "auto" else getattr(torch, model_cfg.dtype)
        model = load_model(model_cfg.path, dtype=dtype, device=model_cfg.device)
        fold_adapters(model)  # an adapter checkpoint is only decoded here: merged, it costs nothing per token
    generator = build_generator(gen_cfg, model_path=model_cfg.path, pad_token_id=pad, max_context=None, model=model)
    return generator, chat_format


class progress_bar:
    """A rich progress bar when the output is a terminal, a quiet counter otherwise."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total = label, total
        self._progress: Any = None

    def __enter__(self) -> Any:
        if sys.stderr.isatty():
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(), transient=True
            )
            self._progress.start()
            task = self._progress.add_task(self.label, total=self.total)
            return lambda: self._progress.advance(task)
        return lambda: None

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()


if __name__ == "__main__":
    raise SystemExit(main())


def reward_summary(history: list[dict[str, Any]]) -> str:
    """The run's reward in one line: the first and last steps' means (at most 5 each, never
    overlapping), and the first and last step by number (a resumed run starts past step 1)."""
    if not history:
        return ""
    first, last = history[0], history[-1]
    if len(history) == 1:
        return f"reward: {first['reward/mean']:.3f} (step {first['step']})\n"
    k = max(1, min(5, len(history) // 2))
    head = sum(h["reward/mean"] for h in history[:k]) / k
    tail = sum(h["reward/mean"] for h in history[-k:]) / k
    return (f"reward: first {k} steps {head:.3f} -> last {k} steps {tail:.3f} "
            f"(step {first['step']}: {first['reward/mean']:.3f}, step {last['step']}: {last['reward/mean']:.3f})\n")  # fmt: skip
