"""`agentrl doctor`: real templates pass, deliberately broken ones fail with a token-level diff and exit 1."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from chat_fixtures import assets_dir, build_tiny_tokenizer, load_asset_tokenizer

from agentrl.chat import default_template
from agentrl.chat.parsers import HermesParser, registry
from agentrl.cli.main import main as cli
from agentrl.compute.models import bundled_model_path
from agentrl.doctor.diff import token_diff, value_differences
from agentrl.doctor.report import Report, write

GOOD = default_template()
# Each broken template is agentrl's own ChatML + tools template with one realistic mutation.
PY_REPR = GOOD.replace("{{- fn.arguments | tojson }}", "{{- fn.arguments }}")  # Python repr: True, single quotes
NO_EOT = GOOD.replace(
    "{%- endfor %}\n{{- '<|im_end|>\\n' }}\n{%- elif message.role == 'tool' %}",
    "{%- endfor %}\n{{- '\\n' }}\n{%- elif message.role == 'tool' %}",
)  # the assistant turn is never closed by <|im_end|>
STRIP_CALLS = GOOD.replace(
    "{%- elif message.role == 'assistant' %}", "{%- elif message.role == 'assistant' %}{%- set is_last = loop.last %}"
).replace("{%- for call in message.tool_calls or [] %}", "{%- for call in (message.tool_calls if is_last else []) or [] %}")
SINGLE_CALLS = GOOD.replace(
    "{%- elif message.role == 'assistant' %}",
    "{%- elif message.role == 'assistant' %}{%- if (message.tool_calls or []) | length > 1 %}"
    "{{- raise_exception('This model only supports single tool-calls at once!') }}{%- endif %}",
)  # as Llama 3.1's template does
# No tools section and no ChatML markers (so no format supplies a tools template for it).
NO_TOOLS = (
    "{%- for message in messages %}{{- '### ' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '### assistant\\n' }}{%- endif %}"
)


def doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli(["doctor", *args])
    out = capsys.readouterr()
    return code, out.out + out.err


def doctor_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code, out = doctor(capsys, *args, "--json")
    return code, json.loads(out)


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny real tokenizers saved to folders, one per template."""
    for name, template in [("py_repr", PY_REPR), ("no_eot", NO_EOT), ("strip_calls", STRIP_CALLS), ("single", SINGLE_CALLS)]:
        assert template != GOOD, f"the {name} mutation did not apply to chatml_tools.jinja"
    out = {}
    for name, template in [("good", GOOD), ("py_repr", PY_REPR), ("no_eot", NO_EOT), ("strip_calls", STRIP_CALLS), ("single", SINGLE_CALLS),
                           ("no_tools", NO_TOOLS)]:
        out[name] = tmp_path_factory.mktemp(name)
        build_tiny_tokenizer(out[name], template)
    return out


# ------------------------------------------------------------------ real templates
def test_qwen3_real_tokenizer_passes(capsys: pytest.CaptureFixture[str]) -> None:
    load_asset_tokenizer("qwen3")  # a clear message if the assets are missing
    code, out = doctor(capsys, f"model={assets_dir() / 'qwen3'}")
    assert code == 0, out
    assert "'qwen3', detected from render probes" in out
    for line in ["tool schemas in the prompt", "tool-call round trip", "end-of-turn token trained", "prefix: same, with reasoning"]:
        assert any(row.startswith("PASS") and line in row for row in out.splitlines()), (line, out)
    assert '"name": "search_flights"' in out  # the rendered system part is shown


def test_qwen3_original_template_warns_and_strict_fails(capsys: pytest.CaptureFixture[str]) -> None:
    """Qwen3's own template drops an empty <think> block from earlier turns: not provable without reasoning."""
    path = f"model={assets_dir() / 'qwen3'}"
    code, report = doctor_json(capsys, path, "training_template=false")
    checks = by_name(report)
    assert code == 0 and report["status"] == "WARN"
    loop = checks["prefix: assistant -> tool -> assistant"]
    assert loop["status"] == "WARN" and "prefix_splits" in loop["summary"]
    diff = loop["diffs"][0]
    row = next(r for r in diff["rows"] if r["i"] == diff["index"])
    assert row["expected"] == "<think>" and row["actual"] == "<tool_call>", diff
    assert checks["prefix: same, with reasoning"]["status"] == "PASS"
    code, _ = doctor(capsys, path, "training_template=false", "strict=true")
    assert code == 1


