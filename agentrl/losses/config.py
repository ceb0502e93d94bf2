"""``LossConfig``: every knob of the policy loss, validated once so a bad run fails at start-up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Level = Literal["token", "sequence"]
SamplerLevel = Literal["token", "sequence", "geometric"]
SamplerMode = Literal["truncate", "mask"]


class LossConfigError(ValueError):
    """A conflicting or out-of-range loss setting; the message names the key."""


@dataclass(frozen=True)
class LossConfig:
    """Settings of :func:`agentrl.losses.policy_loss`. Defaults follow TRL's ``GRPOConfig`` where sensible.

    ``epsilon_high=None`` means ``epsilon`` (symmetric clipping). ``delta`` is the upper bound of the
    unclipped ratio for negative advantages (two-sided clipping); it must exceed ``1 + epsilon_high``.
    For ``cispo`` the importance weight is capped at ``1 + epsilon_high`` (the MiniMax-M1 paper's
    form; TRL's ``epsilon_high`` for cispo is the absolute cap, so TRL's 5.0 is 4.0 here).
    ``sapo`` ignores ``epsilon``/``epsilon_high`` and uses the two gate temperatures instead.
    ``sampler_is_mode=None`` turns the sampler-vs-trainer correction off even when sampler
    log-probabilities are given.
    """

    loss_type: str = "dapo"
    epsilon: float = 0.2
    epsilon_high: float | None = None
    delta: float | None = None
    beta: float = 0.0
    importance_sampling_level: Level = "token"
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    sampler_is_mode: SamplerMode | None = "truncate"
    sampler_is_level: SamplerLevel = "token"
    sampler_is_cap: float = 2.0

    def __post_init__(self) -> None:
        self.validate()

    @property
    def eps_low(self) -> float:
        return self.epsilon

    @property
    def eps_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    def validate(self) -> None:
        """Raise :class:`LossConfigError` on conflicts; called by ``__post_init__``."""
        from agentrl.losses.registry import LOSSES  # late: the registry imports this module

        def bad(msg: str) -> None:
            raise LossConfigError(msg)

        if self.loss_type not in LOSSES:
            bad(f"loss_type={self.loss_type!r} is unknown; known: {', '.join(sorted(LOSSES))}")
        if self.epsilon < 0:
            bad(f"epsilon must be >= 0, got {self.epsilon}")
        if self.epsilon_high is not None and self.epsilon_high < 0:
            bad(f"epsilon_high must be >= 0, got {self.epsilon_high}")
        if self.beta < 0:
            bad(f"beta must be >= 0 (it weighs a KL penalty), got {self.beta}")
        if self.importance_sampling_level not in ("token", "sequence"):
            bad(f"importance_sampling_level must be 'token' or 'sequence', got {self.importance_sampling_level!r}")
        if self.delta is not None:
            if self.loss_type in ("cispo", "sapo"):
                bad(
                    f"delta is for the clipped PPO surrogate; loss_type={self.loss_type!r} has no unclipped "
                    "ratio term to bound (cispo caps its detached weight with epsilon_high, sapo's gate is bounded)"
                )
            if self.delta <= 1 + self.eps_high:
                bad(f"delta={self.delta} must be > 1 + epsilon_high = {1 + self.eps_high}, or it clips inside the trust region")
        if self.sapo_temperature_pos <= 0 or self.sapo_temperature_neg <= 0:
            bad("sapo_temperature_pos and sapo_temperature_neg must be > 0")
        if self.sampler_is_mode not in (None, "truncate", "mask"):
            bad(f"sampler_is_mode must be 'truncate', 'mask' or None, got {self.sampler_is_mode!r}")
        if self.sampler_is_level not in ("token", "sequence", "geometric"):
            bad(f"sampler_is_level must be 'token', 'sequence' or 'geometric', got {self.sampler_is_level!r}")
        if self.sampler_is_mode == "truncate" and self.sampler_is_cap < 1:
            bad(f"sampler_is_cap must be >= 1 for truncation, got {self.sampler_is_cap}")
        if self.sampler_is_mode == "mask" and self.sampler_is_cap <= 1:
            bad(f"sampler_is_cap must be > 1 for masking (it keeps weights in [1/cap, cap]), got {self.sampler_is_cap}")
