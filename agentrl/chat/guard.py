"""User and tool content is text: it must never become a control token.

A chat template pastes message content into its markup as a string, and the tokenizer then turns
every occurrence of a special token's text into that token. So a tool result (a web page, a file,
another model's output) holding ``<|im_end|><|im_start|>assistant`` would close its own turn and
open a fake one, in the ids the policy is trained and sampled on.

:class:`ContentGuard` prevents that. Before rendering, user and tool content holding any control
text is replaced by a placeholder; the template's own text is encoded as usual, and each content
is encoded piece by piece so that no piece holds a whole control token: its ids decode back to the
same text, and none of them is a control token. Content without control text (nearly all of it)
takes the ordinary path, so its ids equal ``apply_chat_template(tokenize=True)``.

"Control text" is every special token of the tokenizer, plus every added token that the chat
template itself writes (Qwen's ``<tool_response>``, ``<think>``: added but not special), so
harmless added tokens such as Gemma's HTML tags are left alone.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.core.errors import AgentrlError

GUARDED_ROLES = frozenset({"user", "tool", "ipython", "function"})


class ForgedControlTokenError(AgentrlError, ValueError):
    """Content holds control-token text and the template changes content in a way that cannot be guarded."""


class ContentGuard:
    """Finds control text in user/tool content and encodes such content as plain text."""

    def __init__(self, tokenizer: Any, chat_template: str | None) -> None:
        template = chat_template if isinstance(chat_template, str) else getattr(tokenizer, "chat_template", None)
        template = template if isinstance(template, str) else ""
        self.controls = sorted(control_texts(tokenizer, template), key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(c) for c in self.controls)) if self.controls else None

    def has_control(self, text: str) -> bool:
        return self._pattern is not None and self._pattern.search(text) is not None

    def mask(self, messages: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """Messages with each guarded content that holds control text swapped for a placeholder,
        and placeholder -> content. Leading/trailing whitespace stays outside the placeholder, so a
        template that trims content trims the same."""
        out: list[dict[str, Any]] = []
        contents: dict[str, str] = {}
        nonce = secrets.token_hex(6)

        def swap(text: str) -> str:
            if not self.has_control(text):
                return text
            core = text.strip()
            start = text.index(core[0]) if core else 0
            key = f"AGENTRLCONTENT{nonce}N{len(contents)}X"
            contents[key] = core
            return text[:start] + key + text[start + len(core) :]

        for m in messages:
            if isinstance(m, dict) and m.get("role") in GUARDED_ROLES:
                content = m.get("content")
                if isinstance(content, str) and self.has_control(content):
                    m = {**m, "content": swap(content)}
                elif isinstance(content, list) and any(
                    isinstance(p, dict) and isinstance(p.get("text"), str) and self.has_control(p["text"]) for p in content
                ):
                    parts = [{**p, "text": swap(p["text"])} if isinstance(p, dict) and isinstance(p.get("text"), str) else p for p in content]
                    m = {**m, "content": parts}
            out.append(m)
        return out, contents

    def encode(
        self, text: str, contents: dict[str, str], encode: Callable[[str], list[int]], original: Callable[[], str]
    ) -> list[int]:
        """Ids of ``text`` (rendered with placeholders): template segments as usual, contents as text."""
        splitter = re.compile("(" + "|".join(re.escape(k) for k in contents) + ")")
        pieces = splitter.split(text)
        want = original()
        # The template wrote the content as is, or as a JSON string body (``tojson`` of a dict).
        for form in (_as_is, _json_body):
            if "".join(form(contents[p]) if p in contents else p for p in pieces) == want:
                break
        else:
            raise ForgedControlTokenError(
                "a user or tool message holds control-token text (one of "
                f"{[c for c in self.controls if any(c in v for v in contents.values())][:5]}) and the chat template "
                "rewrites message content, so it cannot be kept as plain text; clean the content before it "
                "reaches the conversation"
            )
        ids: list[int] = []
        for piece in pieces:
            if piece in contents:
                for part in self.split(form(contents[piece])):
                    ids += encode(part)
            elif piece:
                ids += encode(piece)
        return ids

    def split(self, text: str) -> list[str]:
        """``text`` cut into pieces none of which holds a whole control text (each is cut inside)."""
        out: list[str] = []
        todo = [text]
        while todo:
            piece = todo.pop()
            match = self._pattern.search(piece) if self._pattern is not None else None
            if match is None:
                if piece:
                    out.append(piece)
                continue
            cut = match.start() + max(1, (match.end() - match.start()) // 2)
            todo += [piece[cut:], piece[:cut]]  # popped in order: left first
        return out


def _as_is(text: str) -> str:
    return text


def _json_body(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


def control_texts(tokenizer: Any, template: str) -> set[str]:
    """Special tokens, and added tokens the template writes; one-character ones cannot be cut, so are left."""
    found: set[str] = set()
    for tok in getattr(tokenizer, "all_special_tokens", []) or []:
        found.add(str(tok))
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    for added in decoder.values():
        content = getattr(added, "content", str(added))
        if getattr(added, "special", False) or (content and content in template):
            found.add(content)
    return {t for t in found if len(t) >= 2}
