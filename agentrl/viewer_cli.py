"""``agentrl view``: the command around the viewer (``viewer`` reads and aligns episodes,
``viewer_html`` writes the page; this module joins them, so neither imports the other's caller)."""

from __future__ import annotations

import sys
from pathlib import Path

from agentrl.viewer import USAGE, Decoder, ViewError, find_input, load_tokenizer, read_episodes, tokenizer_candidates
from agentrl.viewer_html import render_page


def parse_args(args: list[str]) -> dict[str, str]:
    opts: dict[str, str] = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep:
            if "source" in opts:
                raise ViewError(f"one input at a time: got {opts['source']!r} and {arg!r}\n{USAGE}")
            opts["source"] = arg
        elif key in ("source", "out", "tokenizer"):
            opts[key] = value
        else:
            raise ViewError(f"unknown option {key!r} (known: out=, tokenizer=)\n{USAGE}")
    if "source" not in opts:
        raise ViewError(USAGE)
    return opts


def build_page(source: str | Path, tokenizer: str | None = None) -> tuple[str, int, str]:
    """The HTML of ``source``, its episode count and how tokens were decoded.

    ``tokenizer``: a path or hub id, "none" for ids only, or None to find the run's own.
    """
    jsonl = find_input(Path(source))
    episodes = read_episodes(jsonl)
    if tokenizer == "none":
        tok, note = None, "tokens shown as ids (tokenizer=none)"
    else:
        tok, note = load_tokenizer([tokenizer] if tokenizer else tokenizer_candidates(jsonl))
    return render_page(episodes, Decoder(tok), title=str(jsonl), note=note), len(episodes), note


def main(args: list[str]) -> int:
    if any(a in ("-h", "--help", "help") for a in args[:1]):
        print(USAGE)
        return 0
    try:
        opts = parse_args(args)
        source = Path(opts["source"])
        jsonl = find_input(source)
        out = Path(opts.get("out") or (source / "view.html" if source.is_dir() else jsonl.with_suffix(".html")))
        page, n, note = build_page(jsonl, opts.get("tokenizer"))
    except ViewError as exc:
        print(f"agentrl view: {exc}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    print(f"wrote {out} ({n} episodes, {len(page.encode()) / 1e6:.2f} MB; {note})")
    return 0
