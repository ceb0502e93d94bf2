"""Chat templates that mutate a list, rewritten so that transformers' sandbox renders them.

transformers renders every chat template in jinja's ``ImmutableSandboxedEnvironment``, which refuses
a list's mutating methods. Kimi K2 Instruct (0905) and K2 Thinking queue their call ids with
``{% set _ = ns.ids.append(id) %}`` and take them back with ``ns.ids.pop(0)``: transformers raises
``SecurityError`` on every conversation holding a tool call, so a tokenizer carrying either template
cannot render one tool turn (TRL and vLLM render through transformers the same way). The templates
mean nothing that needs mutation: :func:`sandbox_safe_template` rewrites exactly these two idioms on a
namespace attribute into their immutable equivalents,

    {% set _ = NS.ATTR.append(EXPR) %}  ->  {% set NS.ATTR = NS.ATTR + [EXPR] %}
    {% set V = NS.ATTR.pop(0) %}        ->  {% set V = NS.ATTR[0] %}{% set NS.ATTR = NS.ATTR[1:] %}

and returns the rewrite only where the original is refused by transformers' sandbox, no other list
mutation is left, and both templates render the same text for every probe conversation in jinja's
ordinary sandbox (which allows the mutation but nothing else the immutable one forbids).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

_APPEND = re.compile(r"\{%(-?)\s*set\s+\w+\s*=\s*(\w+\.\w+)\.append\(([^%]*?)\)\s*(-?)%\}")
_POP_FIRST = re.compile(r"\{%(-?)\s*set\s+(\w+)\s*=\s*(\w+\.\w+)\.pop\(\s*0\s*\)\s*(-?)%\}")
_MUTATION = re.compile(r"\.(append|pop|extend|insert|remove|clear|sort|reverse|update|setdefault|popitem)\(")
# What is said wherever the rewrite is used instead of the tokenizer's text.
NOTE = "list.append/pop rewritten as immutable updates, which transformers' sandbox allows (renders alike, verified)"


def rewrite_list_mutations(template: str) -> str:
    """``template`` with the two queue idioms rewritten (unchanged where it has neither)."""
    out = _APPEND.sub(r"{%\1 set \2 = \2 + [\3] \4%}", template)
    return _POP_FIRST.sub(r"{%\1 set \2 = \3[0] %}{% set \3 = \3[1:] \4%}", out)


@functools.lru_cache(maxsize=32)
def sandbox_safe_template(template: str | None) -> str | None:
    """The rewrite of ``template`` where transformers' sandbox refuses the original and the rewrite
    renders alike; None everywhere else (the template is then used as it is)."""
    if not isinstance(template, str) or not _MUTATION.search(template):
        return None
    rewritten = rewrite_list_mutations(template)
    if rewritten == template or _MUTATION.search(rewritten) or not _refused_by_transformers(template):
        return None
    return rewritten if _renders_alike(template, rewritten) else None


_CALL = {"type": "function", "id": "callprobe", "function": {"name": "lookup", "arguments": {"word": "x"}}}


def _conversations() -> list[tuple[list[dict[str, Any]], Any, dict[str, Any]]]:
    """A turn with two calls and three results (one addressed by id, one by name, one by neither),
    then the seeded conversations training templates are checked on."""
    from agentrl.chat.training import random_conversations

    first = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "", "tool_calls": [_CALL, _CALL]},
             {"role": "tool", "tool_call_id": "callprobe", "content": "1"}, {"role": "tool", "content": "2"},
             {"role": "tool", "name": "lookup", "content": "3"}]  # fmt: skip
    conversations = random_conversations(8, seed=0)
    return [(first, conversations[0][1], {}), *conversations]


def _environment(immutable: bool) -> Any:
    """A jinja sandbox set up as transformers sets up its own (blocks trimmed, loop controls, its
    ``tojson`` and ``raise_exception``); ``immutable`` is transformers' choice."""
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    kind = ImmutableSandboxedEnvironment if immutable else SandboxedEnvironment
    env = kind(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def _renders(env: Any, template: str) -> list[str]:
    """The template's text for every check conversation, with and without a generation prompt."""
    compiled = env.from_string(template)
    out = []
    for messages, tools, kwargs in _conversations():
        for gen in (True, False):
            context = {
                "messages": messages,
                "tools": tools,
                "add_generation_prompt": gen,
                "bos_token": "",
                "eos_token": "",
            }
            out.append(compiled.render(**context, **kwargs))
    return out


def _refused_by_transformers(template: str) -> bool:
    """Whether the immutable sandbox transformers renders in raises its SecurityError on the checks."""
    from jinja2.exceptions import SecurityError

    try:
        _renders(_environment(immutable=True), template)
    except SecurityError:
        return True
    except Exception:
        return False
    return False


def _renders_alike(original: str, rewritten: str) -> bool:
    """Both templates give the same texts in the mutable sandbox, and the rewrite renders in the immutable one."""
    try:
        return (
            _renders(_environment(immutable=False), original)
            == _renders(_environment(immutable=False), rewritten)
            == _renders(_environment(immutable=True), rewritten)
        )
    except Exception:
        return False
