"""Token-level and value-level differences, shown the way a person debugging a template needs them.

A failing check is only useful if it shows *where* expected and actual part: the first differing
token, with ids and decoded pieces on both sides, and a few tokens of context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TokenDiff:
    """Where two id sequences first differ, with a window of ids and decoded pieces around it."""

    expected_label: str
    actual_label: str
    index: int  # first differing position (== the shorter length when one is a prefix of the other)
    expected_len: int
    actual_len: int
    rows: list[dict[str, Any]] = field(default_factory=list)  # {"i", "expected_id", "expected", "actual_id", "actual"}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """A small aligned table; the first differing row is marked with '>'."""
        head = (
            f"first difference at token {self.index} ({self.expected_label}: {self.expected_len} ids, "
            f"{self.actual_label}: {self.actual_len} ids)"
        )

        def cell(tid: int | None, piece: str | None) -> str:
            return "(end)" if tid is None else f"{tid:>7} {piece!r}"

        left = [cell(r["expected_id"], r["expected"]) for r in self.rows]
        width = max([len(self.expected_label), *map(len, left)]) + 2
        out = [head, f"    {'token':>6}  {self.expected_label:<{width}}{self.actual_label}"]
        for r, lcell in zip(self.rows, left):
            mark = ">" if r["i"] == self.index else " "
            out.append(f"  {mark} {r['i']:>6}  {lcell:<{width}}{cell(r['actual_id'], r['actual'])}")
        return out


def first_difference(expected: Sequence[int], actual: Sequence[int]) -> int | None:
    """Index of the first differing id, the shorter length if one is a prefix of the other, or None if equal."""
    for i, (x, y) in enumerate(zip(expected, actual)):
        if x != y:
            return i
    return None if len(expected) == len(actual) else min(len(expected), len(actual))


def token_diff(
    decode_one: Callable[[int], str],
    expected: Sequence[int],
    actual: Sequence[int],
    expected_label: str = "expected",
    actual_label: str = "actual",
    context: int = 4,
) -> TokenDiff | None:
    """The first difference between ``expected`` and ``actual`` with ``context`` tokens either side; None if equal."""
    j = first_difference(expected, actual)
    if j is None:
        return None

    def piece(ids: Sequence[int], i: int) -> tuple[int | None, str | None]:
        if i >= len(ids):
            return None, None
        try:
            return ids[i], decode_one(ids[i])
        except Exception:  # an id the tokenizer cannot decode is itself worth showing
            return ids[i], "<undecodable>"

    rows = []
    for i in range(max(0, j - context), min(max(len(expected), len(actual)), j + context + 1)):
        (eid, etext), (aid, atext) = piece(expected, i), piece(actual, i)
        rows.append({"i": i, "expected_id": eid, "expected": etext, "actual_id": aid, "actual": atext})
    return TokenDiff(expected_label, actual_label, j, len(expected), len(actual), rows)


def value_differences(expected: Any, actual: Any, path: str) -> list[str]:
    """Differences between two JSON-like values, types included (1, 1.0, True and "1" all differ)."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{path}: expected an object, got {_typed(actual)}"]
        out = [f"{path}.{k}: missing" for k in expected if k not in actual]
        out += [f"{path}.{k}: unexpected {_typed(actual[k])}" for k in actual if k not in expected]
        for k in expected:
            if k in actual:
                out += value_differences(expected[k], actual[k], f"{path}.{k}")
        return out
    if isinstance(expected, list):
        if not isinstance(actual, list):
            return [f"{path}: expected an array, got {_typed(actual)}"]
        if len(expected) != len(actual):
            return [f"{path}: expected {len(expected)} items, got {len(actual)}: {actual!r}"]
        return [d for i, (e, a) in enumerate(zip(expected, actual)) for d in value_differences(e, a, f"{path}[{i}]")]
    if type(expected) is not type(actual) or expected != actual:
        return [f"{path}: expected {_typed(expected)}, got {_typed(actual)}"]
    return []


def _typed(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", int: "int", float: "float", bool: "bool", type(None): "null"}
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{names.get(type(value), type(value).__name__)} {text}"
