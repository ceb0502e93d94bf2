"""The HTML of ``agentrl view``: one file, inline CSS and JS, nothing fetched.

Everything that came from a model, a tool or a task goes through ``html.escape``; the page's one
script carries no data and is pinned by a Content-Security-Policy hash, so even text that escaped
escaping could not run. The script only filters, counts and folds what the HTML already shows.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from html import escape
from typing import Any

from agentrl.core.records import FAILURES
from agentrl.core.trajectory import Trajectory, Turn
from agentrl.observe.viewer.records import (
    Decoder,
    Episode,
    Segment,
    align,
    delta_bucket,
    deltas,
    ending,
    flags,
    lp_bucket,
    summary,
)

TRAINED_RGB = (198, 239, 198)  # background of sampled (trained, mask 1) tokens; tests look for it
ENV_RGB = (221, 230, 247)  # background of environment tokens (mask 0)

CSS = """
:root{--trained:rgb%s;--env:rgb%s}
body{font:14px/1.45 system-ui,-apple-system,sans-serif;margin:0;color:#1d1d1d;background:#fff}
header{padding:10px 16px 0}h1{font-size:18px;margin:0 0 2px}.note{color:#666;font-size:12px}
table.sum{border-collapse:collapse;margin:8px 16px;font-size:13px}
table.sum th{text-align:left;font-weight:600;padding:1px 14px 1px 0;color:#444;vertical-align:top}
#bar{position:sticky;top:0;z-index:2;background:#f7f7f7;border-top:1px solid #ddd;border-bottom:1px solid #ddd;padding:6px 16px;display:flex;flex-wrap:wrap;gap:6px 14px;align-items:center;font-size:13px}
#bar input[type=number]{width:5em}#bar input[type=search]{width:14em}#count{font-weight:600}
.legend span{padding:0 5px;margin-right:4px}
main{padding:4px 16px 40px}
details.group{margin:8px 0;border-left:3px solid #bbb;padding-left:8px}
details.group>summary{font-weight:600;cursor:pointer}
details.episode{margin:4px 0 4px 8px;border:1px solid #ddd;border-radius:4px}
details.episode>summary{cursor:pointer;padding:3px 8px;background:#fbfbfb}
details.episode[open]>summary{border-bottom:1px solid #ddd}
.body{padding:6px 10px}
.r{font-weight:600;padding:0 5px;border-radius:3px}.r.pos{background:#d9f2d9}.r.zero{background:#f3e1e1}
.b{display:inline-block;padding:0 6px;margin-left:4px;border-radius:8px;font-size:12px;background:#eee}
.b.error,.b.toolfail{background:#fcd5d5;color:#8a0000}.b.truncated{background:#fde7c2;color:#7a4a00}
.b.split{background:#e6dcff;color:#42208f}.b.parse{background:#fff1b8;color:#6b5500}
.muted{color:#777;font-size:12px}
pre{white-space:pre-wrap;word-break:break-word;font:12.5px/1.6 ui-monospace,SFMono-Regular,Menlo,monospace;margin:4px 0;padding:6px;background:#fcfcfc;border:1px solid #eee}
.turn{margin:8px 0;padding-left:6px;border-left:2px solid #cfe3cf}.turn h4{margin:0;font-size:13px;font-weight:600}
.s{background:var(--trained);border-bottom:3px solid transparent}
.e{background:var(--env);color:#333}.p{color:#555}
.by-lp .l1{border-bottom-color:#f2d15c}.by-lp .l2{border-bottom-color:#eea236}.by-lp .l3{border-bottom-color:#dd5a1e}.by-lp .l4{border-bottom-color:#a00000}
.by-d .d1{border-bottom-color:#cdbbff}.by-d .d2{border-bottom-color:#9b7bf0}.by-d .d3{border-bottom-color:#6a3cd6}.by-d .d4{border-bottom-color:#3a0a9a}
.nl::before{content:"\\21b5";color:#999}
.marker{margin:8px 0;padding:4px 8px;font-size:13px;border-radius:3px}
.marker.split{background:#efe8ff;border:1px dashed #7a5bd6}.marker.cut{background:#fff0d6;border:1px dashed #c98a16}
.marker.fail{background:#fde0e0;border:1px solid #d66}.marker.end{background:#f1f1f1}.marker.warn{background:#fff7c2}
table.calls{border-collapse:collapse;font-size:12.5px;margin:4px 0}
table.calls td,table.calls th{border:1px solid #e2e2e2;padding:2px 6px;vertical-align:top;text-align:left}
table.calls td.fail{background:#fde0e0}table.calls pre{margin:0;padding:0;border:0;background:none}
""" % (TRAINED_RGB, ENV_RGB)

JS = """
(function () {
  "use strict";
  var q = function (s, r) { return (r || document).querySelector(s); };
  var all = function (s, r) { return Array.prototype.slice.call((r || document).querySelectorAll(s)); };
  var episodes = all("details.episode"), groups = all("details.group"), checks = all("input[data-flag]");
  var fmin = q("#f-min"), fmax = q("#f-max"), ftext = q("#f-text"), modes = all("input[name=colour]");
  function apply() {
    var lo = parseFloat(fmin.value), hi = parseFloat(fmax.value), text = ftext.value.trim().toLowerCase();
    var need = checks.filter(function (c) { return c.checked; }).map(function (c) { return c.dataset.flag; });
    var shown = 0;
    episodes.forEach(function (ep) {
      var r = parseFloat(ep.dataset.reward), have = ep.dataset.flags.split(" ");
      var ok = !(r < lo) && !(r > hi) && need.every(function (f) { return have.indexOf(f) >= 0; }) &&
        (!text || ep.textContent.toLowerCase().indexOf(text) >= 0);
      ep.hidden = !ok;
      if (ok) shown++;
    });
    groups.forEach(function (g) {
      var n = all("details.episode:not([hidden])", g).length, total = all("details.episode", g).length;
      g.hidden = n === 0;
      q(".g-count", g).textContent = n === total ? total + " episodes" : n + " of " + total + " episodes shown";
    });
    q("#count").textContent = "showing " + shown + " of " + episodes.length + " episodes";
    document.body.dataset.shown = String(shown);
    var state = new URLSearchParams();
    if (need.length) state.set("only", need.join(","));
    if (fmin.value) state.set("min", fmin.value);
    if (fmax.value) state.set("max", fmax.value);
    if (text) state.set("q", text);
    if (document.body.classList.contains("by-d")) state.set("colour", "delta");
    try { history.replaceState(null, "", state.toString() ? "#" + state.toString() : location.pathname); } catch (e) { /* some browsers refuse on file: URLs */ }
  }
  function colour(mode) {
    document.body.classList.toggle("by-d", mode === "delta");
    document.body.classList.toggle("by-lp", mode !== "delta");
    modes.forEach(function (m) { m.checked = m.value === mode; });
  }
  function fold(open) { all("details.episode:not([hidden])").forEach(function (d) { d.open = open; }); }
  var h = new URLSearchParams(location.hash.slice(1));
  var only = (h.get("only") || "").split(",");
  checks.forEach(function (c) { c.checked = only.indexOf(c.dataset.flag) >= 0; });
  fmin.value = h.get("min") || ""; fmax.value = h.get("max") || ""; ftext.value = h.get("q") || "";
  colour(h.get("colour") === "delta" ? "delta" : "logprob");
  [fmin, fmax, ftext].concat(checks).forEach(function (el) { el.addEventListener("input", apply); });
  modes.forEach(function (m) { m.addEventListener("change", function () { colour(m.value); apply(); }); });
  q("#open-all").addEventListener("click", function () { fold(true); });
  q("#close-all").addEventListener("click", function () { fold(false); });
  apply();
  if (h.get("open") === "all") fold(true);
  document.body.dataset.ready = "1";
})();
"""

FLAG_LABELS = (("error", "episode failed"), ("toolfail", "tool failure"), ("parse", "parse issue"),
               ("truncated", "truncated"), ("split", "split"), ("trainer", "trainer logprobs"))


def render_page(episodes: list[Episode], decoder: Decoder, title: str, note: str) -> str:
    """The whole page. The first episode starts open; the others fold."""
    csp_hash = base64.b64encode(hashlib.sha256(JS.encode()).digest()).decode()
    csp = f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{csp_hash}'"
    out = [
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>",
        f"<meta http-equiv='Content-Security-Policy' content=\"{csp}\">",
        f"<title>agentrl view — {escape(title)}</title><style>{CSS}</style></head>",
        "<body class='by-lp'><header>",
        f"<h1>agentrl view</h1><div class='note'>{escape(title)} · {escape(note)}</div></header>",
        "<table class='sum' id='summary'>",
        *(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in summary(episodes)),
        "</table>",
        _toolbar(),
        "<main id='episodes'>",
    ]
    first = True
    for key, members in _groups(episodes):
        out.append(_group(key, members, decoder, open_first=first))
        first = False
    out.append(f"</main><script>{JS}</script></body></html>\n")
    return "".join(out)


def _toolbar() -> str:
    checks = "".join(f"<label><input type='checkbox' data-flag='{f}'> {label}</label>" for f, label in FLAG_LABELS)
    return (
        "<div id='bar'><span id='count'></span>"
        "<label>reward ≥ <input type='number' step='any' id='f-min'></label>"
        "<label>≤ <input type='number' step='any' id='f-max'></label>"
        f"<span>only: {checks}</span>"
        "<label>text <input type='search' id='f-text' placeholder='search episodes'></label>"
        "<span>colour: <label><input type='radio' name='colour' value='logprob' checked> sampler logprob</label>"
        "<label><input type='radio' name='colour' value='delta'> trainer − sampler</label></span>"
        "<button id='open-all' type='button'>open all</button><button id='close-all' type='button'>close all</button>"
        "<span class='legend'><span class='s'>trained token</span><span class='e'>environment token</span>"
        "<span class='p'>prompt</span><span class='muted'>underline: low p / large |Δ| is darker; hover a token for numbers</span></span>"
        "</div>"
    )


def _groups(episodes: list[Episode]) -> list[tuple[tuple[int | None, int], list[Episode]]]:
    groups: dict[tuple[int | None, int], list[Episode]] = {}
    for e in episodes:
        groups.setdefault((e.step, e.traj.group), []).append(e)
    return list(groups.items())


def _group(key: tuple[int | None, int], members: list[Episode], decoder: Decoder, open_first: bool) -> str:
    step, g = key
    task = members[0].traj.task
    rewards = " ".join(f"{e.traj.reward:g}" if e.traj.ok else "×" for e in members)
    ok = [e.traj.reward for e in members if e.traj.ok]
    mean = f" · mean {sum(ok) / len(ok):.3f}" if ok else ""
    where = (f"step {step} · " if step is not None else "") + f"group {g}"
    head = (
        f"<summary>{escape(where)} · <span class='task'>{escape(_task_label(task, members[0].traj))}</span>"
        f" · rewards {escape(rewards)}{mean} · <span class='g-count'>{len(members)} episodes</span></summary>"
    )
    body = "".join(_episode(e, decoder, open_=open_first and i == 0) for i, e in enumerate(members))
    return f"<details class='group' open>{head}{body}</details>"


def _task_label(task: dict[str, Any], traj: Trajectory) -> str:
    for key in ("question", "prompt", "instruction", "problem"):
        if isinstance(task.get(key), str):
            return _clip(task[key], 140)
    user = next((m.get("content") for m in traj.messages if m.get("role") == "user"), None)
    return _clip(str(user if user is not None else json.dumps(task, default=str)), 140)


def _episode(e: Episode, decoder: Decoder, open_: bool) -> str:
    t = e.traj
    fl = flags(t)
    reward_cls = "pos" if t.reward > 0 else "zero"
    parts = [f"#{escape(str(t.index))}", f"<span class='r {reward_cls}'>reward {t.reward:g}</span>"]
    comps = ", ".join(f"{k}={v:g}" if v is not None else f"{k}=n/a" for k, v in t.rewards.items())
    if comps:
        parts.append(f"<span class='muted'>({escape(comps)})</span>")
    parts.append(f"{len(t.turns)} turns · {t.num_sampled} sampled tokens · {escape(t.finish_reason or '?')}")
    kinds = [r.kind for turn in t.turns for r in turn.tool_records]
    bad = sorted({k for k in kinds if k != "ok"})
    badges = []
    if t.guided:
        badges.append("<span class='b' title='guidance: the assistant turns are the environment&#x27;s demonstration, not samples (no sampler log-probabilities)'>demonstration</span>")
    if t.error:
        badges.append("<span class='b error'>episode failed</span>")
    if e.problems:
        badges.append(f"<span class='b error' title='{escape('; '.join(e.problems))}'>bad record: {escape(_clip('; '.join(e.problems), 200))}</span>")
    if bad:
        cls = "toolfail" if set(bad) & FAILURES else ""
        badges.append(f"<span class='b {cls}'>tools: {escape(', '.join(bad))}</span>")
    if "parse" in fl:
        badges.append("<span class='b parse'>parse issue</span>")
    if t.truncated:
        badges.append("<span class='b truncated'>truncated</span>")
    if t.splits:
        badges.append(f"<span class='b split'>split ×{t.splits}</span>")
    d = deltas(t)
    if d:
        badges.append(f"<span class='b'>max |Δ| {max(abs(x) for x in d):.1e}</span>")
    attrs = f"class='episode' data-reward='{escape(repr(t.reward))}' data-flags='{escape(' '.join(fl))}'" + (" open" if open_ else "")
    head = f"<summary>{' '.join(parts)}{''.join(badges)}</summary>"
    return f"<details {attrs}>{head}<div class='body'>{_episode_body(t, decoder)}</div></details>"


def _episode_body(t: Trajectory, decoder: Decoder) -> str:
    out = [f"<div class='muted'>task {escape(_clip(json.dumps(t.task, default=str, ensure_ascii=False), 600))} · seed {escape(str(t.seed))} · {t.duration_s:.2f} s</div>"]
    views, problem = align(t)
    if problem:
        out.append(f"<div class='marker warn'>the turn records do not match the token mask, so tokens are grouped by the mask alone: {escape(problem)}</div>")
    for view in views:
        sample = t.samples[view.index]
        if view.index > 0:
            reason = next((s.turn.bridge for s in views[view.index - 1].segments[-1:] if s.turn), "split")
            out.append(
                f"<div class='marker split'>✂ {escape(reason)} — the episode continues as sample {view.index + 1}, "
                "a separate training sequence started from a fresh render of the conversation</div>"
            )
        out.append(
            f"<details class='prompt'><summary class='muted'>sample {view.index + 1} prompt · {len(sample.prompt_ids)} tokens (not trained)</summary>"
            f"<pre class='p'>{escape(decoder.text(sample.prompt_ids))}</pre></details>"
        )
        for seg in view.segments:
            out.append(_segment(seg, t, view.index, decoder))
    kind = "fail" if t.error else "cut" if t.truncated else "end"
    out.append(f"<div class='marker {kind}'>{escape(ending(t))}</div>")
    return "".join(out)


def _segment(seg: Segment, t: Trajectory, k: int, decoder: Decoder) -> str:
    sample = t.samples[k]
    ids = sample.completion_ids
    out = ["<div class='turn'>"]
    turn = seg.turn
    if turn is not None:
        bridge = f" · bridge {turn.bridge}" if turn.bridge else ""
        out.append(
            f"<h4>turn {turn.index + 1} · {seg.mid - seg.start} sampled + {seg.end - seg.mid} environment tokens"
            f" · generation {turn.generation_s:.2f} s · environment {turn.env_s:.2f} s · finish {escape(turn.finish_reason)}"
            f" · reward {turn.reward:g}{escape(bridge)}</h4>"
        )
    else:
        out.append(f"<h4>{seg.mid - seg.start} sampled + {seg.end - seg.mid} environment tokens</h4>")
    spans = []
    trainer = sample.trainer_logprobs
    context = (sample.prompt_ids + ids[: seg.start])[-16:]
    for i, piece in zip(range(seg.start, seg.mid), decoder.pieces(ids[seg.start : seg.mid], context)):
        lp = sample.logprobs[i] if i < len(sample.logprobs) else 0.0
        cls = f"s l{lp_bucket(lp)}"
        tip = f"token {i} · id {ids[i]} · logprob {lp:.4f} (p {_p(lp)})"
        if trainer is not None and i < len(trainer):
            delta = trainer[i] - lp
            cls += f" d{delta_bucket(delta)}"
            tip += f" · trainer {trainer[i]:.4f} · Δ {delta:+.2e}"
        if "\n" in piece:
            cls += " nl"
        spans.append(f"<span class='{cls}' title='{escape(tip)}'>{escape(piece)}</span>")
    if seg.end > seg.mid:
        n = seg.end - seg.mid
        spans.append(f"<span class='e' title='{n} environment tokens (mask 0)'>{escape(decoder.text(ids[seg.mid : seg.end]))}</span>")
    out.append(f"<pre class='tok'>{''.join(spans)}</pre>")
    if turn is not None:
        out.append(_calls(turn))
        if turn.parse_issues:
            issues = "; ".join(f"{i.get('kind')}: {i.get('detail', '')}" for i in turn.parse_issues)
            out.append(f"<div class='marker warn'>parse issues: {escape(issues)}</div>")
    out.append("</div>")
    return "".join(out)


def _calls(turn: Turn) -> str:
    """The turn's tool calls with arguments, outcome, latency and what the tool sent back."""
    calls = turn.message.get("tool_calls") or []
    records = {r.call_id: r.to_dict() for r in turn.tool_records}
    replies = {m.get("tool_call_id"): m.get("content") for m in turn.env_messages if m.get("role") == "tool"}
    if not calls and not turn.tool_records:
        return ""
    rows = ["<table class='calls'><tr><th>tool</th><th>arguments</th><th>outcome</th><th>latency</th><th>result</th></tr>"]
    seen = set()
    for call in calls:
        fn = call["function"] if isinstance(call, dict) and isinstance(call.get("function"), dict) else {}
        rec = records.get(call.get("id"), {})
        seen.add(call.get("id"))
        rows.append(_call_row(str(fn.get("name", "?")), fn.get("arguments"), rec, replies.get(call.get("id"), rec.get("detail", ""))))
    for cid, rec in records.items():
        if cid not in seen:
            rows.append(_call_row(str(rec.get("tool", "?")), None, rec, rec.get("detail", "")))
    rows.append("</table>")
    return "".join(rows)


def _call_row(name: str, arguments: Any, rec: dict[str, Any], result: Any) -> str:
    args = arguments if isinstance(arguments, str) else "–" if arguments is None else _json(arguments)
    kind = str(rec.get("kind", "not run"))
    latency = f"{rec['latency_s'] * 1000:.1f} ms" if isinstance(rec.get("latency_s"), int | float) else "–"
    cls = " class='fail'" if kind in FAILURES else ""
    return (
        f"<tr><td>{escape(name)}</td><td><pre>{escape(args)}</pre></td><td{cls}>{escape(kind)}</td>"
        f"<td>{latency}</td><td><pre>{escape(_clip(str(result or ''), 2000))}</pre></td></tr>"
    )


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (ValueError, RecursionError):  # circular or too deep to show
        return str(type(value).__name__)


def _p(logprob: float) -> str:
    return f"{math.exp(min(0.0, logprob)):.3f}"


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
