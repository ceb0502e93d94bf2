"""``agentrl doctor model=<path|hub id>``: is this tokenizer's chat template safe to train tool use on?

It answers, from renders in token space, the questions that decide whether a multi-turn RL run
trains what inference sees: which chat format is detected (and how), whether tool schemas reach
the prompt, whether tool calls survive render -> parse with their argument types, whether the
template keeps history stable across assistant -> tool -> assistant turns (with and without
reasoning), whether the end-of-turn token is trained, and optionally whether the model itself
stops and writes parseable calls. Non-zero exit on failure, so it can gate a run. See docs/doctor.md.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field

import agentrl.doctor.checks as C
import agentrl.doctor.material as M
from agentrl.core.overrides import build, parse_overrides
from agentrl.core.strict import Strict
from agentrl.doctor.loading import DoctorError, load_tokenizer
from agentrl.doctor.report import Report, write

__all__ = ["DoctorConfig", "DoctorError", "diagnose", "load_tokenizer", "main"]


class DoctorConfig(Strict):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    model: str = Field("default", description="'default' (bundled), a local folder or a hub id (cached when offline)")
    chat_format: str | None = Field(None, description="override detection (see agentrl.chat.available_formats())")
    chat_template: str | None = Field(None, description="a .jinja file, or 'agentrl' for agentrl's ChatML + tools template")
    training_template: bool = Field(True, description="allow a format's verified training template, as training does")
    check_model: bool = Field(False, description="also load the model: vocabulary size and one greedy turn")
    env: str | None = Field(None, description="with check_model: generate from this environment's first test task")
    max_new_tokens: int = Field(128, ge=1, description="with check_model: the greedy turn's token budget (not stopping within it is reported)")
    device: str | None = Field(None, description="with check_model: where to load the model (cpu, cuda, cuda:1 ...; None: cuda when available)")
    strict: bool = Field(False, description="warnings fail too (exit 1)")
    as_json: bool = Field(False, alias="json", description="machine-readable output")


def main(args: list[str]) -> int:
    """``agentrl doctor``: print the report, return its exit code (2 for bad input, via DoctorError)."""
    args = ["json=true" if a == "--json" else "strict=true" if a == "--strict" else a for a in args]
    cfg = build(DoctorConfig, parse_overrides(args, shortcuts={}))
    try:
        report = diagnose(cfg)
    except DoctorError as exc:
        if not cfg.as_json:
            raise  # the CLI prints its one line and exits 2
        report = _bad_input_report(cfg, exc)
    write(report, cfg.as_json)
    return report.exit_code


def _bad_input_report(cfg: DoctorConfig, exc: DoctorError) -> Report:
    """With json=true, bad input still gives a JSON report (status FAIL, exit code 2)."""
    report = Report(
        model=cfg.model, tokenizer="(not loaded)", chat_format=None, how="(bad input)", template="(unknown)",
        end_of_turn="(unknown)", checks=[C.Check("input", C.FAIL, str(exc))], strict=cfg.strict,
    )  # fmt: skip
    report.bad_input = True
    return report


def _guarded(name: str, run: Any, *args: Any) -> C.Check:
    """``run(*args)``; an exception (a template that raises where no check expected it, a bug)
    becomes a FAIL line naming it, so the doctor always finishes its report."""
    try:
        return run(*args)
    except Exception as exc:
        cause = f"{type(exc).__name__}: {exc}".strip()
        return C.Check(name, C.FAIL, f"the check could not run: {C.short(cause, 300)}", [C.short(cause, 2000)])


def diagnose(cfg: DoctorConfig) -> Report:
    """Run every check for ``cfg`` and collect them in a :class:`Report`."""
    tokenizer = load_tokenizer(cfg.model)
    template = _template_override(cfg.chat_template)
    try:
        fmt, format_check, how = _chat_format(tokenizer, cfg, template)
    except Exception as exc:  # a template that raises while the format is chosen
        fmt, how = None, "failed"
        format_check = _guarded("chat format", _raise, exc)
    report = Report(
        model=cfg.model,
        tokenizer=f"{type(tokenizer).__name__}, {len(tokenizer)} tokens, from {_where(tokenizer, cfg.model)}",
        chat_format=getattr(fmt, "name", None),
        how=how,
        template=_template_source(fmt, cfg, template),
        end_of_turn=C.show_ids(tokenizer, fmt.eot_token_ids) if fmt is not None else "(unknown: no chat format)",
        checks=[format_check],
        strict=cfg.strict,
    )
    report.checks.append(_guarded("tool schemas in the prompt", C.check_tool_schemas, tokenizer, template, fmt))
    names = ["tool-call round trip", "malformed output reported", "end-of-turn token trained", *_PREFIX_CHECKS]
    if fmt is None:
        report.checks += [C.Check(n, C.SKIP, "no chat format") for n in names]
        if cfg.check_model:
            report.checks.append(C.Check("greedy generation parses", C.SKIP, "no chat format"))
        return report
    renders, reads = C.renders_reasoning(fmt), C.reads_reasoning(fmt)
    off_by_default = renders and reads and C.thinking_off_by_default(fmt)
    thinking = renders and reads and not off_by_default
    report.checks += [
        _guarded("tool-call round trip", C.check_round_trip, fmt, thinking),
        _guarded("malformed output reported", C.check_malformed, fmt),
        _guarded("end-of-turn token trained", C.check_end_of_turn, fmt),
    ]
    for name, (rounds, with_reasoning) in _PREFIX_CHECKS.items():
        if with_reasoning is True and not thinking and not renders and reads and C.renders_call_reasoning(fmt):
            report.checks.append(C.Check(name, C.SKIP, (
                "the template renders reasoning_content on a turn with calls but drops a final answer's own, so an "
                "answer trained with reasoning is not what a render shows (Kimi K2 Thinking: where the format's "
                "training derivation applies, the template it derives keeps it)"
            )))  # fmt: skip
        elif with_reasoning is True and not thinking:
            why = (
                "the template's generation prompt closes the reasoning block (thinking is off by default)" if off_by_default
                else f"the {fmt.name!r} format does not parse reasoning back" if renders
                else "the template does not render reasoning_content"
            )  # fmt: skip
            report.checks.append(C.Check(name, C.SKIP, why))
        else:
            episode = _guarded(name, rounds, thinking if with_reasoning is None else with_reasoning)
            if isinstance(episode, C.Check):  # building the episode failed
                report.checks.append(episode)
            else:
                report.checks.append(_guarded(name, C.check_prefix, fmt, name, episode))
    _declare_limits(fmt, report.checks)
    if cfg.check_model:
        try:
            report.checks += _model_checks(fmt, cfg)
        except Exception as exc:
            report.checks.append(_guarded("greedy generation parses", _raise, exc))
    return report


# Which kind of a family's known limitations (FormatSpec.limits) explains a warning of which check.
_LIMIT_OF_CHECK = {
    "tool-call round trip": ("parallel_calls", "text_beside_calls"),
    "prefix: assistant -> tool -> assistant": ("tool_result",),
    "prefix: same, with reasoning": ("tool_result",),
    "prefix: assistant -> user -> assistant": ("new_question",),
}


def _declare_limits(fmt: Any, checks: list[C.Check]) -> None:
    """A warning the chat format declares as a limitation of its family says so, with the reason."""
    from agentrl.chat import format_spec

    try:
        limits = format_spec(fmt.name).limits
    except ValueError:  # a hand-built ChatFormat under a name no registry knows
        return
    for check in checks:
        reasons = [limits[k] for k in _LIMIT_OF_CHECK.get(check.name, ()) if k in limits]
        if check.status == C.WARN and reasons:
            check.summary += f". Declared limitation of the {fmt.name!r} family: {'; '.join(reasons)}"


def _raise(exc: Exception) -> Any:
    raise exc


# name -> (episode, with reasoning: False, True, or None = when the template renders it)
_PREFIX_CHECKS: dict[str, tuple[Any, bool | None]] = {
    "prefix: assistant -> tool -> assistant": (M.tool_loop, False),
    "prefix: same, with reasoning": (M.tool_loop, True),
    "prefix: assistant -> user -> assistant": (M.user_turn, None),
}


def _model_checks(fmt: Any, cfg: DoctorConfig) -> list[C.Check]:
    from agentrl.doctor.model_check import check_generation, check_vocab, load_for_check

    model, failed = load_for_check(cfg.model, cfg.device)
    if failed is not None:
        return [failed]
    vocab = check_vocab(model, fmt.tokenizer)
    if vocab.status == C.FAIL:
        return [vocab, C.Check("greedy generation parses", C.SKIP, "the model does not fit the tokenizer")]
    return [vocab, check_generation(fmt, model, cfg.env, cfg.max_new_tokens)]


# ----------------------------------------------------------------------------- chat format
def _chat_format(tokenizer: Any, cfg: DoctorConfig, template: str | None) -> tuple[Any, C.Check, str]:
    """The ChatFormat to check, the check line saying which one, and how it was chosen."""
    from agentrl.chat import available_formats, detect_format, get_chat_format

    name = "chat format"
    options = f"chat_format= one of {available_formats()}"
    chosen = cfg.chat_format
    if chosen is not None:
        how = f"override chat_format={chosen}"
    else:
        try:
            chosen = detect_format(tokenizer, template)
        except ValueError as exc:
            hint = "" if template else "; or chat_template=agentrl for agentrl's ChatML + tools template"
            return None, C.Check(name, C.FAIL, "not detected from the template's renders", [f"pass {options}{hint}", str(exc)]), "detection failed"
        how = "detected from render probes"
    chat_log = logging.getLogger("agentrl.chat")
    level = chat_log.level
    chat_log.setLevel(logging.ERROR)  # its template-choice warning is the report's "template:" line
    try:
        fmt = get_chat_format(tokenizer, chosen, template, training_template=cfg.training_template)
    except (ValueError, KeyError) as exc:
        return None, C.Check(name, C.FAIL, f"{exc}", [f"pass {options}"]), how
    finally:
        chat_log.setLevel(level)
    return fmt, C.Check(name, C.PASS, f"{fmt.name!r}, {how}"), how


def _template_override(spec: str | None) -> str | None:
    if spec is None:
        return None
    if spec == "agentrl":
        from agentrl.chat import default_template

        return default_template()
    path = Path(spec).expanduser()
    if not path.is_file():
        raise DoctorError(f"chat_template={spec}: no such file (give a .jinja file, or 'agentrl' for agentrl's ChatML + tools template)")
    return path.read_text(encoding="utf-8")


def _template_source(fmt: Any, cfg: DoctorConfig, template: str | None) -> str:
    if cfg.chat_template is not None:
        label = "agentrl's ChatML + tools template" if cfg.chat_template == "agentrl" else cfg.chat_template
        return f"override chat_template={label}"
    source = getattr(fmt, "template_source", None)
    return str(source) if source else "the tokenizer's chat template"


def _where(tokenizer: Any, spec: str) -> str:
    path = getattr(tokenizer, "name_or_path", "") or spec
    return path if os.path.isabs(path) or spec != path else spec


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
