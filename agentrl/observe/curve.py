"""The reward curve of a run (``reward_curve.png``) from its per-step history."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_reward_curve(history: list[dict[str, Any]], path: Path, title: str) -> None:
    """Mean reward, accuracy (when it is not the same series) and eval reward per step, plus a
    smoothed reward once there are enough points. Skipped quietly when plotting is unavailable."""
    try:
        from agentrl.observe.plot import smooth, write_curve_png
    except ImportError:
        return
    series: dict[str, list[tuple[float, float]]] = {}
    for key in ("reward/mean", "accuracy", "eval/reward"):
        points = [(h["step"], h[key]) for h in history if key in h]
        if points:
            series[key] = points
    if series.get("accuracy") == series.get("reward/mean"):  # the only reward is correctness
        series.pop("accuracy", None)
    if "reward/mean" in series and len(series["reward/mean"]) > 3:
        ys = smooth([y for _, y in series["reward/mean"]], 0.3)
        series["reward (smoothed)"] = [(x, y) for (x, _), y in zip(series["reward/mean"], ys)]
    write_curve_png(path, series, title=title, y_label="reward")
