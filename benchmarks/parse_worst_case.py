"""Worst parse time per chat format on hostile text (issue 17: parsers must be linear-time).

For every parser (each registered chat format parses with one of them; the table names the
formats of each row), every case of ``agentrl.chat.fuzz.worst_cases`` (each tag repeated, tag + JSON
opener repeated, deep nesting, one unterminated string, a random mix) is parsed at 100 KB and at
1 MB; the table shows the slowest case per format and size. Parsing goes through the parser's
``parse_with_tools`` (the text path of ``ChatFormat.parse``, without the tokenizer's decode).
A case that takes longer than ``--give-up`` seconds at 100 KB is not tried at 1 MB.

Usage: python benchmarks/parse_worst_case.py [--sizes 100000 1000000] [--formats hermes qwen3_xml]
(``--formats`` takes parser or chat-format names; a format is benchmarked through its parser.)
"""

from __future__ import annotations

import argparse
import platform
import time

from agentrl.chat import available_formats, available_parsers, format_spec, get_parser
from agentrl.chat.fuzz import worst_cases

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]


def time_parse(parser_name: str, text: str) -> tuple[float, str]:
    parser = get_parser(parser_name)
    t0 = time.perf_counter()
    try:
        parser.parse_with_tools(text, TOOLS)
        outcome = "ok"
    except Exception as exc:  # reported, not hidden: parse must never raise
        outcome = f"RAISED {type(exc).__name__}"
    return time.perf_counter() - t0, outcome


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--formats", nargs="+", default=available_parsers())
    ap.add_argument("--give-up", type=float, default=5.0)
    args = ap.parse_args()
    users: dict[str, list[str]] = {}
    for fmt in available_formats():
        users.setdefault(format_spec(fmt).parser, []).append(fmt)
    names = list(dict.fromkeys(n if n in available_parsers() else format_spec(n).parser for n in args.formats))
    print(f"# {platform.processor() or platform.machine()}, python {platform.python_version()}")
    print("| parser | formats | size | worst case | worst time (s) | cases | raised |")
    print("|---|---|---|---|---|---|---|")
    slow: set[tuple[str, str]] = set()
    for name in names:
        formats = ", ".join(users.get(name, [])) or "(none)"
        for size in args.sizes:
            worst, worst_case, raised, n = 0.0, "", 0, 0
            for case, text in worst_cases(name, size).items():
                if (name, case) in slow:
                    continue
                seconds, outcome = time_parse(name, text)
                n += 1
                raised += outcome != "ok"
                if seconds > args.give_up:
                    slow.add((name, case))
                if seconds > worst:
                    worst, worst_case = seconds, case
            print(f"| {name} | {formats} | {size:,} | {worst_case} | {worst:.3f} | {n} | {raised} |", flush=True)


if __name__ == "__main__":
    main()
