"""Hostile model output: parsing never raises, stays bounded, and the results file is always written.

Issue 17: one deeply nested tool call made ``Trajectory.to_dict`` raise RecursionError and lost
results.jsonl; deep JSON escaped ``parse``; a million unclosed openers made parsing quadratic. Each
format gets 10,000 generated hostile outputs through its parser and the trajectory writer here
(seconds); a slow-marked soak runs 100,000. Every worst case of benchmarks/parse_worst_case.py runs
at 1 MB for every parser, held to linear growth from 100 KB (issue 43); the parse times themselves
are a benchmark (benchmarks/parse_worst_case.py, RESULTS.md), not a timed test.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from chat_fixtures import build_tiny_tokenizer

from agentrl.chat import ChatFormat, ParsedResponse, available_parsers, get_chat_format, get_parser
from agentrl.chat.fuzz import hostile_outputs, worst_cases
from agentrl.chat.parsers.base import MAX_CALLS
from agentrl.chat.parsers.calls import MAX_DEPTH
from agentrl.core.trajectory import Sample, Trajectory, Turn, read_jsonl, write_jsonl

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "a": {"type": "integer"}, "s": {"type": "string"}}}}}]  # fmt: skip


def check(result: Any) -> None:
    """What every parse result must be, whatever the input."""
    assert isinstance(result, ParsedResponse)
    assert isinstance(result.content, str)
    assert result.reasoning is None or isinstance(result.reasoning, str)
    assert len(result.tool_calls) <= MAX_CALLS
    for call in result.tool_calls:
        assert isinstance(call.name, str) and call.name
        assert call.arguments is None or isinstance(call.arguments, dict)
    for issue in result.issues:
        assert isinstance(issue.kind, str) and isinstance(issue.detail, str)


def fuzz_format(name: str, count: int, tmp_path: Path, seed: int = 0, max_pieces: int = 24) -> None:
    parser = get_parser(name)
    turns: list[Turn] = []
    for k, text in enumerate(hostile_outputs(name, count, seed=seed, max_pieces=max_pieces)):
        result = parser.parse_with_tools(text, TOOLS) if k % 2 else parser.parse(text)
        check(result)
        message = result.to_message()
        json.dumps(message)  # what the engine hands to templates and the writer must be plain JSON
        turns.append(Turn(k, message, 1, "stop", parse_issues=[{"kind": i.kind, "detail": i.detail} for i in result.issues]))
    trajectories = [
        Trajectory(task={"i": i}, seed=i, samples=[Sample([1], [2], [1], [0.0])], turns=turns[i : i + 200],
                   messages=[t.message for t in turns[i : i + 200]])  # fmt: skip
        for i in range(0, len(turns), 200)
    ]
    path = tmp_path / f"{name}.jsonl"
    write_jsonl(trajectories, path)
    back = read_jsonl(path)
    assert sum(len(t.turns) for t in back) == count


@pytest.mark.parametrize("name", available_parsers())
def test_ten_thousand_hostile_outputs_per_format(name: str, tmp_path: Path) -> None:
    fuzz_format(name, 10_000, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", available_parsers())
def test_soak_hundred_thousand_hostile_outputs(name: str, tmp_path: Path) -> None:
    fuzz_format(name, 100_000, tmp_path, seed=1, max_pieces=60)


def _cpu_seconds(parser: Any, text: str, runs: int = 1) -> tuple[float, ParsedResponse]:
    """The lowest CPU time of ``runs`` parses (process time: another job's load does not count)."""
    best, result = float("inf"), None
    for _ in range(runs):
        t0 = time.process_time()
        result = parser.parse_with_tools(text, TOOLS)
        best = min(best, time.process_time() - t0)
    return best, result  # type: ignore[return-value]


@pytest.mark.parametrize("name", available_parsers())
def test_megabyte_worst_cases_stay_linear(name: str) -> None:
    """Every worst case of benchmarks/parse_worst_case.py at 1 MB, for every parser (issue 43, item 5).

    Not a speed number (benchmarks/RESULTS.md has those): each case at 1 MB must cost at most 30x
    its CPU time at 100 KB, plus 0.1 s. Linear parsing is ~10x; a parser that turns quadratic is
    ~100x and fails here on any machine. Every result is also checked and JSON-serialised."""
    slow = superlinear_cases(get_parser(name), name)
    assert not slow, f"{name}: superlinear at 1 MB (CPU s at 100 KB, 1 MB): {slow}"


def superlinear_cases(
    parser: Any, name: str, only: set[str] | None = None, sizes: tuple[int, int] = (100_000, 1_000_000), slack: float = 0.1
) -> dict[str, tuple[float, float]]:
    """The worst cases (``only`` those, if given) whose CPU time grew more than 30x (+``slack`` s) between ``sizes``.

    A case that parses within ``slack`` at the large size passes without the small one (it cannot
    exceed the bound), so the whole check costs about one parse per case."""
    big = worst_cases(name, sizes[1])
    small: dict[str, str] = {}
    slow = {}
    for case, text in big.items():
        if only is not None and case not in only:
            continue
        t_big, result = _cpu_seconds(parser, text)
        check(result)
        json.dumps(result.to_message())
        if t_big <= slack:
            continue
        small = small or worst_cases(name, sizes[0])
        t_small, _ = _cpu_seconds(parser, small[case], runs=2)
        t_big = min(t_big, _cpu_seconds(parser, text)[0])
        if t_big > 30 * t_small + slack:
            slow[case] = (round(t_small, 4), round(t_big, 4))
    return slow


class _QuadraticParser:
    """A parser that copies its prefix every 50 characters: what the check above must catch."""

    def __init__(self) -> None:
        self.inner = get_parser("hermes")

    def parse_with_tools(self, text: str, tools: Any) -> ParsedResponse:
        sum(text[:i].count("<") for i in range(0, len(text), 50))
        return self.inner.parse_with_tools(text, tools)


def test_the_linearity_check_catches_a_quadratic_parser() -> None:
    """The same check, at 20 KB against 200 KB (to stay quick), on a quadratic parser: it must fail."""
    cases = {"deep [", "one long string"}
    assert set(superlinear_cases(_QuadraticParser(), "hermes", only=cases, sizes=(20_000, 200_000), slack=0.0)) == cases
    assert not superlinear_cases(get_parser("hermes"), "hermes", only=cases, sizes=(20_000, 200_000), slack=0.005)


def test_fuzz_outputs_really_are_hostile() -> None:
    """The generator must reach the deep-nesting and many-tags paths, or the fuzz proves little."""
    texts = hostile_outputs("hermes", 2_000)
    assert any("[" * 1000 in t or '{"a":' * 1000 in t for t in texts)
    assert sum(t.count("<tool_call>") > 20 for t in texts) > 100
    assert len({t for t in texts}) > 1_900


DEEP_CALLS = {
    "hermes": "<tool_call>" + '{"name": "f", "arguments": {"a": ' + "[" * 500 + "]" * 500 + "}}</tool_call>",
    "qwen3": "<tool_call>" + '{"name": "f", "arguments": {"a": ' + "[" * 500 + "]" * 500 + "}}</tool_call>",
    "llama3": '{"name": "f", "parameters": {"a": ' + "[" * 500 + "]" * 500 + "}}",
    "mistral": '[TOOL_CALLS][{"name": "f", "arguments": {"a": ' + "[" * 500 + "]" * 500 + "}}]",
    "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": "
    + "[" * 500 + "]" * 500 + "}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "gpt_oss": "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": " + "[" * 500 + "]" * 500 + "}",
    "qwen3_xml": "<tool_call>\n<function=f>\n<parameter=a>\n" + "[" * 500 + "]" * 500 + "\n</parameter>\n</function>\n</tool_call>",
    "lfm2": "<|tool_call_start|>[f(a=" + "[" * 500 + "]" * 500 + ")]<|tool_call_end|>",
    "gemma4": "<|tool_call>call:f{a:" + "[" * 500 + "]" * 500 + "}<tool_call|>",
    "glm4": "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>" + "[" * 500 + "]" * 500 + "</arg_value>\n</tool_call>",
    # GLM-4.7 / GLM-5: the same parser, calls written without newlines after an empty reasoning block
    "glm5": "<think></think><tool_call>f<arg_key>a</arg_key><arg_value>" + "[" * 500 + "]" * 500 + "</arg_value></tool_call>",
    "atem": ' to=f<|message|><atem:function_calls>\n<atem:invoke name="f">\n<atem:parameter name="a">' + "[" * 500 + "]" * 500
    + "</atem:parameter>\n</atem:invoke>\n</atem:function_calls>",
}


@pytest.mark.parametrize("name", sorted(DEEP_CALLS))
@pytest.mark.parametrize("depth", [500, 5_000])
def test_deep_json_is_an_issue_not_an_exception(name: str, depth: int) -> None:
    text = DEEP_CALLS[name].replace("[" * 500 + "]" * 500, "[" * depth + "]" * depth)
    result = get_parser({"glm5": "glm4"}.get(name, name)).parse_with_tools(text, TOOLS)
    check(result)
    assert result.issues, "a call nested past the depth limit must be reported"
    for call in result.tool_calls:
        assert call.arguments is None or json.dumps(call.arguments).count("[") <= MAX_DEPTH


def test_nesting_within_the_limit_is_kept() -> None:
    nested = "[" * (MAX_DEPTH - 3) + "]" * (MAX_DEPTH - 3)
    result = get_parser("hermes").parse('<tool_call>{"name": "f", "arguments": {"a": ' + nested + "}}</tool_call>")
    assert not result.issues and json.dumps(result.tool_calls[0].arguments["a"]) == nested


def test_deep_trajectory_round_trips_through_the_writer(tmp_path: Path) -> None:
    """The issue-17 crash: 500 (here 5,000) nested lists in a message, a task and a turn's message."""
    deep: Any = []
    for _ in range(5_000):
        deep = [deep]
    traj = Trajectory(
        task={"question": "q", "deep": deep}, seed=3, samples=[Sample([1, 2], [3, 4], [1, 0], [-0.5, 0.0])],
        messages=[{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"a": deep}}}]}],
        turns=[Turn(0, {"role": "assistant", "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": {"a": deep}}}]}, 2, "stop")],
        reward=1.0,
    )  # fmt: skip
    path = tmp_path / "results.jsonl"
    write_jsonl([traj], path)
    (back,) = read_jsonl(path)
    assert back.samples == traj.samples and back.reward == 1.0 and back.turns[0].num_sampled == 2
    # Deep values are kept as their JSON text below the depth limit: nothing is lost.
    level: Any = back.task["deep"]
    depth = 0
    while isinstance(level, list):
        level, depth = level[0], depth + 1
    assert isinstance(level, str) and depth + level.count("[") == 5_001


