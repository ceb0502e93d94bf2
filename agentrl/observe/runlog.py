"""What a training run shows and keeps: metrics JSONL, trackers, a live view, sample trajectories.

``metrics.jsonl`` is always written (one line per optimizer step). TensorBoard, W&B and trackio
go through accelerate's trackers when asked for and installed. On a terminal a rich live table
shows step, reward, accuracy, KL, tokens/s and ETA; otherwise one plain line per step.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from agentrl.core.trajectory import Trajectory

HEADLINE = (
    ("step", "step", "{:.0f}"),
    ("reward", "reward/mean", "{:.3f}"),
    ("accuracy", "accuracy", "{:.3f}"),
    ("eval", "eval/reward", "{:.3f}"),
    ("kl", "loss/kl/mean", "{:.4f}"),
    ("loss", "loss/loss", "{:+.4f}"),
    ("tok/s", "perf/sampled_tokens_per_s", "{:.0f}"),
    ("step s", "perf/step_s", "{:.1f}"),
    ("ETA", "perf/eta_s", "{}"),
    ("reward errors", "rollout/episodes/reward_errors", "{:.0f}"),  # rollout.reward_errors=drop
)


class RunLog:
    """Metrics file, optional trackers, and the live view of one run."""

    def __init__(self, run_dir: Path, accelerator: Any, live: bool | None = None) -> None:
        self.run_dir = run_dir
        self.accelerator = accelerator
        self.metrics_path = run_dir / "metrics.jsonl"
        self.samples_path = run_dir / "samples.jsonl"
        self.enabled = bool(getattr(accelerator, "is_main_process", True))  # data parallel: rank 0 writes
        self.live = self.enabled and (sys.stdout.isatty() if live is None else live)
        self._rich: Any = None
        self._rows: list[list[str]] = []
        self.start = time.time()

    def __enter__(self) -> RunLog:
        if self.live:
            from rich.live import Live

            self._rich = Live(self._table(), refresh_per_second=4, transient=False)
            self._rich.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._rich is not None:
            self._rich.stop()

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"step": step, "time": round(time.time() - self.start, 2), **metrics}
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, default=float) + "\n")
        if self.accelerator.trackers:
            self.accelerator.log({k: v for k, v in metrics.items() if isinstance(v, int | float)}, step=step)
        row = [_fmt(record, key, fmt) for _, key, fmt in HEADLINE]
        self._rows.append(row)
        if self._rich is not None:
            self._rich.update(self._table())
        else:
            print("  ".join(f"{name}={value}" for (name, _, _), value in zip(HEADLINE, row) if value != "-"), flush=True)

    def samples(self, step: int, trajectories: list[Trajectory], decode: Any) -> None:
        """Keep a few whole trajectories per log step (the Trajectory record, so ``agentrl view``
        can show their tokens), plus the model-visible text of each sample."""
        if not self.enabled:
            return
        with open(self.samples_path, "a", encoding="utf-8") as f:
            for t in trajectories:
                text = [decode(s.ids) for s in t.samples]
                f.write(json.dumps({"step": step, **t.to_dict(), "text": text}, default=str) + "\n")

    def _table(self) -> Any:
        from rich.table import Table

        table = Table(title=f"agentrl train — {self.run_dir}", expand=False)
        for name, _, _ in HEADLINE:
            table.add_column(name, justify="right")
        for row in self._rows[-15:]:
            table.add_row(*row)
        return table


def _fmt(record: dict[str, Any], key: str, fmt: str) -> str:
    value = record.get(key)
    if value is None:
        return "-"
    if key == "perf/eta_s":
        return time.strftime("%M:%S", time.gmtime(value)) if value < 3600 else f"{value / 3600:.1f}h"
    try:
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)
