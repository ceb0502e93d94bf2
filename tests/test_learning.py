"""Learning, not just running: a short seeded GRPO run must beat the evaluation's own noise.

The bundled model is evaluated greedily on the same 300 held-out tasks before and after training.
The noise of such a comparison comes from which tasks happen to flip; a paired sign test over the
flipped tasks (McNemar) gives z = (gained - lost) / sqrt(gained + lost). The run must reach z >= 3.
(The full default run is 60 steps; this is the shorter CI version, about 6 minutes on 2 cores.)
"""

from __future__ import annotations

import math

from agentrl.config import build, parse_overrides
from agentrl.train_config import TrainConfig
from agentrl.trainer import Trainer

STEPS = 45


def test_short_seeded_run_improves_held_out_accuracy(tmp_path):
    cfg = build(TrainConfig, parse_overrides([f"max_steps={STEPS}", f"eval_every={STEPS}", "eval_tasks=300", "seed=0", f"output_dir={tmp_path}"]))
    trainer = Trainer(cfg)
    trainer.train()
    before, after = trainer.eval_results[0], trainer.eval_results[STEPS]
    gained = sum(1 for b, a in zip(before, after) if (b or 0) < 1 <= (a or 0))
    lost = sum(1 for b, a in zip(before, after) if (a or 0) < 1 <= (b or 0))
    z = (gained - lost) / math.sqrt(max(1, gained + lost))
    acc_before, acc_after = sum(b or 0 for b in before) / 300, sum(a or 0 for a in after) / 300
    print(f"greedy accuracy {acc_before:.3f} -> {acc_after:.3f}; tasks gained {gained}, lost {lost}, z = {z:.2f}")
    assert z >= 3, (acc_before, acc_after, gained, lost, z)