def test_deep_trajectory_reaches_samples_jsonl(tmp_path: Path) -> None:
    """The training side of the issue-17 crash: ``RunLog.samples`` (samples.jsonl) with a 5,000-deep call."""
    from agentrl.observe.runlog import RunLog

    deep: Any = []
    for _ in range(5_000):
        deep = [deep]
    turn = Turn(0, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"a": deep}}}]}, 2, "stop")
    traj = Trajectory(task={"q": "q"}, seed=0, samples=[Sample([1], [2, 3], [1, 1], [-0.1, -0.2])], turns=[turn], reward=0.5)
    log = RunLog(tmp_path, accelerator=None, live=False)
    log.samples(3, [traj], decode=lambda ids: "x" * len(ids))
    (record,) = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert record["step"] == 3 and record["reward"] == 0.5 and record["text"] == ["xxx"]


def test_shallow_trajectory_serialises_as_before() -> None:
    from dataclasses import asdict

    traj = Trajectory(task={"q": 1, "t": (1, 2)}, seed=None, samples=[Sample([1], [2], [1], [0.1])],
                      turns=[Turn(0, {"role": "assistant"}, 1, "stop")], rewards={"a": 1.0})  # fmt: skip
    expected = asdict(traj)
    expected["task"]["t"] = [1, 2]  # JSON has no tuples
    assert traj.to_dict() == expected


