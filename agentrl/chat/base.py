"""One tokenizer's chat format: render conversations to ids, parse generations, bridge turns.

Training on multi-turn tool use needs the exact token sequence the model saw. Re-rendering the whole
conversation after every turn is not safe: templates rewrite history (strip reasoning, re-serialise
JSON), and a re-tokenised sample need not equal the sampled ids. So the sampled ids are kept as they
are, and only the tokens the template adds between turns are appended, after proving in token space
that the template does not rewrite what came before (:meth:`ChatFormat.bridge`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.chat.guard import ContentGuard
from agentrl.chat.parsers.base import ResponseParser
from agentrl.core.messages import Message, ParsedResponse, ParseIssue

# Tokens that end a document rather than a turn; a model may stop on them, so generation does.
_DOCUMENT_END_TOKENS = ("<|endoftext|>", "<|end_of_text|>")
_PROBE_REPLY = "agentrl probe reply"
# Outputs longer than this (characters) are parsed off the event loop by ``ChatFormat.aparse``.
OFFLOAD_CHARS = 32_768
# Pieces of template text ``ChatFormat.encode`` remembers (a few MB of text and ids at most).
ENCODED_PIECES = 4096


def encode_cut(encode: Callable[[str], list[int]], text: str, prompt: str) -> list[int]:
    """``encode(text)``, encoded in pieces that end right after each occurrence of ``prompt``."""
    if not prompt or prompt not in text:
        return encode(text)
    ids: list[int] = []
    start = 0
    while True:
        at = text.find(prompt, start)
        if at == -1:
            break
        ids += encode(text[start : at + len(prompt)])
        start = at + len(prompt)
    return ids + (encode(text[start:]) if start < len(text) else [])


@dataclass(frozen=True)
class BridgeResult:
    """Ids to append after a sampled assistant turn, or ``ids=None`` and why that is not safe."""

    ids: list[int] | None
    reason: str

    @property
    def proven(self) -> bool:
        return self.ids is not None


class ChatFormat:
    """Everything tokenizer- and template-specific about a chat model, in one object."""

    def __init__(
        self,
        tokenizer: Any,
        parser: ResponseParser,
        chat_template: str | None = None,
        name: str | None = None,
        template_source: str | None = None,
        adapt_messages: Callable[[list[Message]], list[Message]] | None = None,
        end_tokens: Sequence[str] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.parser = parser
        self.chat_template = chat_template
        self.name = name or parser.name
        # Where the template comes from ("tokenizer", "override", a bundled or training template):
        # shown in logs and by `agentrl doctor`, because it decides whether bridges can be proven.
        self.template_source = template_source or ("override" if chat_template is not None else "tokenizer")
        # Some real templates need another message shape (e.g. arguments as JSON strings).
        self._adapt = adapt_messages
        # Families whose turn end is not what follows a plain reply (Llama's <|eom_id|>, GPT-OSS's
        # <|call|>/<|return|>, where <|end|> only closes one message of a turn) name them.
        self._end_tokens = tuple(end_tokens or ())
        self._prompts: dict[Any, str] = {}  # template kwargs -> generation prompt text
        self._encoded: dict[str, list[int]] = {}  # piece of template text -> its ids (see encode)
        # After the memo above: the end-token probe encodes, and an AttributeError there used to make
        # every probe fall back to eos (Granite's <|end_of_text|> was never found).
        self._eot_ids, self._stop_ids = self._find_end_tokens()
        self._guard = ContentGuard(tokenizer, chat_template)

    def __repr__(self) -> str:
        return f"ChatFormat(name={self.name!r}, template={self.template_source!r}, eot={self.eot_token_ids})"

    # ---------------------------------------------------------------- rendering
    def render_text(
        self,
        messages: Sequence[Message],
        tools: Sequence[Message] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """The chat template's text for ``messages`` (mostly for debugging and probes)."""
        msgs = self._adapt(list(messages)) if self._adapt is not None else list(messages)
        return self.tokenizer.apply_chat_template(
            msgs,
            tools=list(tools) if tools else None,
            chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        """Ids of template text; the template writes its own BOS, so none is added (as transformers does).

        Remembered by text: a rollout encodes the same pieces over and over (renders are encoded
        in pieces that end at each generation prompt, and every turn's bridge renders the whole
        conversation twice, so an episode's earlier turns, and its group's shared first piece,
        come back every turn). Tokenization is a pure function of the text; the memory is
        dropped whole when it passes ``ENCODED_PIECES`` entries.
        """
        ids = self._encoded.get(text)
        if ids is None:
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            if len(self._encoded) >= ENCODED_PIECES:
                self._encoded.clear()
            self._encoded[text] = ids
        return list(ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids with special tokens kept, exactly as the model produced it."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Message] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> list[int]:
        """Token ids of the conversation; equal to ``apply_chat_template(..., tokenize=True)``, except
        that user and tool content is always tokenized as text (see :mod:`agentrl.chat.guard`).

        Without that, a tool result holding the text ``<|im_end|>`` (a web page, a file) is encoded
        as the control token itself and can close its turn and write a fake one.
        """
        guarded, contents = self._guard.mask(messages)
        text = self.render_text(guarded, tools, add_generation_prompt, **template_kwargs)
        prompt = self._generation_prompt(template_kwargs)

        def encode(part: str) -> list[int]:
            return self._encode_cut(part, prompt)

        if not contents:
            return encode(text)
        original = lambda: self.render_text(messages, tools, add_generation_prompt, **template_kwargs)  # noqa: E731
        return self._guard.encode(text, contents, encode, original)

    def _generation_prompt(self, template_kwargs: dict[str, Any]) -> str:
        """The text ``add_generation_prompt=True`` appends (for these template kwargs), or ''."""
        try:
            key = tuple(sorted(template_kwargs.items()))
            hash(key)
        except TypeError:
            key = None
        if key is not None and key in self._prompts:
            return self._prompts[key]
        probe = [{"role": "user", "content": "agentrl probe question"}]
        try:
            with_prompt = self.render_text(probe, add_generation_prompt=True, **template_kwargs)
            without = self.render_text(probe, add_generation_prompt=False, **template_kwargs)
            prompt = with_prompt[len(without) :] if with_prompt.startswith(without) else ""
        except Exception:
            prompt = ""
        if key is not None:
            self._prompts[key] = prompt
        return prompt

    def _encode_cut(self, text: str, prompt: str) -> list[int]:
        """Encode ``text``, cutting right after each generation prompt in it.

        The model is prompted with the generation prompt's ids and samples what follows, so a
        rendered assistant turn must be tokenized the same way: Qwen3.5 prompts with
        ``<think>\n``, and one tokenization of a turn whose reasoning is empty would merge that
        newline with the next one into a token the prompt never ends with.
        """
        return encode_cut(self.encode, text, prompt)

    # ---------------------------------------------------------------- end tokens
    @property
    def eot_token_ids(self) -> list[int]:
        """Ids that close an assistant turn: the template's own turn end, then eos."""
        return list(self._eot_ids)

    @property
    def stop_token_ids(self) -> list[int]:
        """Ids generation should stop on: end-of-turn ids plus document-end tokens."""
        return list(self._stop_ids)

    def _find_end_tokens(self) -> tuple[list[int], list[int]]:
        """The family's named end tokens, else the turn-end token read off a rendered probe reply
        (so most families need no hard-coded list), then eos."""
        tok = self.tokenizer
        vocab = tok.get_vocab()
        ids = [vocab[t] for t in self._end_tokens if t in vocab] or self._probe_end_token()
        if tok.eos_token_id is not None and tok.eos_token_id not in ids and not self._end_tokens:
            ids.append(tok.eos_token_id)
        stop = list(ids)
        for token in _DOCUMENT_END_TOKENS:
            if token in vocab and vocab[token] not in stop:
                stop.append(vocab[token])
        return ids, stop

    def _probe_end_token(self) -> list[int]:
        tok = self.tokenizer
        try:
            text = self.render_text(
                [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE_REPLY}],
                add_generation_prompt=False,
            )
            tail = text[text.rindex(_PROBE_REPLY) + len(_PROBE_REPLY) :]
            first = self.encode(tail)[:1]
        except Exception:  # a template that cannot render the probe: fall back to eos
            return []
        special = set(tok.all_special_ids) | set(tok.added_tokens_decoder)
        return first if first and first[0] in special else []

    # ---------------------------------------------------------------- parsing
    def parse(self, token_ids: Sequence[int], tools: Sequence[Message] | None = None) -> ParsedResponse:
        """Parse a generated turn; the end-of-turn token is cut off. Never raises on model output.

        ``tools`` (the schemas the prompt showed) lets families that write arguments as untyped
        text (Qwen3.5-style XML parameters) restore argument types; JSON families ignore it.
        """
        text, framing = self._decode_turn(token_ids)
        if isinstance(text, ParsedResponse):
            return text
        return self._parse_text(text, framing, tools)

    async def aparse(self, token_ids: Sequence[int], tools: Sequence[Message] | None = None) -> ParsedResponse:
        """:meth:`parse` for the rollout loop: a long output is parsed in a worker thread.

        Parsers are linear-time, but a turn of hundreds of kilobytes still takes milliseconds of
        pure Python, and every episode in flight shares the event loop. Decoding stays here (the
        Rust tokenizer is fast and not shared with another thread); only the text parse moves.
        """
        text, framing = self._decode_turn(token_ids)
        if isinstance(text, ParsedResponse):
            return text
        if len(text) < OFFLOAD_CHARS:
            return self._parse_text(text, framing, tools)
        import anyio.to_thread

        return await anyio.to_thread.run_sync(self._parse_text, text, framing, tools)

    def _decode_turn(self, token_ids: Sequence[int]) -> tuple[str | ParsedResponse, list[ParseIssue]]:
        """The turn's text with the end of turn cut off, and framing issues (or the failed result)."""
        ids = list(token_ids)
        stop = set(self._stop_ids)
        cut = next((i for i, t in enumerate(ids) if t in stop), None)
        framing: list[ParseIssue] = []
        if cut is None:
            framing.append(ParseIssue("truncated", "no end-of-turn token: generation stopped early (length cap?)"))
        else:
            if cut < len(ids) - 1:
                framing.append(ParseIssue("tokens_after_end_of_turn", f"{len(ids) - cut - 1} ids after it, ignored"))
            ids = ids[:cut]
        try:
            return self.decode(ids), framing
        except Exception as exc:  # invalid ids from a broken sampler
            return ParsedResponse(content="", issues=[*framing, ParseIssue("decode_error", repr(exc)[:300])]), framing

    def _parse_text(self, text: str, framing: list[ParseIssue], tools: Sequence[Message] | None) -> ParsedResponse:
        try:
            result = self.parser.parse_with_tools(text, tools) if tools else self.parser.parse(text)
        except Exception as exc:  # a parser bug must not kill a rollout
            return ParsedResponse(content=text, issues=[*framing, ParseIssue("parser_error", repr(exc)[:300])])
        result.issues = result.issues + framing
        return result

    def assistant_ids(
        self, messages: Sequence[Message], message: Message, tools: Sequence[Message] | None = None, prompt_ids: Sequence[int] | None = None
    ) -> list[int]:
        """The ids the model would sample after ``render(messages, tools)`` to write ``message``,
        up to and including the end-of-turn token: how a demonstrated turn enters an episode
        (agentrl/rollout/guidance.py) on the same token path as a sampled one.

        ``prompt_ids``: the ids the episode holds (the render of ``messages`` where every bridge
        was proven), so the prompt is not rendered again. Raises ``ValueError`` naming the problem
        when the template does not extend the prompt with the message, or writes no end-of-turn
        token after it.
        """
        prompt = list(prompt_ids) if prompt_ids is not None else self.render(messages, tools, add_generation_prompt=True)
        full = self.render([*messages, message], tools, add_generation_prompt=False)
        if full[: len(prompt)] != prompt:
            raise ValueError(f"the template's render of the assistant message does not extend the prompt: {self._first_difference(prompt, full)}")
        turn = full[len(prompt) :]
        eot = set(self._eot_ids)
        end = next((i for i, t in enumerate(turn) if t in eot), None)
        if end is None:
            raise ValueError(f"the template writes no end-of-turn token {self._show(self._eot_ids)} after the assistant message")
        return turn[: end + 1]

    # ---------------------------------------------------------------- bridging
    def bridge(
        self,
        messages: Sequence[Message],
        new_messages: Sequence[Message],
        ids_so_far: Sequence[int],
        tools: Sequence[Message] | None = None,
        **template_kwargs: Any,
    ) -> BridgeResult:
        """Ids that follow ``ids_so_far`` so the model sees ``new_messages`` and a new assistant header.

        ``messages`` ends with the assistant turn just parsed; ``ids_so_far`` ends with its sampled
        ids. Proven only if render(messages) is a token prefix of render(messages + new_messages)
        and the sampled turn ended with the template's end-of-turn token; otherwise ``ids`` is None.
        """
        if not messages or messages[-1].get("role") != "assistant":
            return BridgeResult(None, "messages must end with the assistant turn that was just sampled")
        try:
            a = self.render(messages, tools, add_generation_prompt=False, **template_kwargs)
            b = self.render([*messages, *new_messages], tools, add_generation_prompt=True, **template_kwargs)
        except Exception as exc:
            return BridgeResult(None, f"the chat template failed to render: {exc!r}")
        eot = set(self._eot_ids)
        last = next((i for i in range(len(a) - 1, -1, -1) if a[i] in eot), None)
        if last is None:
            return BridgeResult(None, f"render(messages) has no end-of-turn token {self._show(self._eot_ids)}")
        between = a[last + 1 :]
        if self.decode(between).strip():
            return BridgeResult(
                None, f"the template writes {self.decode(between)!r} after the last end-of-turn token, "
                "so the final assistant turn does not end with one",
            )
        if not ids_so_far or ids_so_far[-1] != a[last]:
            got = self._show(list(ids_so_far[-1:])) if ids_so_far else "nothing"
            return BridgeResult(
                None, f"the sampled ids end with {got}, not with the template's end of turn "
                f"{self._show([a[last]])} (stopped on a length cap or another stop token?)",
            )
        mismatch = self._first_difference(a, b)
        if mismatch is not None:
            return BridgeResult(None, mismatch)
        return BridgeResult(between + b[len(a) :], "proven: render(messages) is a token prefix of the next render")

    def _first_difference(self, a: list[int], b: list[int]) -> str | None:
        """None when ``a`` is a prefix of ``b``, else a precise description of where they part."""
        j = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if j is None:
            if len(a) <= len(b):
                return None
            return (
                f"not prefix-preserving: the next render is shorter ({len(b)} ids) than render(messages) "
                f"({len(a)} ids), which continues with {self.decode(a[len(b):len(b) + 8])!r}"
            )
        before = self.decode(a[max(0, j - 8) : j])
        return (
            f"not prefix-preserving: render(messages) and render(messages + new_messages) first differ at "
            f"token {j} of {len(a)}, after {before!r}: {self.decode(a[j:j + 8])!r} {a[j:j + 8]} vs "
            f"{self.decode(b[j:j + 8])!r} {b[j:j + 8]} (the template rewrites earlier turns)"
        )

    def _show(self, ids: list[int]) -> str:
        def one(i: int) -> str:
            try:
                return f"{self.decode([i])!r} ({i})"
            except Exception:
                return f"<undecodable> ({i})"

        return ", ".join(one(i) for i in ids)
