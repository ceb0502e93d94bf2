"""benchmarks/head_dispatch.py counts the fused head's ops at this checkout, eager tiles and
compiled ones (its call broke once when the head's forward took one more argument)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import head_dispatch  # noqa: E402


def test_head_dispatch_counts_eager_and_compiled_tiles():
    mod = head_dispatch._module(None)
    eager = head_dispatch.measure(mod, positions=300, hidden=8, vocab=2000, chunk=64, repeats=1)
    assert (eager["tile_rows"], eager["tile_cols"]) == mod.tile_shape(64, 2000)
    ops, calls = head_dispatch.count_compiled(positions=300, vocab=2000, chunk=64)
    tiles = -(-300 // eager["tile_rows"]) * -(-2000 // eager["tile_cols"])
    assert calls == 2 * tiles  # one compiled call per tile forward, one backward
    assert 0 < ops < eager["ops"]