def test_smollm2_with_agentrl_tools_template(capsys: pytest.CaptureFixture[str]) -> None:
    load_asset_tokenizer("smollm2")
    code, report = doctor_json(capsys, f"model={assets_dir() / 'smollm2'}", "chat_template=agentrl")
    assert code == 0, report
    assert report["template"] == "override chat_template=agentrl's ChatML + tools template"
    assert by_name(report)["tool-call round trip"]["status"] == "PASS"


def test_bundled_model_generates_a_parseable_call(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = doctor_json(capsys, "model=default", "check_model=true", "env=calculator", "max_new_tokens=48")
    checks = by_name(report)
    assert code == 0, report
    assert checks["model matches tokenizer"]["status"] == "PASS"
    gen = checks["greedy generation parses"]
    assert gen["status"] == "PASS" and "calculator(" in " ".join(gen["details"]), gen


# ------------------------------------------------------------------ broken templates must fail
def test_python_repr_arguments_fail_round_trip(capsys: pytest.CaptureFixture[str], folders: dict[str, Path]) -> None:
    code, out = doctor(capsys, f"model={folders['py_repr']}")
    assert code == 1
    line = next(row for row in out.splitlines() if "tool-call round trip" in row)
    assert line.startswith("FAIL"), out
    assert "bad_json" in out and "'refundable': True" in out  # the issue and the text the parser saw
    assert "generated tokens around 'search_flights'" in out  # ids and pieces where it went wrong
    assert out.rstrip().splitlines()[-1].startswith("FAIL") and "exit code 1" in out


def test_missing_end_of_turn_fails_with_token_diff(capsys: pytest.CaptureFixture[str], folders: dict[str, Path]) -> None:
    code, report = doctor_json(capsys, f"model={folders['no_eot']}")
    assert code == 1 and report["exit_code"] == 1
    eot = by_name(report)["end-of-turn token trained"]
    assert eot["status"] == "FAIL" and "never trains the model to end its turn" in eot["details"][0]
    diff = eot["diffs"][0]
    row = next(r for r in diff["rows"] if r["i"] == diff["index"])
    assert row["expected"] == "<|im_end|>" and row["actual"] in ("\n", None), diff


def test_history_rewriting_template_warns_with_diff(capsys: pytest.CaptureFixture[str], folders: dict[str, Path]) -> None:
    code, out = doctor(capsys, f"model={folders['strip_calls']}")
    assert code == 0  # agentrl copes (counted splits); a warning does not fail the gate...
    assert "WARN  prefix: assistant -> tool -> assistant" in out and "first difference at token" in out
    assert "PASS  tool-call round trip" in out  # the final turn still renders its calls
    code, _ = doctor(capsys, f"model={folders['strip_calls']}", "--strict")
    assert code == 1  # ...unless strict


def test_template_without_tools_fails(capsys: pytest.CaptureFixture[str], folders: dict[str, Path]) -> None:
    code, report = doctor_json(capsys, f"model={folders['no_tools']}")
    checks = by_name(report)
    assert code == 1
    assert checks["chat format"]["status"] == "FAIL" and "chat_template=agentrl" in checks["chat format"]["details"][0]
    assert checks["tool schemas in the prompt"]["status"] == "FAIL" and "ignores tools" in checks["tool schemas in the prompt"]["summary"]
    assert checks["tool-call round trip"]["status"] == "SKIP"
    code, report = doctor_json(capsys, f"model={folders['no_tools']}", "chat_format=hermes")
    assert code == 1 and by_name(report)["tool-call round trip"]["status"] == "FAIL"


def test_parser_that_hides_problems_fails(
    capsys: pytest.CaptureFixture[str], folders: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parser that drops its issues would hand cut-off calls to the tools as if they were fine."""

    class Lenient(HermesParser):
        name = "lenient"

        @classmethod
        def matches(cls, probe: Any) -> bool:
            return False

        def parse(self, text: str) -> Any:
            result = super().parse(text)
            result.issues = []
            return result

    monkeypatch.setitem(registry._REGISTRY, "lenient", Lenient)
    code, report = doctor_json(capsys, f"model={folders['good']}", "chat_format=lenient")
    check = by_name(report)["malformed output reported"]
    assert code == 1 and check["status"] == "FAIL", check
    assert "call cut, then end of turn" in check["summary"] and "parsed without any issue" in " ".join(check["details"])
    code, report = doctor_json(capsys, f"model={folders['good']}", "chat_format=hermes")
    assert by_name(report)["malformed output reported"]["status"] == "PASS"


def test_parallel_calls_refused_or_split_are_warnings(capsys: pytest.CaptureFixture[str], folders: dict[str, Path]) -> None:
    """A template that refuses two calls (Llama 3.1), or one that stops generation after each call
    (GPT-OSS harmony's <|call|>), limits the environment, it does not corrupt training."""
    code, report = doctor_json(capsys, f"model={folders['single']}")
    check = by_name(report)["tool-call round trip"]
    assert code == 0 and check["status"] == "WARN", check
    assert "single tool-calls" in " ".join(check["details"]) and by_name(report)["prefix: assistant -> tool -> assistant"]["status"] == "PASS"
    load_asset_tokenizer("gpt_oss")
    code, report = doctor_json(capsys, f"model={assets_dir() / 'gpt_oss'}", "chat_format=gpt_oss")
    check = by_name(report)["tool-call round trip"]
    assert check["status"] == "WARN" and "generation ends after 1 of 2 calls" in " ".join(check["details"]), check


def test_good_tiny_template_passes(capsys: pytest.CaptureFixture[str], folders: dict[str, Path]) -> None:
    code, report = doctor_json(capsys, f"model={folders['good']}")
    assert code == 0 and report["status"] == "PASS", json.dumps(report, indent=1)[:3000]


# Every family with an offline tokenizer: (asset folder, extra args). Whatever each template's
# verdicts are, the doctor must run every check on it and use the format asked for.
FAMILY_RUNS = {
    "qwen3": ("qwen3", []), "qwen3_xml": ("qwen3", ["chat_format=qwen3_xml"]), "chatml_tools": ("smollm2", []),
    "llama3": ("llama3", []), "deepseek_v3": ("deepseek_v3", []), "gpt_oss": ("gpt_oss", ["chat_format=gpt_oss"]),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAMILY_RUNS))
def test_every_family_runs_every_check(capsys: pytest.CaptureFixture[str], name: str) -> None:
    asset, extra = FAMILY_RUNS[name]
    load_asset_tokenizer(asset)
    code, report = doctor_json(capsys, f"model={assets_dir() / asset}", *extra)
    checks = by_name(report)
    assert report["chat_format"] == name and checks["chat format"]["status"] == "PASS"
    assert len(checks) == 8 and all(c["status"] in ("PASS", "WARN", "FAIL", "SKIP") for c in checks.values())
    assert checks["tool schemas in the prompt"]["status"] == "PASS"
    assert code == (1 if report["status"] == "FAIL" else 0)


# ------------------------------------------------------------------ bad input, hub ids
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["model=/no/such/folder"], "no such folder"),
        (["model=default", "chek_model=true"], "did you mean check_model"),
        (["model=default", "chat_template=/no/such.jinja"], "no such file"),
        (["model=default", "chat_format=nope"], "nope"),
    ],
)
def test_bad_input(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, out = doctor(capsys, *args)
    if "chat_format" in args[-1]:  # an unknown format is a failed check, with the options listed
        assert code == 1 and "FAIL  chat format" in out and "hermes" in out and message in out
    else:
        assert code == 2 and message in out and len(out.strip().splitlines()) <= 2, out


def test_hub_id_from_the_local_cache_and_a_clear_offline_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub id found in the Hugging Face cache works offline; a missing one fails at once with one line."""
    from huggingface_hub import constants

    repo = tmp_path / "hub" / "models--acme--tiny-chat"
    (repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
    for f in bundled_model_path().iterdir():  # a real model repo: config, tokenizer, template, weights
        (repo / "snapshots" / ("0" * 40) / f.name).write_bytes(f.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on port 9
    code, out = doctor(capsys, "model=acme/tiny-chat", "check_model=true", "max_new_tokens=4")
    assert code == 0, out
    assert "agentrl doctor  model=acme/tiny-chat" in out and "PASS  tool-call round trip" in out
    assert "PASS  model matches tokenizer" in out  # the weights came from the cache too
    code, out = doctor(capsys, "model=acme/not-cached")
    assert code == 2
    assert "no tokenizer in the Hugging Face cache" in out and "cannot be reached" in out and "127.0.0.1" in out
    assert len(out.strip().splitlines()) == 1, out


# ------------------------------------------------------------------ pieces
def test_value_differences_keep_types() -> None:
    expected = {"a": 1, "b": 2.5, "c": True, "d": "1", "e": {"f": [1, None]}}
    assert value_differences(expected, json.loads(json.dumps(expected)), "args") == []
    got = {"a": 1.0, "b": "2.5", "c": 1, "d": 1, "e": {"f": [1]}, "x": 0}
    diffs = value_differences(expected, got, "args")
    assert diffs == [
        "args.x: unexpected int 0",
        "args.a: expected int 1, got float 1.0",
        "args.b: expected float 2.5, got string '2.5'",
        "args.c: expected bool True, got int 1",
        "args.d: expected string '1', got int 1",
        "args.e.f: expected 2 items, got 1: [1]",
    ]


def test_token_diff_marks_the_first_difference() -> None:
    diff = token_diff(lambda i: f"<{i}>", [1, 2, 3, 4], [1, 2, 9], "a", "b", context=1)
    assert diff is not None and diff.index == 2
    assert [(r["i"], r["expected_id"], r["actual_id"]) for r in diff.rows] == [(1, 2, 2), (2, 3, 9), (3, 4, None)]
    assert any(line.lstrip().startswith(">") and "'<3>'" in line and "'<9>'" in line for line in diff.lines())
    assert token_diff(str, [1, 2], [1, 2]) is None
    assert token_diff(str, [1, 2], [1, 2, 3]).index == 2  # a prefix differs at the shorter length


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_output_uses_rich() -> None:
    from agentrl.doctor.checks import FAIL, PASS, Check

    report = Report("m", "t", "hermes", "override", "tokenizer", "'<|im_end|>' (2)",
                    [Check("a", PASS, "fine"), Check("b", FAIL, "broken", ["why"])])  # fmt: skip
    stream = _Terminal()
    write(report, as_json=False, stream=stream)
    text = stream.getvalue()
    assert "\x1b[" in text and "broken" in text and "exit code 1" in text
    plain = io.StringIO()
    write(report, as_json=False, stream=plain)
    assert "\x1b[" not in plain.getvalue() and "FAIL  b  broken" in plain.getvalue()


# ------------------------------------------------------------------ TRL's vendored templates, as shipped
# The doctor's verdict on every tool-capable original template of TRL 1.16.0, on its family's
# tokenizer (tests/chat_fixtures.py). Each WARN names a limitation of the family (the format's
# declared limits, printed by the doctor); each FAIL is a template agentrl does not support, for the
# reason docs/chat_formats.md gives.
TRL_EXPECTED = {
    "qwen2_5": "PASS", "qwen3": "PASS", "qwen3_instruct_2507": "PASS", "qwen3_vl": "PASS", "qwen3_8": "PASS",
    "qwen3_5_think": "PASS", "qwen3_5_nothink": "PASS", "qwen3_6": "PASS", "deepseekv3": "PASS",
    "nemotron_3_nano": "PASS", "nemotron_3_super": "PASS", "nemotron_3_ultra": "PASS", "nemotron_3_5_lightning": "PASS",
    "lfm2_v2": "PASS", "lfm2_2_5": "PASS", "lfm2_2_5_v2": "PASS", "lfm2_2_5_vl": "PASS", "glm4moe": "PASS",
    "gemma4_v2": "PASS", "gemma4": "PASS", "gemma4_v3": "PASS", "gemma4_v4": "PASS", "gemma4_v5": "PASS",
    "llama3_1": "WARN", "llama3_2": "WARN", "gptoss": "WARN",
    "lfm2": "PASS", "muse_glimmer": "WARN", "diffusion_gemma": "WARN", "cohere2": "FAIL",
}  # fmt: skip
# Which checks warn, and the declared reason each prints.
TRL_WARNINGS = {
    "llama3_1": ({"tool-call round trip"}, "refuse more than one tool call"),
    "llama3_2": ({"tool-call round trip"}, "refuse more than one tool call"),
    "gptoss": ({"tool-call round trip", "prefix: assistant -> user -> assistant"}, "harmony ends"),
    "muse_glimmer": ({"tool-call round trip"}, "a turn with tool calls carries no text"),
    "diffusion_gemma": ({"prefix: assistant -> tool -> assistant", "prefix: same, with reasoning",
                         "prefix: assistant -> user -> assistant"}, "DiffusionGemma's template opens"),
}  # fmt: skip
# Why each unsupported template fails (a phrase of the doctor's report).
TRL_FAILURES = {
    "cohere2": "ignores tools=",
}  # fmt: skip


@pytest.fixture
def in_memory_tokenizers(monkeypatch: pytest.MonkeyPatch) -> None:
    """``model=<template name>`` loads that template on its family's tokenizer, in memory: loading
    Gemma's 262k-token tokenizer from a folder per template would take minutes (the folder path is
    tested below on a few templates)."""
    from chat_fixtures import trl_template, trl_tokenizer

    import agentrl.doctor as doctor_module

    def load(spec: str) -> Any:
        tok = trl_tokenizer(spec)
        tok.chat_template = trl_template(spec)
        return tok

    monkeypatch.setattr(doctor_module, "load_tokenizer", load)


@pytest.mark.parametrize("name", sorted(TRL_EXPECTED))
def test_trl_template_as_shipped(capsys: pytest.CaptureFixture[str], in_memory_tokenizers: None, name: str) -> None:
    code, report = doctor_json(capsys, f"model={name}")
    lines = [f"{c['status']} {c['name']}: {c['summary']}" for c in report["checks"]]
    assert report["status"] == TRL_EXPECTED[name], lines
    assert code == (1 if report["status"] == "FAIL" else 0)
    warned = {c["name"] for c in report["checks"] if c["status"] == "WARN"}
    checks, reason = TRL_WARNINGS.get(name, (set(), ""))
    assert warned == checks or name in TRL_FAILURES, lines
    for c in report["checks"]:
        if c["status"] == "WARN" and name not in TRL_FAILURES:
            assert "Declared limitation of the" in c["summary"] and reason in c["summary"], c["summary"]
    if name in TRL_FAILURES:
        assert any(TRL_FAILURES[name] in line for line in lines), lines


@pytest.mark.parametrize("name", ["gptoss", "lfm2_2_5", "glm4moe"])
def test_trl_template_from_a_checkpoint_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str) -> None:
    """The same verdict when the template ships as a checkpoint's chat_template.jinja."""
    from chat_fixtures import trl_tokenizer_folder

    trl_tokenizer_folder(name, tmp_path / name)
    code, report = doctor_json(capsys, f"model={tmp_path / name}")
    assert report["status"] == TRL_EXPECTED[name] and code == 0
    assert report["template"].startswith("training template derived from the tokenizer's")


