"""Dependency-free line charts written straight to PNG.

Why: the trainer writes a reward-curve PNG at the end of every run, and a plotting library
(matplotlib, Pillow) is a heavy install for one picture. This module rasterises the chart
itself (a 5x7 bitmap font, anti-aliased thick lines) and encodes the PNG with zlib + struct.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["PALETTE", "smooth", "write_curve_png"]

# Distinct, colour-blind-friendly-ish series colours (the matplotlib "tab10" cycle).
PALETTE: list[tuple[int, int, int]] = [
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
    (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207),
]
WHITE, INK, AXIS, GRID = (255, 255, 255), (30, 30, 30), (90, 90, 90), (228, 228, 228)

# 5x7 glyphs: seven base-32 digits per glyph, one per row, bit 4 = leftmost pixel.
_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz.,-+:/_()%=@?"
_BITS = (
    "ehjlphe4c4444eeh1248vv2421he26aiv22vgu11he68guhhev124888ehhehheehhf12cehhhvhhuhhuhhu"
    "ehggghesihhhisvgguggvvggugggehgnhhfhhhvhhhe44444e72222ichikokihggggggvhrllhhhhhpljhh"
    "ehhhhheuhhugggehhhliduhhukihfgge11uv444444hhhhhhehhhhha4hhhlllahha4ahhhhha444v1248gv"
    "00e1fhfggmphhu00egghe11djhhf00ehvge698s8880fhhf1eggmphhh40c444e20622icggikokic44444e"
    "00qllhh00mphhh00ehhhe00uhugg00djf1100mpggg00ege1u88s889600hhhjd00hhha400hhlla00ha4ah"
    "00hhf1e00v248v00000cc0000c48000v000044v4400cc0cc001248g0000000v24888428422248op248j3"
    "00v0v00eh1dlleeh12404"
)
_FONT: dict[str, list[int]] = {
    c: [int(d, 32) for d in _BITS[7 * i : 7 * i + 7]] for i, c in enumerate(_CHARS)
}
_FONT[" "] = [0] * 7
SCALE = 2  # glyph pixel size; 5x7 at x1 is too small to read on a modern screen


def smooth(values: Sequence[float], alpha: float = 0.1) -> list[float]:
    """Exponential moving average ``s = alpha * x + (1 - alpha) * s_prev`` (small alpha = smoother).

    Noisy per-step rewards hide the trend; this is the line people actually read. Non-finite
    inputs give NaN at their position (so they are skipped when plotted) without poisoning
    the running average.
    """
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    out: list[float] = []
    s: float | None = None
    for v in values:
        v = float(v)
        if not math.isfinite(v):
            out.append(math.nan)
            continue
        s = v if s is None else alpha * v + (1.0 - alpha) * s
        out.append(s)
    return out


class _Canvas:
    """An RGB framebuffer with alpha blending, so lines and text can be anti-aliased."""

    def __init__(self, w: int, h: int) -> None:
        self.w, self.h = w, h
        self.buf = bytearray(b"\xff" * (w * h * 3))

    def blend(self, x: int, y: int, c: tuple[int, int, int], a: float = 1.0) -> None:
        if 0 <= x < self.w and 0 <= y < self.h and a > 0.0:
            i = 3 * (y * self.w + x)
            if a >= 1.0:
                self.buf[i : i + 3] = bytes(c)
            else:
                b = self.buf
                b[i], b[i + 1], b[i + 2] = (round(b[i + k] * (1 - a) + c[k] * a) for k in range(3))

    def rect(self, x0: int, y0: int, x1: int, y1: int, c: tuple[int, int, int]) -> None:
        """Fill the inclusive rectangle; also used for 1-px axis and grid lines."""
        for y in range(max(y0, 0), min(y1, self.h - 1) + 1):
            for x in range(max(x0, 0), min(x1, self.w - 1) + 1):
                self.blend(x, y, c)

    def text(self, x: int, y: int, s: str, c: tuple[int, int, int], vertical: bool = False) -> None:
        """Draw ``s`` with its top-left at (x, y); ``vertical`` reads bottom-to-top from (x, y)."""
        for n, ch in enumerate(s):
            rows = _FONT.get(ch, _FONT["?"])
            for gy, bits in enumerate(rows):
                for gx in range(5):
                    if bits & (16 >> gx):
                        u, v = (n * 6 + gx) * SCALE, gy * SCALE
                        for dy in range(SCALE):
                            for dx in range(SCALE):
                                if vertical:
                                    self.blend(x + v + dy, y - u - dx, c)
                                else:
                                    self.blend(x + u + dx, y + v + dy, c)

    def to_png(self) -> bytes:
        """Encode as 8-bit RGB PNG: signature, IHDR, one IDAT (filter 0 on every row), IEND."""
        stride = self.w * 3
        raw = b"".join(b"\x00" + bytes(self.buf[y * stride : (y + 1) * stride]) for y in range(self.h))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        ihdr = struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
                + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def _text_width(s: str) -> int:
    return max(0, len(s) * 6 - 1) * SCALE


def _stroke(cov: dict[tuple[int, int], float], x0: float, y0: float, x1: float, y1: float, r: float) -> None:
    """Add the coverage of a round-capped segment of half-width ``r`` into ``cov`` (max, not sum).

    Taking the max per pixel over a whole polyline keeps the joints from getting darker than
    the segments, which happens if every segment is blended separately.
    """
    steep = abs(y1 - y0) > abs(x1 - x0)
    if steep:  # walk along the major axis so the work is length x thickness, not the bounding box
        x0, y0, x1, y1 = y0, x0, y1, x1
    if x0 > x1:
        x0, y0, x1, y1 = x1, y1, x0, y0
    dx, dy = x1 - x0, y1 - y0
    slope = dy / dx if dx else 0.0
    band = r * math.sqrt(1 + slope * slope) + 1.0
    inv = 1.0 / (dx * dx + dy * dy) if dx or dy else 0.0
    edge, get = r + 0.5, cov.get
    for px in range(math.floor(x0 - r - 1), math.ceil(x1 + r + 1) + 1):
        ex = px - x0
        yc = y0 + slope * (px - x0 if x0 <= px <= x1 else (0.0 if px < x0 else dx))
        for py in range(math.floor(yc - band), math.ceil(yc + band) + 1):
            ey = py - y0
            t = (ex * dx + ey * dy) * inv  # nearest point on the segment (if/elif beats min/max here)
            if t < 0.0:
                t = 0.0
            elif t > 1.0:
                t = 1.0
            a = edge - math.sqrt((ex - t * dx) ** 2 + (ey - t * dy) ** 2)
            if a > 0:
                key = (py, px) if steep else (px, py)
                if a > get(key, 0.0):
                    cov[key] = min(a, 1.0)


def _clean(points: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Keep finite numeric (x, y) pairs, clamped so spans cannot overflow, sorted by x."""
    out: list[tuple[float, float]] = []
    try:
        points = list(points)
    except TypeError:  # e.g. None instead of a list
        return out
    for p in points:
        try:
            x, y = float(p[0]), float(p[1])
        except (TypeError, ValueError, LookupError, OverflowError):
            continue
        if math.isfinite(x) and math.isfinite(y):
            out.append((min(max(x, -1e300), 1e300), min(max(y, -1e300), 1e300)))
    out.sort(key=lambda p: p[0])
    return out


