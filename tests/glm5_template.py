"""A GLM-5 chat template written for agentrl's tests from GLM-5's published token grammar.

No registry package ships a GLM-5 template, so this one is written here (it is not a copy of Z.ai's
text; the tool prompt is our own words). What it reproduces is what the token check depends on, as
read by hand in the GLM-5.x ``chat_template.jinja`` files (zai-org/GLM-5.1 .. GLM-5.3-Flash) quoted in
public code:

- ``[gMASK]<sop>``, then ``<|system|>`` / ``<|user|>`` / ``<|assistant|>`` / ``<|observation|>`` role
  tokens and no end-of-turn token at all: a turn ends where the next role token begins, and the
  model stops on ``<|user|>`` or ``<|observation|>``;
- calls as ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>`` with no
  newlines, strings raw and other values JSON;
- every tool message written as ``<|observation|><tool_response>...</tool_response>`` (the branch
  reads ``m.role == 'tool' or m.role == 'observation'``);
- ``clear_thinking`` defaulting to false and the reasoning gate
  ``(not clear_thinking or loop.index0 > ns.last_user_index) and reasoning_content is defined``, a
  hidden block written ``<think></think>``; the generation prompt ``<|assistant|><think>``.

:data:`GLM51_GATE` is GLM-5.1's / 5.2's form of that gate (``clear_thinking`` undefined by default).
"""

from __future__ import annotations

GLM5_TEMPLATE = r"""[gMASK]<sop>
{%- set clear_thinking = clear_thinking if clear_thinking is defined else false -%}
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions, whose signatures follow, one JSON object per line:
<tools>
{% for tool in tools %}
{%- if 'function' in tool -%}{%- set tool = tool['function'] -%}{%- endif -%}
{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}
</tools>

Call a function as: <tool_call>{function-name}<arg_key>{key}</arg_key><arg_value>{value}</arg_value>...</tool_call>
{%- endif -%}
{%- macro visible_text(content) -%}
{%- if content is string -%}{{- content -}}
{%- elif content is iterable and content is not mapping -%}
{%- for item in content -%}{%- if item is mapping and item.type == 'text' -%}{{- item.text -}}{%- elif item is string -%}{{- item -}}{%- endif -%}{%- endfor -%}
{%- elif content is not none -%}{{- content -}}
{%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_user_index=-1) -%}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user_index = loop.index0 -%}{%- endif %}{%- endfor %}
{%- for m in messages -%}
{%- if m.role == 'user' -%}<|user|>{{ visible_text(m.content) }}
{%- elif m.role == 'assistant' -%}
<|assistant|>
{%- set content = visible_text(m.content) %}
{%- if m.reasoning_content is string %}
    {%- set reasoning_content = m.reasoning_content %}
{%- elif '</think>' in content %}
    {%- set reasoning_content = content.split('</think>')[0].split('<think>')[-1] %}
    {%- set content = content.split('</think>')[-1] %}
{%- endif %}
{%- if (not clear_thinking or loop.index0 > ns.last_user_index) and reasoning_content is defined -%}
{{ '<think>' + reasoning_content + '</think>' }}
{%- else -%}
{{ '<think></think>' }}
{%- endif -%}
{%- if content.strip() -%}{{ content.strip() }}{%- endif -%}
{% if m.tool_calls %}
{% for tc in m.tool_calls %}
{%- if tc.function %}{%- set tc = tc.function %}{%- endif %}
{{- '<tool_call>' ~ tc.name -}}
{% for k, v in tc.arguments.items() %}<arg_key>{{ k }}</arg_key><arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>{% endfor %}</tool_call>{% endfor %}
{% endif %}
{%- elif m.role == 'tool' or m.role == 'observation' -%}
<|observation|>{{ '<tool_response>' + visible_text(m.content) + '</tool_response>' }}
{%- elif m.role == 'system' -%}
<|system|>{{ visible_text(m.content) }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    <|assistant|><think>
{%- endif -%}"""

# GLM-5.1 / 5.2: reasoning kept only after the last user message unless clear_thinking=false is passed.
GLM5_GATE = "(not clear_thinking or loop.index0 > ns.last_user_index) and reasoning_content is defined"
GLM51_GATE = "((clear_thinking is defined and not clear_thinking) or loop.index0 > ns.last_user_index) and reasoning_content is defined"
GLM51_TEMPLATE = GLM5_TEMPLATE.replace(
    "{%- set clear_thinking = clear_thinking if clear_thinking is defined else false -%}\n", ""
).replace(GLM5_GATE, GLM51_GATE)
assert GLM51_TEMPLATE.count(GLM51_GATE) == 1 and "else false" not in GLM51_TEMPLATE

GLM_TOKENS = ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<arg_key>", "</arg_key>",
              "<arg_value>", "</arg_value>")  # fmt: skip