def test_every_trl_template_gets_a_report(capsys: pytest.CaptureFixture[str], in_memory_tokenizers: None) -> None:
    """No template of the set makes the doctor raise: each gives a JSON report and exit 0 or 1, and
    every template not in the table above either renders no tools or passes with a supplied template."""
    from chat_fixtures import trl_original_templates

    names = trl_original_templates()
    assert len(names) >= 40 and set(TRL_EXPECTED) <= set(names)
    for name in names:
        if name in TRL_EXPECTED:
            continue  # checked one by one above
        code, report = doctor_json(capsys, f"model={name}")
        assert code == (1 if report["status"] == "FAIL" else 0), (name, report["status"])
        checks = by_name(report)
        if report["status"] == "FAIL":  # not tool-capable as shipped
            assert checks["tool schemas in the prompt"]["status"] == "FAIL", name
        else:  # a template without tools that the family's format replaces (Llama 3, DeepSeek R1, Qwen2.5-VL)
            assert report["status"] == "PASS" and report["template"].startswith("agentrl "), (name, report["template"])


RAISES = GOOD.replace("{%- for message in messages %}", "{{- raise_exception('this template always raises') }}{%- for message in messages %}", 1)


def test_template_that_raises_is_a_fail_line_not_a_crash(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert RAISES != GOOD
    build_tiny_tokenizer(tmp_path / "raises", RAISES)
    code, report = doctor_json(capsys, f"model={tmp_path / 'raises'}")
    assert code == 1 and report["status"] == "FAIL"
    assert any("this template always raises" in c["summary"] + " ".join(c["details"]) for c in report["checks"]), report
    code, out = doctor(capsys, f"model={tmp_path / 'raises'}")
    assert code == 1 and "Traceback" not in out and out.rstrip().splitlines()[-1].startswith("FAIL")


def test_tokenizer_without_a_template_is_a_fail_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    tok = build_tiny_tokenizer(tmp_path / "none")
    tok.chat_template = None
    tok.save_pretrained(tmp_path / "none")
    (tmp_path / "none" / "chat_template.jinja").unlink(missing_ok=True)
    code, report = doctor_json(capsys, f"model={tmp_path / 'none'}")
    assert code == 1 and by_name(report)["chat format"]["status"] == "FAIL"
    assert "no chat template" in " ".join(by_name(report)["chat format"]["details"])


def test_bad_input_still_writes_a_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = doctor_json(capsys, "model=/no/such/folder")
    assert code == 2 and report["exit_code"] == 2 and report["status"] == "FAIL"
    assert "no such folder" in report["checks"][0]["summary"]
