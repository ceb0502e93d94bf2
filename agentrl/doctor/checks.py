"""The doctor's checks of a chat format: each renders real conversations and compares in token space.

Every check returns a :class:`Check` (PASS / WARN / FAIL / SKIP, a one-line summary, details and
token diffs). FAIL means training would silently learn something other than what inference sees
(or cannot work at all); WARN means agentrl copes, visibly (e.g. an unprovable bridge is split and
counted), but a person should know.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import agentrl.doctor.material as M
from agentrl.doctor.diff import TokenDiff, token_diff, value_differences

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
_RANK = {SKIP: 0, PASS: 1, WARN: 2, FAIL: 3}


@dataclass
class Check:
    """One line of the report, with what a person needs to act on it."""

    name: str
    status: str
    summary: str
    details: list[str] = field(default_factory=list)
    diffs: list[TokenDiff] = field(default_factory=list)
    texts: dict[str, str] = field(default_factory=dict)  # longer text worth showing (rendered prompt, output)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "summary": self.summary,
            "details": list(self.details),
            "diffs": [d.to_dict() for d in self.diffs],
            "texts": dict(self.texts),
        }


def worst(statuses: Sequence[str]) -> str:
    return max(statuses, key=_RANK.__getitem__, default=PASS)


# ----------------------------------------------------------------------------- helpers
def decoder(tokenizer: Any):  # noqa: ANN201 - a small closure
    return lambda i: tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def parse(fmt: Any, ids: Sequence[int], tools: Sequence[Any] | None = None) -> Any:
    """``fmt.parse`` with the tool schemas the prompt showed (untyped XML families restore types from them)."""
    return fmt.parse(list(ids), tools=list(tools) if tools else None)


@dataclass
class Turn:
    """An assistant turn rendered the way the engine sees it: prompt ids, then what the model generates."""

    prompt: list[int]
    full: list[int]  # render(history + [reply]) without a generation prompt
    generated: list[int] | None  # full[len(prompt):] through the first stop token; None: prompt not a prefix
    stopped: bool  # a stop token closes the generated part
    after: list[int] = field(default_factory=list)  # what the rendered turn has after that stop token


def as_generated(fmt: Any, reply: M.Message) -> M.Message:
    """``reply`` as the model would write it: where the prompt opens a reasoning block, every turn
    starts with reasoning (Nemotron 3 renders an empty one as ``<think></think>``, which no model
    prompted with ``<think>\n`` can write)."""
    if reply.get("role") == "assistant" and reply.get("reasoning_content") is None and prompt_opens_reasoning(fmt):
        return {**reply, "reasoning_content": "Let me think."}
    return reply


def render_turn(fmt: Any, history: list[M.Message], reply: M.Message, tools: Sequence[Any] | None = M.TOOLS) -> Turn:
    reply = as_generated(fmt, reply)
    prompt = fmt.render(history, tools)
    full = fmt.render([*history, reply], tools, add_generation_prompt=False)
    if full[: len(prompt)] != prompt:
        return Turn(prompt, full, None, False)
    rest = full[len(prompt) :]
    stop = set(fmt.stop_token_ids)
    cut = next((i for i, t in enumerate(rest) if t in stop), None)
    if cut is None:
        return Turn(prompt, full, rest, False)
    return Turn(prompt, full, rest[: cut + 1], True, rest[cut + 1 :])


def prompt_not_prefix(fmt: Any, turn: Turn, label: str) -> tuple[str, TokenDiff | None]:
    diff = token_diff(decoder(fmt.tokenizer), turn.prompt, turn.full[: len(turn.prompt)], "generation prompt", "rendered turn")
    return (
        f"{label}: the generation prompt is not a prefix of the rendered assistant turn, so what the model "
        "is prompted with differs from what a trained turn looks like",
        diff,
    )


def renders_reasoning(fmt: Any) -> bool:
    """Whether the template writes ``reasoning_content`` of a final assistant turn at all."""
    marker = "agentrl doctor reasoning probe"
    try:
        text = fmt.render_text(
            [{"role": "user", "content": "hi"}, M.assistant("ok", reasoning=marker)], add_generation_prompt=False
        )
    except Exception:
        return False
    return marker in text


def renders_call_reasoning(fmt: Any) -> bool:
    """Whether the template writes ``reasoning_content`` of a final turn that calls a tool (Kimi K2
    Thinking does, while it drops a final answer's)."""
    marker = "agentrl doctor reasoning probe"
    call = {"type": "function", "id": "callprobe", "function": {"name": "search", "arguments": {"q": "x"}}}
    try:
        text = fmt.render_text(
            [{"role": "user", "content": "hi"}, M.assistant("", [call], reasoning=marker)], add_generation_prompt=False
        )
    except Exception:
        return False
    return marker in text


def _default_prompt_tail(fmt: Any) -> str:
    try:
        prompt = fmt.render_text([{"role": "user", "content": "hi"}], add_generation_prompt=True)
        plain = fmt.render_text([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    except Exception:
        return ""
    return prompt[len(plain) :] if prompt.startswith(plain) else prompt[-40:]


# Reasoning blocks as the families write them: (opening tag, closing tag).
REASONING_TAGS = (("<think>", "</think>"), ("<|START_THINKING|>", "<|END_THINKING|>"))


def prompt_opens_reasoning(fmt: Any) -> bool:
    """Whether the default generation prompt opens a reasoning block it does not close (Qwen3.5,
    Nemotron 3 end it with ``<think>\n``, Cohere2MoE with ``<|START_THINKING|>``)."""
    tail = _default_prompt_tail(fmt)
    return any(open_tag in tail and close_tag not in tail for open_tag, close_tag in REASONING_TAGS)


def thinking_off_by_default(fmt: Any) -> bool:
    """Whether the default generation prompt already closes a reasoning block (Qwen3.5 'nothink'
    writes ``<think>\n\n</think>\n\n``): the model then writes no reasoning unless asked to."""
    tail = _default_prompt_tail(fmt)
    return any(close in tail for close in ("</think>", "<channel|>", "<|END_THINKING|>"))


def reads_reasoning(fmt: Any) -> bool:
    """Whether the format parses reasoning back: its FormatSpec's ``thinking`` flag where it has one,
    else whether its parser returns any reasoning at all for a rendered reasoning turn."""
    from agentrl.chat import format_spec

    try:
        return bool(format_spec(fmt.name).thinking)
    except ValueError:  # a ChatFormat built by hand under a name no registry knows
        pass
    try:
        turn = render_turn(fmt, M.history(), M.assistant("ok", reasoning="Think first."), None)
    except Exception:
        return False
    return turn.generated is not None and parse(fmt, turn.generated).reasoning is not None


def token_window(tokenizer: Any, ids: Sequence[int], needle: str, context: int = 5) -> list[str]:
    """The ids and pieces around where ``needle`` first appears in the decoded ``ids``."""
    dec = decoder(tokenizer)
    at = None
    for k in range(1, len(ids) + 1):
        if needle in tokenizer.decode(list(ids[:k]), skip_special_tokens=False, clean_up_tokenization_spaces=False):
            at = k - 1
            break
    if at is None:
        return [f"{needle!r} does not appear in the generated tokens"]
    lines = [f"generated tokens around {needle!r} (token {at} of {len(ids)}):"]
    for i in range(max(0, at - context), min(len(ids), at + context + 1)):
        lines.append(f"  {'>' if i == at else ' '} {i:>6}  {ids[i]:>7} {dec(ids[i])!r}")
    return lines


def show_ids(tokenizer: Any, ids: Sequence[int]) -> str:
    dec = decoder(tokenizer)
    return ", ".join(f"{dec(i)!r} ({i})" for i in ids)


def short(text: str, limit: int = 400) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


# ----------------------------------------------------------------------------- tool schemas
def check_tool_schemas(tokenizer: Any, template: str | None, fmt: Any = None) -> Check:
    """Do the tool schemas reach the prompt? Names and parameters must; descriptions should."""
    name = "tool schemas in the prompt"
    msgs = M.history()

    def render(tools: Any) -> str:
        if fmt is not None:
            return fmt.render_text(msgs, tools, add_generation_prompt=False)
        return tokenizer.apply_chat_template(msgs, tools=tools, chat_template=template, tokenize=False, add_generation_prompt=False)

    if fmt is None and template is None and not getattr(tokenizer, "chat_template", None):
        return Check(name, FAIL, "the tokenizer has no chat template (pass chat_format= a format that supplies one, or chat_template=)")
    try:
        with_tools, without = render(M.TOOLS), render(None)
    except Exception as exc:
        return Check(name, FAIL, f"the template failed to render a conversation with tools: {short(repr(exc), 200)}")
    end = with_tools.find(M.USER)
    shown = with_tools[: end + len(M.USER)] if end >= 0 else with_tools
    texts = {"rendered prompt (system and user turns, with tools)": shown}
    if with_tools == without:
        return Check(name, FAIL, "the template ignores tools=: the model would never see the tool schemas", texts=texts)
    missing, undescribed = [], []
    for tool in M.TOOLS:
        fn = tool["function"]
        if fn["name"] not in with_tools:
            missing.append(f"tool name {fn['name']!r}")
        if fn["description"] not in with_tools:
            undescribed.append(f"description of {fn['name']!r}")
        for pname, prop in fn["parameters"]["properties"].items():
            if pname not in with_tools:
                missing.append(f"parameter {fn['name']}.{pname}")
            elif prop.get("description") and prop["description"] not in with_tools:
                undescribed.append(f"description of {fn['name']}.{pname}")
    details = []
    if M.SYSTEM not in with_tools:
        details.append("the system message is not in the prompt when tools are given")
    n_params = sum(len(t["function"]["parameters"]["properties"]) for t in M.TOOLS)
    if missing:
        return Check(name, FAIL, f"missing from the prompt: {', '.join(missing)}", details, texts=texts)
    if undescribed or details:
        lost = [f"missing: {', '.join(undescribed)}"] if undescribed else []
        lost += ["the system message is dropped when tools are given"] if M.SYSTEM not in with_tools else []
        return Check(name, WARN, f"names and parameters are there; {'; '.join(lost)}", details, texts=texts)
    return Check(
        name, PASS, f"{len(M.TOOLS)} tools, {n_params} parameters, all descriptions rendered "
        f"({len(with_tools) - len(without)} chars of tool text)", texts=texts,
    )  # fmt: skip


# ----------------------------------------------------------------------------- round trip
def _compare(reply: M.Message, parsed: Any) -> list[tuple[str, str]]:
    """(problem, text to locate it by) for everything the parse lost or changed."""
    problems: list[tuple[str, str]] = []
    expected_calls = reply.get("tool_calls") or []
    first_name = expected_calls[0]["function"]["name"] if expected_calls else ""
    for issue in parsed.issues:
        problems.append((f"parse issue {issue.kind}: {issue.detail}", first_name))
    if (reply.get("content") or "").strip() != (parsed.content or "").strip():
        problems.append((f"content: expected {reply.get('content')!r}, got {parsed.content!r}", ""))
    if (reply.get("reasoning_content") or "").strip() != (parsed.reasoning or "").strip():
        problems.append((f"reasoning: expected {reply.get('reasoning_content')!r}, got {parsed.reasoning!r}", ""))
    if len(parsed.tool_calls) != len(expected_calls):
        problems.append((f"expected {len(expected_calls)} tool calls, parsed {len(parsed.tool_calls)}", first_name))
    for i, (exp, got) in enumerate(zip(expected_calls, parsed.tool_calls)):
        fn = exp["function"]
        where = f"call {i} ({fn['name']})"
        if got.name != fn["name"]:
            problems.append((f"{where}: name parsed as {got.name!r}", fn["name"]))
        if got.arguments is None:
            problems.append((f"{where}: arguments not parsed ({got.error}); raw text {short(got.raw_arguments or '', 160)!r}", fn["name"]))
            continue
        for diff in value_differences(fn["arguments"], got.arguments, f"{where} arguments"):
            key = diff.split(":", 1)[0].rsplit(".", 1)[-1].split("[", 1)[0]
            problems.append((diff, key))
    return problems


def _stops_between_calls(fmt: Any, reply: M.Message, parsed: Any, turn: Turn) -> bool:
    """True when the turn was cut at a stop token the template writes between calls (harmony's ``<|call|>``):
    the calls before it came back exactly and the rest of the turn holds the others."""
    expected = reply.get("tool_calls") or []
    got = parsed.tool_calls
    if len(expected) < 2 or not 0 < len(got) < len(expected) or parsed.issues or not fmt.decode(turn.after).strip():
        return False
    return all(
        g.name == e["function"]["name"] and not value_differences(e["function"]["arguments"], g.arguments, "a")
        for g, e in zip(got, expected)
    )


def _drops_text_beside_calls(fmt: Any, reply: M.Message, parsed: Any, turn: Turn) -> bool:
    """True when the only loss is the text of a turn with calls, and the template never wrote it
    (Muse Glimmer's ATEM: text goes to the user, which ends the turn, so a call turn carries none)."""
    text = (reply.get("content") or "").strip()
    expected = reply.get("tool_calls") or []
    if not text or not expected or parsed.issues or (parsed.content or "").strip() or len(parsed.tool_calls) != len(expected):
        return False
    if text in fmt.decode(turn.full[len(turn.prompt) :]):
        return False
    return all(
        g.name == e["function"]["name"] and not value_differences(e["function"]["arguments"], g.arguments, "a")
        for g, e in zip(parsed.tool_calls, expected)
    )


def check_round_trip(fmt: Any, thinking: bool) -> Check:
    """Render an assistant turn with tool calls, parse its generated ids: same calls, types and text.

    ``thinking``: the format reads reasoning back, so a turn with reasoning is part of the test.
    """
    name = "tool-call round trip"
    details: list[str] = []
    diffs: list[TokenDiff] = []
    failed, drifted, refused, dropped = [], [], [], []
    unrendered: list[tuple[str, bool]] = []  # (label, has parallel calls) of turns the template refused
    cases = M.round_trip_cases(thinking)
    for label, reply in cases:
        reply = as_generated(fmt, reply)
        try:
            turn = render_turn(fmt, M.history(), reply)
        except Exception as exc:
            unrendered.append((label, len(reply.get("tool_calls") or []) > 1))
            details.append(f"{label}: the template failed to render: {short(repr(exc), 300)}")
            continue
        if turn.generated is None:
            failed.append(label)
            why, diff = prompt_not_prefix(fmt, turn, label)
            details.append(why)
            diffs += [diff] if diff else []
            continue
        parsed = parse(fmt, turn.generated, M.TOOLS)
        problems = _compare(reply, parsed)
        if problems and _stops_between_calls(fmt, reply, parsed, turn):
            refused.append(label)
            details.append(
                f"{label}: the template closes each call with a stop token, so generation ends after "
                f"{len(parsed.tool_calls)} of {len(reply['tool_calls'])} calls ({short(fmt.decode(turn.generated), 200)!r})"
            )
            continue
        if problems and _drops_text_beside_calls(fmt, reply, parsed, turn):
            dropped.append(label)
            details.append(f"{label}: the template does not write an assistant's text beside tool calls; the calls parse back exactly")
            continue
        if problems:
            failed.append(label)
            details += [f"{label}: {p}" for p, _ in problems]
            details.append(f"{label}: generated text {short(fmt.decode(turn.generated))!r}")
            needle = next((n for _, n in problems if n), "")
            if needle:
                details += token_window(fmt.tokenizer, turn.generated, needle)
            continue
        again = fmt.render([*M.history(), parsed.to_message()], M.TOOLS, add_generation_prompt=False)
        diff = token_diff(decoder(fmt.tokenizer), turn.full, again, "original render", "re-render of the parse")
        if diff is not None:
            drifted.append(label)
            details.append(f"{label}: re-rendering the parsed message gives other tokens than the original turn")
            diffs.append(diff)
    # A refusal of the two-call turn is a refusal of parallel calls only when one call renders.
    single_refused = any(not parallel for _, parallel in unrendered)
    for label, parallel in unrendered:
        (refused if parallel and not single_refused else failed).append(label)
    failed.sort(key=[label for label, _ in cases].index)
    n = len(cases)
    if failed:
        return Check(name, FAIL, f"{len(failed)} of {n} turns do not survive render -> parse: {', '.join(failed)}", details, diffs)
    if dropped:
        return Check(
            name, WARN, f"the template drops an assistant's text beside tool calls ({', '.join(dropped)}); calls, types "
            "and the other turns parse back exactly", details, diffs,
        )  # fmt: skip
    if refused:
        return Check(
            name, WARN, f"no parallel tool calls in one turn ({', '.join(refused)}); the other turns parse back exactly. "
            "Keep the environment to one call per turn", details, diffs,
        )  # fmt: skip
    if drifted:
        return Check(
            name, WARN, f"calls parse back exactly, but {len(drifted)} of {n} parsed turns re-render differently "
            "(the engine keeps the sampled ids, so training is unaffected; a re-rendered history is not)", details, diffs,
        )  # fmt: skip
    what = ", ".join(label for label, _ in cases)
    return Check(name, PASS, f"{n} turns ({what}) parse back to the same calls, argument types and text")


# ----------------------------------------------------------------------------- malformed output
def check_malformed(fmt: Any) -> Check:
    """A call cut short (length cap, or an early end of turn) must be reported, never accepted as clean."""
    name = "malformed output reported"
    reply = M.round_trip_cases(False)[0][1]
    try:
        turn = render_turn(fmt, M.history(), reply)
    except Exception as exc:
        return Check(name, SKIP, f"the template failed to render: {short(repr(exc), 200)}")
    if turn.generated is None or not turn.stopped:
        return Check(name, SKIP, "no well-formed generated turn to cut (see the checks above)")
    body, eot = turn.generated[:-1], turn.generated[-1:]
    half = body[: len(body) // 2]
    dec = decoder(fmt.tokenizer)
    last = len(body)  # the last token that writes something (Nemotron ends a call turn with a newline)
    while last > 1 and not dec(body[last - 1]).strip():
        last -= 1
    cases = [
        ("cut at the length cap (no end of turn)", half),
        ("call cut, then end of turn", half + eot),
        ("call without its last token", body[: last - 1] + eot),
    ]
    silent, details = [], []
    for label, ids in cases:
        parsed = parse(fmt, ids, M.TOOLS)
        kinds = sorted({i.kind for i in parsed.issues})
        if kinds:
            details.append(f"{label}: reported {', '.join(kinds)}")
        else:
            silent.append(label)
            calls = [(c.name, c.arguments) for c in parsed.tool_calls]
            details.append(f"{label}: parsed without any issue into content={short(parsed.content, 80)!r}, calls={short(repr(calls), 160)}")
            details += token_window(fmt.tokenizer, ids, M.TYPED_ARGUMENTS["origin"])
    if silent:
        return Check(name, FAIL, f"{len(silent)} of {len(cases)} broken outputs parse with no issue: {', '.join(silent)}", details)
    return Check(name, PASS, f"{len(cases)} cut-off tool calls all reported as issues", details)


# ----------------------------------------------------------------------------- end of turn
def check_end_of_turn(fmt: Any) -> Check:
    """The turn-closing token must be inside the span the model generates, so the loss teaches stopping."""
    name = "end-of-turn token trained"
    eot = fmt.eot_token_ids
    if not eot:
        return Check(name, FAIL, "no end-of-turn token found: generation cannot stop and no bridge can be proven")
    dec = decoder(fmt.tokenizer)
    details: list[str] = []
    diffs: list[TokenDiff] = []
    problems: list[str] = []  # one short phrase per problem, for the summary line
    status = PASS
    cases = [
        ("plain answer", M.assistant("The answer is 42.")),
        ("tool call", M.assistant(calls=[M.call("get_weather", {"city": "Paris"}, "call00001")])),
    ]
    closers = set()
    for label, reply in cases:
        reply = as_generated(fmt, reply)
        try:
            turn = render_turn(fmt, M.history(), reply)
        except Exception as exc:
            return Check(name, FAIL, f"{label}: the template failed to render: {exc!r}")
        if turn.generated is None:
            why, diff = prompt_not_prefix(fmt, turn, label)
            status = FAIL
            problems.append(f"{label}: generation prompt not a prefix")
            details.append(why)
            diffs += [diff] if diff else []
            continue
        if not turn.stopped:
            status = FAIL
            problems.append(f"{label}: no stop token in the generated part")
            rest = turn.generated
            n = len(rest)
            while n > 0 and not dec(rest[n - 1]).strip():
                n -= 1
            details.append(
                f"{label}: the rendered turn has no stop token after the generation prompt (expected one of "
                f"{show_ids(fmt.tokenizer, eot)}): a rendered turn never ends the way generation stops, so it never "
                "trains the model to end its turn (SFT, re-rendered history), and no bridge after it can be proven"
            )
            diffs.append(token_diff(dec, [*rest[:n], eot[0]], rest, "expected generated part", "rendered generated part"))
            continue
        closer = turn.generated[-1]
        closers.add(closer)
        if closer not in eot:
            status = worst([status, WARN])
            problems.append(f"{label}: ends on a document-end token")
            details.append(
                f"{label}: the turn ends with {show_ids(fmt.tokenizer, [closer])}, a document end rather than "
                f"the end-of-turn token {show_ids(fmt.tokenizer, eot[:1])}; bridges after it cannot be proven"
            )
    if status == PASS:
        return Check(
            name, PASS, f"{show_ids(fmt.tokenizer, sorted(closers))} closes both a plain and a tool-call turn inside the "
            f"generated part (trained, loss mask 1); generation stops on {show_ids(fmt.tokenizer, fmt.stop_token_ids)}",
        )  # fmt: skip
    return Check(name, status, "; ".join(problems), details, [d for d in diffs if d is not None])


# ----------------------------------------------------------------------------- prefix preservation
def check_prefix(fmt: Any, name: str, rounds: list[M.Round]) -> Check:
    """Play an episode with parse + bridge only, as the engine does; every bridge should be proven.

    Sampled ids are the template's own rendering of each reply, so a proven episode must end up with
    exactly the ids of one fresh render of the whole conversation.
    """
    dec = decoder(fmt.tokenizer)
    messages = M.history()
    try:
        ids = fmt.render(messages, M.TOOLS)
    except Exception as exc:
        return Check(name, FAIL, f"the template failed to render: {exc!r}")
    details: list[str] = []
    diffs: list[TokenDiff] = []
    splits = bridges = 0
    for k, (reply, env) in enumerate(rounds):
        turn = render_turn(fmt, messages, reply)
        if turn.generated is None:
            why, diff = prompt_not_prefix(fmt, turn, f"turn {k}")
            return Check(name, FAIL, why, [], [diff] if diff else [])
        message = parse(fmt, turn.generated, M.TOOLS).to_message()
        for call, original in zip(message.get("tool_calls", []), reply.get("tool_calls", [])):
            call.setdefault("id", original.get("id"))  # the engine names calls the same way when the model does not
        ids = ids + turn.generated
        messages.append(message)
        if env is None:
            break
        bridges += 1
        result = fmt.bridge(messages, env, ids, M.TOOLS)
        if result.proven:
            ids = ids + list(result.ids or [])
        else:
            splits += 1
            roles = "+".join(m["role"] for m in env)
            details.append(f"turn {k} -> {roles}: {result.reason}")
            before = fmt.render(messages, M.TOOLS, add_generation_prompt=False)
            after = fmt.render([*messages, *env], M.TOOLS)
            diff = token_diff(dec, before, after, f"render at turn {k}", f"render at turn {k + 1}")
            if diff is not None:
                diffs.append(diff)
            ids = after  # the engine starts a new sample from a fresh render
        messages += env
    if splits:
        return Check(
            name, WARN, f"{splits} of {bridges} bridges not provable: the engine splits the episode there "
            "(counted in the prefix_splits metric); use a prefix-preserving (training) template to avoid it", details, diffs,
        )  # fmt: skip
    fresh = fmt.render(messages, M.TOOLS, add_generation_prompt=False)
    diff = token_diff(dec, fresh[: len(ids)], ids, "fresh render", "bridged ids")
    if diff is not None or fmt.decode(fresh[len(ids) :]).strip():
        return Check(
            name, WARN, "every bridge was proven, but the bridged ids differ from one fresh render of the conversation "
            "(parsed turns re-render differently)", details, [diff] if diff else [],
        )  # fmt: skip
    return Check(name, PASS, f"{len(rounds)} assistant turns, {bridges} bridges proven; the ids equal one fresh render ({len(ids)} ids)")