@pytest.mark.parametrize("name", ["hermes", "qwen3", "qwen3_xml", "llama3", "mistral", "deepseek_v3", "gpt_oss", "lfm2", "lfm2_list", "gemma4", "glm4", "atem", "atem_list"])
def test_a_million_openers_are_capped(name: str) -> None:
    one = {
        "hermes": '<tool_call>{"name": "f", "arguments": {}}</tool_call>', "qwen3": '<tool_call>{"name": "f"}</tool_call>',
        "qwen3_xml": "<tool_call><function=f></function></tool_call>", "llama3": '{"name": "f", "parameters": {}};',
        "mistral": "[TOOL_CALLS]f[ARGS]{}", "deepseek_v3": "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n{}<｜tool▁call▁end｜>",
        "gpt_oss": "<|start|>assistant<|channel|>commentary to=functions.f<|message|>{}<|end|>",
        "lfm2": "<|tool_call_start|>[f(a=1)]<|tool_call_end|>", "lfm2_list": "f(a='x'), ",
        "gemma4": "<|tool_call>call:f{a:1}<tool_call|>", "glm4": "<tool_call>f\n</tool_call>",
        "atem": ' to=f<|message|><atem:function_calls><atem:invoke name="f"></atem:invoke></atem:function_calls><|eom|>',
        "atem_list": '<atem:invoke name="f"></atem:invoke>',
    }[name]  # fmt: skip
    prefix = {"deepseek_v3": "<｜tool▁calls▁begin｜>", "lfm2_list": "<|tool_call_start|>[",
              "atem_list": " to=f<|message|><atem:function_calls>"}.get(name, "")  # fmt: skip
    result = get_parser(name.removesuffix("_list")).parse(prefix + one * 20_000)
    check(result)
    assert len(result.tool_calls) == MAX_CALLS
    assert "too_many_calls" in {i.kind for i in result.issues}