def _ticks(lo: float, hi: float) -> tuple[float, float, list[float]]:
    """Widen [lo, hi] to "nice" bounds and return (lo, hi, ~5 ticks at multiples of 1, 2 or 5)."""
    if hi - lo <= 1e-12 * max(abs(lo), abs(hi)):  # constant (or single-point) data
        pad = abs(lo) * 0.1 if abs(lo) > 1e-300 else 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / 4
    mag = 10.0 ** math.floor(math.log10(raw))
    norm = raw / mag
    step = mag * (1 if norm < 1.5 else 2 if norm < 3 else 5 if norm < 7 else 10)
    lo, hi = math.floor(lo / step) * step, math.ceil(hi / step) * step
    n = int(round((hi - lo) / step))
    return lo, hi, [lo + i * step for i in range(n + 1)]


def _fmt(v: float, digits: int | None = None) -> str:
    """Compact tick label: 0.25, 12k, 3.5M, 1.2e-05."""
    if digits is not None:
        return f"{v:.{digits}g}"
    a = abs(v)
    if a < 1e-300:
        return "0"
    if a >= 1e9 or a < 1e-3:
        return f"{v:.2g}"
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.6f}".rstrip("0").rstrip(".")


def _labels(ticks: list[float]) -> list[str]:
    """Format ticks compactly, adding significant digits only if labels would collide."""
    step = (ticks[1] - ticks[0]) if len(ticks) > 1 else 1.0
    ticks = [0.0 if abs(t) < step * 1e-9 else t for t in ticks]  # -1e-17 would print as "-1e-17"
    labels = [_fmt(t) for t in ticks]
    digits = 3
    while len(set(labels)) < len(labels) and digits <= 15:
        labels, digits = [_fmt(t, digits) for t in ticks], digits + 1
    return labels


