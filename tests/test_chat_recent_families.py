"""The tool-calling families added in issue 42, on their real templates (llama.cpp's copies, fetched by
scripts/fetch_test_assets.py): the format chosen, the template used and `agentrl doctor`'s verdict.

No offline tokenizer of these families exists (DeepSeek V3.1's is V3's plus two tokens): each template
runs on Qwen3's (or DeepSeek V3's) tokenizer with the family's control tokens added, as
tests/chat_fixtures.py does for TRL's templates. Each WARN names a declared limitation of the family.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from chat_fixtures import assets_dir, llamacpp_template, load_asset_tokenizer, tokenizer_with
from glm5_template import GLM5_TEMPLATE, GLM51_TEMPLATE
from glm5_template import GLM_TOKENS as GLM5_TOKENS

from agentrl.chat import get_chat_format
from agentrl.chat.formats import read_template
from agentrl.cli.main import main as cli

KIMI = ("<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>")
COHERE = ("<BOS_TOKEN>", "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|SYSTEM_TOKEN|>", "<|USER_TOKEN|>",
          "<|CHATBOT_TOKEN|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_ACTION|>", "<|END_ACTION|>",
          "<|START_TOOL_RESULT|>", "<|END_TOOL_RESULT|>", "<|START_THINKING|>", "<|END_THINKING|>")
# Cohere2 templates write every text between <|START_TEXT|> and <|END_TEXT|> (special tokens of the family).
COHERE2 = (*COHERE, "<|START_TEXT|>", "<|END_TEXT|>")
GRANITE = ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>")
# template -> (base tokenizer, added control tokens, eos, format, template used (prefix), doctor status, warned checks)
EXPECTED: dict[str, tuple[str, tuple[str, ...], str | None, str, str, str, set[str]]] = {
    "deepseek-ai-DeepSeek-V3.1": ("deepseek_v3", ("<think>", "</think>"), None, "deepseek_v31",
                                  "agentrl deepseek_v31_tools.jinja (the tokenizer's template does not show", "PASS", set()),
    # llama.cpp's community V3.2 template (DeepSeek ships an encoder, no template): its non-thinking
    # generation prompt "<think></think>" is not how it renders a turn ("</think>"), nor DeepSeek's encoder;
    # the derived template prompts with "</think>" (before issue 42b: FAIL).
    "deepseek-ai-DeepSeek-V3.2": ("deepseek_v3", ("<think>", "</think>"), None, "deepseek_v32",
                                  "training template derived from the tokenizer's (the non-thinking generation prompt",
                                  "PASS", set()),
    "moonshotai-Kimi-K2": ("qwen3", KIMI, None, "kimi_k2", "tokenizer", "PASS", set()),
    # K2 Instruct (0905) and K2 Thinking queue call ids with list.append/pop, which transformers' sandbox
    # refuses on every tool conversation: agentrl renders them rewritten (agentrl/chat/sandbox.py).
    "Kimi-K2-Instruct": ("qwen3", KIMI, None, "kimi_k2", "tokenizer (the 'kimi_k2' training derivation does not apply",
                         "PASS", set()),
    # K2 Thinking drops even a final answer's reasoning; the derived template keeps every turn's (before
    # issue 42b the doctor SKIPped its reasoning check, saying the template renders none).
    "Kimi-K2-Thinking": ("qwen3", KIMI, None, "kimi_k2", "training template derived from the tokenizer's", "PASS", set()),
    "MiniMax-M2": ("qwen3", ("]~!b[", "]~b]", "[e~[", "<minimax:tool_call>", "</minimax:tool_call>"), None, "minimax_m2",
                   "training template derived from the tokenizer's", "PASS", set()),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": ("qwen3", COHERE, None, "command",
                                                      "training template derived from the tokenizer's", "WARN",
                                                      {"tool-call round trip"}),
    # Cohere2MoE's generation prompt opens <|START_THINKING|> (reasoning on by default), and its answers
    # are <|START_TEXT|>...<|END_TEXT|>: before issue 42b the doctor saw neither and FAILed.
    "Cohere2MoE": ("qwen3", COHERE2, None, "command", "tokenizer (the 'command' training derivation does not apply",
                   "WARN", {"tool-call round trip"}),
    "GLM-4.7-Flash": ("qwen3", ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
                                "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "/nothink"), None, "glm4",
                      "training template derived from the tokenizer's", "PASS", set()),
    "LFM2.5-Instruct": ("qwen3", ("<|startoftext|>", "<|tool_list_start|>", "<|tool_list_end|>", "<|tool_call_start|>",
                                  "<|tool_call_end|>", "<|tool_response_start|>", "<|tool_response_end|>"), None,
                        "lfm2_5_content", "training template derived from the tokenizer's", "PASS", set()),
    "ibm-granite-granite-4.0": ("qwen3", GRANITE, "<|end_of_text|>", "hermes", "tokenizer", "PASS", set()),
    "ibm-granite-granite-4.1": ("qwen3", GRANITE, "<|end_of_text|>", "hermes", "tokenizer", "PASS", set()),
}  # fmt: skip
def family_tokenizer(name: str) -> Any:
    base, added, eos, *_ = EXPECTED[name]
    tok = tokenizer_with(base, added, llamacpp_template(name))
    if eos is not None:
        tok.eos_token = eos  # the family's own tokenizer ends documents with it
    return tok


def doctor_report(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str) -> tuple[int, dict[str, Any]]:
    import agentrl.doctor as doctor_module

    tok = family_tokenizer(name)
    monkeypatch.setattr(doctor_module, "load_tokenizer", lambda spec: tok)
    code = cli(["doctor", f"model={name}", "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_template_of_a_recent_family(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    _, _, _, fmt, template, status, warned = EXPECTED[name]
    code, report = doctor_report(capsys, monkeypatch, name)
    lines = [f"{c['status']} {c['name']}: {c['summary']}" for c in report["checks"]]
    assert report["chat_format"] == fmt and report["template"].startswith(template), (report["template"], lines)
    assert report["status"] == status and code == 0, lines
    assert {c["name"] for c in report["checks"] if c["status"] == "WARN"} == warned, lines
    for c in report["checks"]:
        if c["status"] == "WARN":
            assert "Declared limitation of the" in c["summary"], c["summary"]


def test_deepseek_v32_community_template_prompts_as_it_renders_a_turn(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own non-thinking prompt "<think></think>" is no prefix of the "</think>" turn it renders (FAIL);
    the derived one ends "</think>" (after tool results too) and is byte-identical otherwise."""
    import agentrl.doctor as doctor_module
    from agentrl.chat.families_recent import derive_deepseek_v32_training

    tok = family_tokenizer("deepseek-ai-DeepSeek-V3.2")
    derived = derive_deepseek_v32_training(tok.chat_template)
    assert derived is not None and derive_deepseek_v32_training(read_template("deepseek_v32_tools.jinja")) is None
    user = [{"role": "user", "content": "Q"}]
    after_tool = [*user, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "f", "arguments": {"a": 1}}}]}, {"role": "tool", "content": "r"}]  # fmt: skip
    for messages, tail in ((user, "<｜Assistant｜></think>"), (after_tool, "</function_results>\n\n</think>")):
        assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, chat_template=derived).endswith(tail)
        assert tok.apply_chat_template(messages, tokenize=False, chat_template=derived) == tok.apply_chat_template(messages, tokenize=False)
    monkeypatch.setattr(doctor_module, "load_tokenizer", lambda spec: tok)
    code = cli(["doctor", "model=v32", "training_template=false", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and "generation prompt is not a prefix" in json.dumps(report)


L4 = ("<|header_start|>", "<|header_end|>", "<|eot|>", "<|eom|>", "<|python_start|>", "<|python_end|>")
# No registry package ships a Llama 4 template: a Llama 4 tokenizer with a template that shows no tools
# is recognised by its header markers and gets agentrl's pythonic template (docs/chat_formats.md).
L4_PLAIN = ("{{- bos_token }}{%- for m in messages %}{{- '<|header_start|>' + m.role + '<|header_end|>\\n\\n' + m.content"
            " + '<|eot|>' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|header_start|>assistant<|header_end|>\\n\\n' }}"
            "{%- endif %}")


def test_llama4_gets_the_documented_pythonic_template(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import agentrl.doctor as doctor_module

    tok = tokenizer_with("llama3", L4, L4_PLAIN)
    monkeypatch.setattr(doctor_module, "load_tokenizer", lambda spec: tok)
    code = cli(["doctor", "model=llama4", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["chat_format"] == "llama4_pythonic" and report["template"].startswith("agentrl llama4_pythonic_tools.jinja")
    assert report["status"] == "PASS" and code == 0, [c["summary"] for c in report["checks"]]


def test_deepseek_v32_gets_the_documented_template(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A V3.2 tokenizer has no chat template (DeepSeek ships a Python encoder): chat_format=deepseek_v32
    supplies agentrl's, written from that encoder's published format."""
    import agentrl.doctor as doctor_module

    tok = tokenizer_with("deepseek_v3", ("<think>", "</think>"), None)
    tok.chat_template = None
    monkeypatch.setattr(doctor_module, "load_tokenizer", lambda spec: tok)
    code = cli(["doctor", "model=v32", "chat_format=deepseek_v32", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["template"].startswith("agentrl deepseek_v32_tools.jinja (the tokenizer has no chat template)")
    assert report["status"] == "PASS" and code == 0, [c["summary"] for c in report["checks"]]


def test_keep_past_thinking_derivation() -> None:
    """LFM2.5 Instruct strips every assistant turn's reasoning but the last one's: the derived template
    keeps it, and a fork without the switch keeps its own template and says why."""
    from agentrl.chat.families_recent import derive_keep_past_thinking

    original = llamacpp_template("LFM2.5-Instruct")
    derived = derive_keep_past_thinking(original)
    assert derived is not None and "keep_past_thinking | default(true)" in derived
    assert derive_keep_past_thinking(original.replace("keep_past_thinking | default(false)", "false")) is None
    tok = family_tokenizer("LFM2.5-Instruct")
    history = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "reasoning_content": "R1"},
               {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "B", "reasoning_content": "R2"}]  # fmt: skip
    kept = get_chat_format(tok).render_text(history, add_generation_prompt=False)
    shipped = get_chat_format(tok, training_template=False).render_text(history, add_generation_prompt=False)
    assert "<think>R1</think>" in kept and "<think>R1</think>" not in shipped and "<think>R2</think>" in shipped


def test_deepseek_v31_template_renders_as_deepseeks_own() -> None:
    """agentrl's V3.1 template only adds the tool prompt: without tools= it renders every conversation
    (calls, tool outputs, answers after them, a new question, the generation prompt) as DeepSeek's."""
    tok = tokenizer_with("deepseek_v3", ("<think>", "</think>"), llamacpp_template("deepseek-ai-DeepSeek-V3.1"))
    ours = read_template("deepseek_v31_tools.jinja")
    call = {"type": "function", "id": "c1", "function": {"name": "get_weather", "arguments": {"city": "Paris", "n": [1, 2.5]}}}
    conversations = [
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "system", "content": "Really."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Weather?"}],
        [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "Checking.", "tool_calls": [call, call]},
         {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "21C"}, {"role": "assistant", "content": "Sunny."},
         {"role": "user", "content": "And then?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
         {"role": "tool", "content": "rain"}],
        [{"role": "user", "content": "Hm"}, {"role": "assistant", "content": "reasoning</think>Answer."}],
    ]  # fmt: skip
    for messages in conversations:
        for gen in (True, False):
            for kwargs in ({}, {"thinking": True}):
                real = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen, **kwargs)
                assert tok.apply_chat_template(messages, tokenize=False, chat_template=ours, add_generation_prompt=gen, **kwargs) == real
    with_tools = tok.apply_chat_template(conversations[0], tools=[{"type": "function", "function": {"name": "get_weather",
                                         "description": "Weather.", "parameters": {}}}], tokenize=False, chat_template=ours)  # fmt: skip
    assert "### get_weather" in with_tools and "<｜tool▁sep｜>tool_call_arguments" in with_tools


def test_deepseek_v3_and_v31_syntaxes_are_told_apart() -> None:
    """DeepSeek V3's own template and V3.1's write the same tags; only V3.1 drops 'function' and the fence."""
    assert get_chat_format(load_asset_tokenizer("deepseek_v3")).name == "deepseek_v3"
    v31 = tokenizer_with("deepseek_v3", ("<think>", "</think>"), llamacpp_template("deepseek-ai-DeepSeek-V3.1"))
    assert get_chat_format(v31).name == "deepseek_v31"


@pytest.mark.slow
def test_every_llamacpp_template_gets_a_report(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """No real template of llama.cpp's set makes the doctor raise: each gives a JSON report, exit 0 or 1."""
    import agentrl.doctor as doctor_module

    names = sorted(p.stem for p in (assets_dir() / "llamacpp_templates").glob("*.jinja"))
    assert len(names) >= 60
    statuses = {}
    for name in names:
        tok = tokenizer_with("qwen3", KIMI + COHERE + GRANITE, llamacpp_template(name))
        monkeypatch.setattr(doctor_module, "load_tokenizer", lambda spec, tok=tok: tok)
        code = cli(["doctor", f"model={name}", "--json"])
        report = json.loads(capsys.readouterr().out)
        assert code == (1 if report["status"] == "FAIL" else 0), name
        statuses[name] = report["status"]
    print(json.dumps(statuses, indent=1))


def test_command_reads_cohere2_text_tags() -> None:
    """Cohere2's templates write an answer as <|START_TEXT|>...<|END_TEXT|>: the text is the content
    (a re-render would otherwise wrap it twice), and a cut answer is reported."""
    fmt = get_chat_format(family_tokenizer("Cohere2MoE"))
    parsed = fmt.parser.parse("<|START_THINKING|>hm<|END_THINKING|><|START_TEXT|>It is 42.<|END_TEXT|>")
    assert (parsed.content, parsed.reasoning, parsed.issues) == ("It is 42.", "hm", [])
    assert [i.kind for i in fmt.parser.parse("<|START_TEXT|>It is").issues] == ["unclosed_tag"]
    assert [i.kind for i in fmt.parser.parse("It is<|END_TEXT|>").issues] == ["stray_tag"]


def test_a_prompt_that_opens_cohere_thinking_makes_turns_reason() -> None:
    """Cohere2MoE's prompt ends <|START_THINKING|>: the model always reasons, so the doctor's turns do."""
    import agentrl.doctor.checks as C

    fmt = get_chat_format(family_tokenizer("Cohere2MoE"))
    assert C.prompt_opens_reasoning(fmt) and not C.thinking_off_by_default(fmt)
    assert C.as_generated(fmt, {"role": "assistant", "content": "x"})["reasoning_content"]


@pytest.mark.parametrize("name", ["Kimi-K2-Instruct", "Kimi-K2-Thinking"])
def test_kimi_templates_render_through_transformers_once_rewritten(name: str) -> None:
    """transformers itself cannot render a tool call with these templates (its sandbox refuses
    list.append); the rewrite renders every conversation as jinja renders the original unsandboxed."""
    import jinja2

    from agentrl.chat.sandbox import rewrite_list_mutations, sandbox_safe_template

    original = llamacpp_template(name)
    tok = family_tokenizer(name)
    call = {"type": "function", "id": "c1", "function": {"name": "f", "arguments": {"a": 1}}}
    messages = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "", "tool_calls": [call, call]},
                {"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}, {"role": "tool", "name": "g", "content": "r3"}]  # fmt: skip
    with pytest.raises(jinja2.exceptions.SecurityError, match="append"):
        tok.apply_chat_template(messages, tokenize=False)
    safe = sandbox_safe_template(original)
    assert safe is not None and ".append(" not in safe and ".pop(" not in safe
    plain = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(original).render(messages=messages)
    rendered = tok.apply_chat_template(messages, tokenize=False, chat_template=safe)
    assert rendered == plain and "## Return of functions.f:1\nr2" in rendered and "functions.g:2" in rendered
    assert get_chat_format(tok, training_template=False).chat_template == safe
    # Only the two queue idioms are rewritten; any other mutation, or none, keeps the template as it is.
    assert sandbox_safe_template(original.replace(".append(formatted_id)", ".extend([formatted_id])")) is None
    assert sandbox_safe_template(llamacpp_template("moonshotai-Kimi-K2")) is None
    assert rewrite_list_mutations("{%- set v = ns.q.pop(0) -%}") == "{%- set v = ns.q[0] %}{% set ns.q = ns.q[1:] -%}"


MISTRAL_SPECIAL = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                   "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[ARGS]"]  # fmt: skip


def test_mistral_nemo_keeps_its_system_prompt_in_the_derived_template(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Nemo writes the system prompt into the last user message only while that message is the last one:
    the reply that follows drops it, so no prompt is a prefix of its turn (FAIL). The derived template keeps
    it with the last user message, as the tool list and the published v3 format do: a declared WARN."""
    from chat_fixtures import build_tiny_tokenizer

    import agentrl.doctor as doctor_module
    from agentrl.chat.derived import derive_mistral_training

    nemo = llamacpp_template("mistralai-Mistral-Nemo-Instruct-2407")
    assert derive_mistral_training(read_template("mistral_tools.jinja")) is None
    derived = derive_mistral_training(nemo)
    assert derived is not None and "loop.last and system_message" not in derived
    tok = build_tiny_tokenizer(tmp_path, nemo, MISTRAL_SPECIAL, [], eos="</s>", bos="<s>")
    monkeypatch.setattr(doctor_module, "load_tokenizer", lambda spec: tok)
    verdicts = {}
    for flag in ("true", "false"):
        code = cli(["doctor", "model=nemo", f"training_template={flag}", "--json"])
        verdicts[flag] = (code, json.loads(capsys.readouterr().out))
    code, report = verdicts["true"]
    lines = [f"{c['status']} {c['name']}: {c['summary']}" for c in report["checks"]]
    assert code == 0 and report["status"] == "WARN" and report["template"].startswith("training template derived"), lines
    warned = {c["name"]: c["summary"] for c in report["checks"] if c["status"] == "WARN"}
    assert set(warned) == {"tool-call round trip", "prefix: assistant -> user -> assistant"}, lines
    assert all("Declared limitation of the 'mistral' family" in w for w in warned.values()), lines
    code, report = verdicts["false"]
    assert code == 1 and "generation prompt is not a prefix" in json.dumps(report)


# GLM-5: no registry package ships its template; tests/glm5_template.py is written from its published
# grammar (GLM-5.3's form, and GLM-5.1/5.2's reasoning gate). Both write no end of turn, and before
# issue 42b neither derivation applied (5.3's gate is `not clear_thinking or ...`, and both write tool
# results through `elif m.role == 'tool' or m.role == 'observation'`): the doctor FAILed on them.
GLM5_VARIANTS = {"glm5.3": GLM5_TEMPLATE, "glm5.1": GLM51_TEMPLATE}


@pytest.mark.parametrize("variant", sorted(GLM5_VARIANTS))
def test_glm5_gets_a_derived_template_that_ends_its_turns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    import agentrl.doctor as doctor_module
    from agentrl.chat import derived as D

    original = GLM5_VARIANTS[variant]
    tok = tokenizer_with("qwen3", GLM5_TOKENS, original)
    training = D.derive_glm_training(original)
    assert training is not None and D.verify_glm_training(tok, original, training) is None
    fmt = get_chat_format(tok)
    assert fmt.name == "glm4" and fmt.template_source.startswith("training template derived from the tokenizer's")
    answered = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "reasoning_content": "R"}]
    assert tok.apply_chat_template(answered, tokenize=False).endswith("<think>R</think>A")  # no end of turn
    assert fmt.render_text(answered, add_generation_prompt=False).endswith("<think>R</think>A<|user|>")
    monkeypatch.setattr(doctor_module, "load_tokenizer", lambda spec: tok)
    code = cli(["doctor", f"model={variant}", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "PASS" and code == 0, [f"{c['status']} {c['name']}: {c['summary']}" for c in report["checks"]]
    code = cli(["doctor", f"model={variant}", "training_template=false", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and "no stop token in the generated part" in json.dumps(report)


def test_kimi_k2_thinking_keeps_the_reasoning_of_the_trained_turn(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """K2 Thinking renders everything up to the last answer as history with empty reasoning: a final
    answer loses its own reasoning. The derived template keeps it (verified up to that reasoning), and
    the doctor runs its reasoning check instead of saying the template renders no reasoning."""
    from agentrl.chat.families_recent import derive_kimi_training, verify_kimi_training
    from agentrl.chat.sandbox import sandbox_safe_template

    tok = family_tokenizer("Kimi-K2-Thinking")
    original = sandbox_safe_template(tok.chat_template)
    derived = derive_kimi_training(original)
    assert derived is not None and derive_kimi_training(llamacpp_template("moonshotai-Kimi-K2")) is None
    assert verify_kimi_training(tok, original, derived) is None
    answered = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "reasoning_content": "R"}]
    assert tok.apply_chat_template(answered, tokenize=False, chat_template=original).endswith("<think></think>A<|im_end|>")
    assert tok.apply_chat_template(answered, tokenize=False, chat_template=derived).endswith("<think>R</think>A<|im_end|>")
    # a derivation that also drops a call turn's reasoning is rejected
    broken = derived.replace("<think>{{rc}}</think>", "<think></think>", 1)
    assert broken != derived and verify_kimi_training(tok, original, broken) is not None
    code, report = doctor_report(capsys, monkeypatch, "Kimi-K2-Thinking")
    reasoning = next(c for c in report["checks"] if c["name"] == "prefix: same, with reasoning")
    assert code == 0 and reasoning["status"] == "PASS", reasoning
    # on its own template the doctor says what it does (before issue 42b: "the template does not render reasoning_content")
    code = cli(["doctor", "model=k2t", "training_template=false", "--json"])
    reasoning = next(c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "prefix: same, with reasoning")
    assert reasoning["status"] == "SKIP" and "drops a final answer's own" in reasoning["summary"], reasoning
