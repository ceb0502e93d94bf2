"""agentrl.observe.plot: a dependency-free PNG line chart, checked with a tiny decoder written here."""

from __future__ import annotations

import math
import struct
import zlib
from pathlib import Path

import pytest

from agentrl.observe.plot import PALETTE, smooth, write_curve_png

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Parse chunks (checking every CRC), inflate IDAT, undo filter 0; returns (w, h, RGB rows)."""
    assert data[:8] == SIGNATURE
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + body), f"bad CRC on {kind!r}"
        chunks.append((kind, body))
        pos += 12 + length
    assert pos == len(data)
    kinds = [k for k, _ in chunks]
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds
    w, h, depth, color, comp, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, color, comp, filt, interlace) == (8, 2, 0, 0, 0)
    raw = zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT"))
    stride = 1 + 3 * w
    assert len(raw) == stride * h
    rows = []
    for y in range(h):
        line = raw[y * stride : (y + 1) * stride]
        assert line[0] == 0, "only filter type 0 is expected"
        rows.append(line[1:])
    return w, h, rows


def pixel(rows: list[bytes], x: int, y: int) -> tuple[int, ...]:
    return tuple(rows[y][3 * x : 3 * x + 3])


def pixels_of(rows: list[bytes], color: tuple[int, int, int]) -> list[tuple[int, int]]:
    """(x, y) of every pixel exactly ``color``."""
    want = bytes(color)
    return [(x, y) for y, row in enumerate(rows) for x in range(len(row) // 3) if row[3 * x : 3 * x + 3] == want]


def test_two_series_render_with_distinct_colours_and_rising_trend(tmp_path: Path) -> None:
    steps = list(range(0, 200, 2))
    rising = [(s, 0.1 + 0.004 * s + 0.05 * math.sin(s / 7)) for s in steps]
    flat = [(s, 0.5 + 0.02 * math.cos(s / 5)) for s in steps]
    out = write_curve_png(tmp_path / "sub" / "curve.png", {"reward": rising, "accuracy": flat},
                          title="Training", y_label="value", width=640, height=400)
    assert out == tmp_path / "sub" / "curve.png"
    data = out.read_bytes()
    assert struct.unpack(">II", data[16:24]) == (640, 400)
    w, h, rows = decode_png(data)
    assert (w, h) == (640, 400)
    assert pixel(rows, 0, 0) == pixel(rows, w - 1, h - 1) == (255, 255, 255)
    assert len(pixels_of(rows, (255, 255, 255))) > 0.6 * w * h  # mostly white background

    reward_px, acc_px = pixels_of(rows, PALETTE[0]), pixels_of(rows, PALETTE[1])
    assert len(reward_px) > 300 and len(acc_px) > 300
    left = [y for x, y in reward_px if x < w // 2]
    right = [y for x, y in reward_px if x >= w // 2]
    assert sum(right) / len(right) < sum(left) / len(left) - 50  # rising: higher up on the right


@pytest.mark.parametrize(
    "series",
    [
        {},
        {"empty": []},
        {"one": [(3, 0.7)]},
        {"const": [(i, 2.0) for i in range(40)]},
        {"zero": [(0, 0.0), (0, 0.0)]},
        {"bad": [(1, math.nan), (2, math.inf), (3, -math.inf), (math.nan, 1.0)]},
        {"mixed": [(1, 1.0), (2, math.nan), (3, 3.0), (4, None), ("x", 2), (5,), {"a": 1}, (6, 10**400)]},
        {"not a list": None, "scalar": 5},
        {"tiny": [(i, 1e-5 * (1 + i % 3)) for i in range(20)], "huge": [(i, 1.5e12 * i) for i in range(20)]},
        {"extreme": [(0, -1e308), (1, 1e308), (2, 5e-324)]},
        {"big x": [(1e9 + i * 1e6, float(i)) for i in range(50)]},
        {"many": [(i, math.sin(i / 300) + (i * 7919 % 101) / 500) for i in range(20000)]},
        {"Name with ~weird ü chars!": [(0, 0), (1, 1)], **{f"s{i}": [(0, i), (1, i)] for i in range(12)}},
    ],
)
def test_edge_cases_produce_valid_png(tmp_path: Path, series: dict) -> None:
    out = write_curve_png(tmp_path / "edge.png", series, title="edge case: 100%", y_label="y")
    w, h, rows = decode_png(out.read_bytes())
    assert (w, h) == (800, 480)
    assert pixel(rows, 0, 0) == (255, 255, 255)
    assert len(set(rows)) > 10  # something was drawn, not a blank canvas


def test_tiny_canvas_does_not_raise(tmp_path: Path) -> None:
    w, h, _ = decode_png(write_curve_png(tmp_path / "t.png", {"a": [(0, 0), (1, 1)]}, width=1, height=1).read_bytes())
    assert w >= 1 and h >= 1


def test_smooth_is_an_ema_that_skips_non_finite() -> None:
    assert smooth([1.0, 1.0, 1.0], 0.5) == [1.0, 1.0, 1.0]
    assert smooth([0.0, 10.0], 0.1) == pytest.approx([0.0, 1.0])
    out = smooth([2.0, math.nan, 4.0], 0.5)
    assert out[0] == 2.0 and math.isnan(out[1]) and out[2] == 3.0
    assert smooth([], 0.3) == []
    assert smooth([5.0, 7.0], 1.0) == [5.0, 7.0]
    with pytest.raises(ValueError):
        smooth([1.0], 0.0)
