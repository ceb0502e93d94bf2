"""``agentrl view``: the command around the viewer (``viewer`` reads and aligns episodes,
``viewer_html`` writes the page; this module joins them, so neither imports the other's caller)."""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import Field

from agentrl.cli.help import format_help
from agentrl.core.strict import Strict
from agentrl.observe.viewer.html import render_page
from agentrl.observe.viewer.records import (
    USAGE,
    Decoder,
    ViewError,
    find_input,
    load_tokenizer,
    read_episodes,
    tokenizer_candidates,
)


class ViewConfig(Strict):
    """``agentrl view``'s keys, for ``--help`` and for ``parse_args``'s list of known keys."""

    source: str = Field(description="a run folder (its samples.jsonl), an eval folder, or a results.jsonl / samples.jsonl file; 'source=' may be left out")
    out: str | None = Field(None, description="the HTML file to write (None: view.html in the folder given, else the input's name with .html)")
    tokenizer: str | None = Field(None, description="a tokenizer folder or hub id to decode tokens with, or 'none' for ids only (None: the run's own: its latest checkpoint's, else its configured model's)")


def parse_args(args: list[str]) -> dict[str, str]:
    opts: dict[str, str] = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep:
            if "source" in opts:
                raise ViewError(f"one input at a time: got {opts['source']!r} and {arg!r}\n{USAGE}")
            opts["source"] = arg
        elif key in ViewConfig.model_fields:
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
    if any(a in ("-h", "--help", "help") for a in args):
        print(format_help(f"{USAGE}\n\nwrite an HTML page of a run's or an eval's trajectories", ViewConfig, config_files=False))
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