def write_curve_png(
    path: str | Path,
    series: dict[str, list[tuple[float, float]]],
    title: str = "",
    x_label: str = "step",
    y_label: str = "",
    width: int = 800,
    height: int = 480,
) -> Path:
    """Render named (x, y) series as a line chart and write it as an RGB PNG; return the path.

    Non-finite points are skipped, an empty chart says "no data", and series with fewer than
    30 points also get a dot per point so sparse runs are readable. Never raises on odd data.
    """
    width, height = max(int(width), 16), max(int(height), 16)
    cv = _Canvas(width, height)
    data = {str(name): _clean(pts) for name, pts in series.items()}
    xs = [p[0] for pts in data.values() for p in pts]
    ys = [p[1] for pts in data.values() for p in pts]
    x_lo, x_hi, x_ticks = _ticks(min(xs), max(xs)) if xs else _ticks(0.0, 1.0)
    y_lo, y_hi, y_ticks = _ticks(min(ys), max(ys)) if ys else _ticks(0.0, 1.0)
    x_text, y_text = _labels(x_ticks), _labels(y_ticks)
    gh = 7 * SCALE  # glyph height

    # Layout: margins sized from the text they hold.
    left = 10 + (gh + 10 if y_label else 0) + max(_text_width(t) for t in y_text) + 8
    # The legend sits in rows above the plot rather than inside it, so it never hides data.
    legend = _legend_rows(list(data), width - 32)
    legend_y = 14 + gh + 14 if title else 12
    top = legend_y + len(legend) * (gh + 8) + 6
    right = 16 + _text_width(x_text[-1]) // 2
    bottom = 6 + gh + 6 + (gh + 10 if x_label else 0)
    px0, py0 = min(left, width - 2), min(top, height - 2)
    px1, py1 = max(px0 + 1, width - right), max(py0 + 1, height - bottom)

    def to_px(x: float, y: float) -> tuple[float, float]:
        return (px0 + (x - x_lo) / (x_hi - x_lo) * (px1 - px0),
                py1 - (y - y_lo) / (y_hi - y_lo) * (py1 - py0))

    # Grid, axes and tick labels.
    for t, s in zip(x_ticks, x_text):
        gx = round(to_px(t, y_lo)[0])
        cv.rect(gx, py0, gx, py1, GRID)
        cv.rect(gx, py1, gx, py1 + 4, AXIS)
        cv.text(gx - _text_width(s) // 2, py1 + 8, s, INK)
    for t, s in zip(y_ticks, y_text):
        gy = round(to_px(x_lo, t)[1])
        cv.rect(px0, gy, px1, gy, GRID)
        cv.rect(px0 - 4, gy, px0, gy, AXIS)
        cv.text(px0 - 8 - _text_width(s), gy - gh // 2, s, INK)
    cv.rect(px0, py0, px0, py1, AXIS)
    cv.rect(px0, py1, px1, py1, AXIS)

    # Text around the plot.
    if title:
        cv.text((width - _text_width(title)) // 2, 14, title, INK)
    if x_label:
        cv.text((px0 + px1 - _text_width(x_label)) // 2, height - 8 - gh, x_label, INK)
    if y_label:
        cv.text(10, (py0 + py1 + _text_width(y_label)) // 2, y_label, INK, vertical=True)
    if not xs:
        msg = "no data"
        cv.text((px0 + px1 - _text_width(msg)) // 2, (py0 + py1 - gh) // 2, msg, AXIS)

    # Series: accumulate per-pixel coverage for the whole polyline, then blend once.
    for i, pts in enumerate(data.values()):
        color = PALETTE[i % len(PALETTE)]
        pix = _decimate([to_px(x, y) for x, y in pts])
        cov: dict[tuple[int, int], float] = {}
        for (ax, ay), (bx, by) in zip(pix, pix[1:]):
            _stroke(cov, ax, ay, bx, by, 1.25)
        if len(pts) < 30:
            for ax, ay in pix:
                _stroke(cov, ax, ay, ax, ay, 3.0)
        for (cx, cy), a in cov.items():
            if px0 < cx <= px1 and py0 <= cy < py1:  # keep anti-aliased fringes off the axes
                cv.blend(cx, cy, color, a)

    ly = legend_y
    for entries in legend:
        x = (width - sum(_legend_item_width(n) for _, n in entries) + 18) // 2
        for i, name in entries:
            cv.rect(x, ly + gh // 2 - 2, x + 19, ly + gh // 2 + 1, PALETTE[i % len(PALETTE)])
            cv.text(x + 26, ly, name, INK)
            x += _legend_item_width(name)
        ly += gh + 8
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(cv.to_png())
    return out


def _decimate(pix: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Past 2000 points keep only the lowest and highest point of each pixel column: the drawn
    envelope is the same, and stroking 100k segments in pure Python is slow."""
    if len(pix) <= 2000:
        return pix
    cols: dict[int, list[tuple[float, float]]] = {}
    for p in pix:
        cols.setdefault(int(p[0]), []).append(p)
    out = []
    for col in cols.values():
        lo, hi = min(col, key=lambda p: p[1]), max(col, key=lambda p: p[1])
        out += sorted({lo, hi}, key=col.index)
    return out


def _legend_rows(names: list[str], avail: int) -> list[list[tuple[int, str]]]:
    """Pack (index, name) legend entries into rows no wider than ``avail`` pixels."""
    rows: list[list[tuple[int, str]]] = [[]]
    used = 0
    for i, name in enumerate(names):
        w = _legend_item_width(name)
        if rows[-1] and used + w > avail:
            rows.append([])
            used = 0
        rows[-1].append((i, name))
        used += w
    return rows if rows[0] else []


def _legend_item_width(name: str) -> int:
    return 20 + 6 + _text_width(name) + 18  # swatch, gap, name, gap to the next entry