MALFORMED_CALLS = {  # (prefix, one closed call the parser cannot use)
    "hermes": ("", "<tool_call>x</tool_call>"), "qwen3": ("", "<tool_call>{bad</tool_call>"),
    "qwen3_xml": ("", "<tool_call>x</tool_call>"), "llama3": ("", '{"name": 1, "parameters": {}};'),
    "mistral": ("", "[TOOL_CALLS]x"), "deepseek_v3": ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>x<｜tool▁call▁end｜>"),
    "gpt_oss": ("", "<|start|>assistant<|channel|>commentary to=functions.f<|message|>{bad<|call|>"),
    "lfm2": ("", "<|tool_call_start|>x<|tool_call_end|>"), "gemma4": ("", "<|tool_call>x<tool_call|>"),
    "glm4": ("", "<tool_call>\n</tool_call>"),
    "atem": ("", " to=f<|message|><atem:function_calls><atem:invoke></atem:invoke></atem:function_calls><|eom|>"),
    "deepseek_v31": ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>x<｜tool▁call▁end｜>"),
    "deepseek_v32": ("", "<｜DSML｜function_calls>x</｜DSML｜function_calls>"),
    "kimi_k2": ("<|tool_calls_section_begin|>", "<|tool_call_begin|>x<|tool_call_end|>"),
    "minimax_m2": ("", "<minimax:tool_call>x</minimax:tool_call>"),
    "command": ("<|START_ACTION|>[0", ", 0", "]<|END_ACTION|>"),  # one action list per turn: its entries are capped
    "llama4_pythonic": ("[f()", ", f()"),  # one call list per turn: its calls are capped
}  # fmt: skip


def test_every_parser_has_a_malformed_call_case() -> None:
    assert set(MALFORMED_CALLS) == set(available_parsers())


@pytest.mark.parametrize("name", sorted(MALFORMED_CALLS))
def test_malformed_calls_count_toward_the_cap(name: str) -> None:
    """glm4, gemma4 and lfm2 counted only good calls: 70,000 empty calls in 1 MB were 70,000 issues
    (1.4 s at 1 MB under load, past the 1 s target). Every attempt counts now, so the work and the
    issue list stay bounded whatever the output."""
    prefix, unit, *suffix = MALFORMED_CALLS[name]  # (a closing suffix where the family has one list per turn)
    result = get_parser(name).parse(prefix + unit * 20_000 + "".join(suffix))
    check(result)
    assert len(result.issues) <= MAX_CALLS + 2
    assert "too_many_calls" in {i.kind for i in result.issues}


def test_every_format_is_fuzzed_with_its_own_markup() -> None:
    """A new format whose parser has no entry in ``fuzz.MARKUP`` would be attacked with Hermes' tags only."""
    from agentrl.chat import available_formats, format_spec
    from agentrl.chat.fuzz import MARKUP

    parsers = {format_spec(name).parser for name in available_formats()}
    assert parsers <= set(available_parsers())  # so the parametrised fuzz above covers every format
    assert parsers <= set(MARKUP), sorted(parsers - set(MARKUP))


class _ThreadRecordingParser:
    """Wraps a real parser and records which thread parsed."""

    def __init__(self) -> None:
        self.inner = get_parser("hermes")
        self.name = "hermes"
        self.threads: list[int] = []

    def parse(self, text: str) -> ParsedResponse:
        self.threads.append(threading.get_ident())
        return self.inner.parse(text)

    def parse_with_tools(self, text: str, tools: Any) -> ParsedResponse:
        return self.parse(text)


def test_aparse_moves_long_outputs_off_the_event_loop(tmp_path: Path) -> None:
    tok = build_tiny_tokenizer(tmp_path / "tok")
    fmt = get_chat_format(tok, "hermes")
    recorder = _ThreadRecordingParser()
    fmt.parser = recorder  # type: ignore[assignment]
    eot = fmt.eot_token_ids[:1]
    short = fmt.encode('<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>') + eot
    long = fmt.encode("<tool_call>{" * 4_000) + eot

    async def run() -> tuple[ParsedResponse, ParsedResponse, int]:
        return await fmt.aparse(short), await fmt.aparse(long), threading.get_ident()

    a, b, loop_thread = anyio.run(run)
    assert recorder.threads[0] == loop_thread and recorder.threads[1] != loop_thread
    assert a.tool_calls[0].arguments == {"a": 1}
    plain_result = fmt.parse(long)
    assert [i.kind for i in b.issues] == [i.kind for i in plain_result.issues] and b.content == plain_result.content


def test_chat_format_parse_never_raises_on_hostile_ids(tmp_path: Path) -> None:
    tok = build_tiny_tokenizer(tmp_path / "tok")
    fmt: ChatFormat = get_chat_format(tok, "qwen3")
    for text in hostile_outputs("qwen3", 300, seed=5):
        check(fmt.parse(fmt.encode(text) + fmt.eot_token_ids[:1], TOOLS))
