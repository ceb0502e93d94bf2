"""``LossConfig``: every knob of the policy loss, one pydantic model, validated once at load time.

The same class is the ``loss:`` section of ``TrainConfig`` and the argument of ``policy_loss``:
one place for each default and each bound. ``loss_type`` is checked against the registry here
(and only here), which is also where a user's loss file is imported.
"""

from __future__ import annotations

from typing import Literal

import pydantic
from pydantic import ConfigDict, Field

from agentrl.core.errors import ConfigError
from agentrl.core.strict import Strict
from agentrl.learn.losses.aggregation import AGGREGATIONS
from agentrl.learn.losses.registry import LossSpec, UnknownLoss, resolve_loss

Level = Literal["token", "sequence"]
SamplerLevel = Literal["token", "sequence", "geometric"]
SamplerMode = Literal["truncate", "mask"]


class LossConfigError(ConfigError):
    """A conflicting or out-of-range loss setting; the message names the key."""


class LossConfig(Strict):
    """Settings of :func:`agentrl.learn.losses.policy_loss` (docs/losses.md has every formula).

    Defaults follow TRL's ``GRPOConfig`` where sensible; docs/losses.md lists each difference.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)  # Strict, and shared by every step: never mutated

    loss_type: str = Field(
        "dapo", description="a registered loss (grpo, bnpo, dr_grpo, dapo, cispo, sapo, ...), or 'file.py:name' / 'module:name'"
    )
    aggregation: str | None = Field(
        None, description="token_mean | sequence_mean | constant_sum | local_token_mean; default: the loss's own"
    )
    epsilon: float = Field(0.2, ge=0, description="lower clip range: ratio >= 1 - epsilon")
    epsilon_high: float | None = Field(
        None, ge=0, description="upper clip range (default epsilon); cispo caps its weight at 1 + epsilon_high"
    )
    delta: float | None = Field(None, description="two-sided clipping: cap on the unclipped ratio for negative advantages")
    beta: float = Field(0.0, ge=0, description="weight of the k3 KL penalty to the reference model")
    kl_ratio_weighted: bool = Field(
        False, description="multiply the KL term by the policy ratio (TRL's use_bias_correction_kl, DeepSeek-V3.2)"
    )
    importance_sampling_level: Level = Field("token", description="token ratios, or GSPO's sequence ratio")
    sapo_temperature_pos: float = Field(1.0, gt=0, description="sapo gate temperature for positive advantages")
    sapo_temperature_neg: float = Field(1.05, gt=0, description="sapo gate temperature for other advantages")
    sampler_is_mode: SamplerMode | None = Field(
        "truncate", description="sampler-vs-trainer correction: truncate or mask the weight; null: off"
    )
    sampler_is_level: SamplerLevel = Field("token", description="weight per token, per sequence (product) or geometric mean")
    sampler_is_cap: float = Field(2.0, description="upper bound of the sampler weight")
    sampler_is_min: float | None = Field(
        None, ge=0, description="lower bound of the sampler weight (default: 1/cap for mask, none for truncate)"
    )

    @property
    def eps_low(self) -> float:
        return self.epsilon

    @property
    def eps_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @property
    def spec(self) -> LossSpec:
        """The registered loss (resolved at validation, so this cannot fail)."""
        return resolve_loss(self.loss_type)

    @property
    def resolved_aggregation(self) -> str:
        return self.aggregation or self.spec.aggregation

    @property
    def sampler_is_bounds(self) -> tuple[float, float]:
        """(lower, upper) bounds of the sampler weight as the chosen mode applies them."""
        lo = self.sampler_is_min
        if lo is None:
            lo = 1.0 / self.sampler_is_cap if self.sampler_is_mode == "mask" else 0.0
        return lo, self.sampler_is_cap

    @pydantic.field_validator("loss_type")
    @classmethod
    def _known_loss(cls, v: str) -> str:
        try:
            resolve_loss(v)  # imports a user's loss file once
        except UnknownLoss as exc:
            raise LossConfigError(str(exc)) from None
        return v

    @pydantic.field_validator("aggregation")
    @classmethod
    def _known_aggregation(cls, v: str | None) -> str | None:
        if v is not None and v not in AGGREGATIONS:
            raise LossConfigError(f"aggregation={v!r} is unknown; known: {', '.join(AGGREGATIONS)}")
        return v

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> LossConfig:
        given = self.model_fields_set
        spec = self.spec

        def bad(msg: str) -> None:
            raise LossConfigError(msg)

        if spec.name == "sapo" and given & {"epsilon", "epsilon_high"}:
            bad("epsilon/epsilon_high have no effect with loss_type=sapo (it gates with sapo_temperature_pos/neg)")
        if spec.name != "sapo" and given & {"sapo_temperature_pos", "sapo_temperature_neg"}:
            bad(f"sapo_temperature_* have no effect with loss_type={self.loss_type}")
        if self.beta == 0 and "kl_ratio_weighted" in given:
            bad("kl_ratio_weighted has no effect with beta=0 (there is no KL term)")
        if self.delta is not None:
            if spec.name in ("cispo", "sapo"):
                bad(
                    f"delta is for the clipped PPO surrogate; loss_type={spec.name!r} has no unclipped ratio term "
                    "to bound (cispo caps its detached weight with epsilon_high, sapo's gate is bounded)"
                )
            if self.delta <= 1 + self.eps_high:
                bad(f"delta={self.delta} must be > 1 + epsilon_high = {1 + self.eps_high}, or it clips inside the trust region")
        if self.sampler_is_mode is None:
            if given & {"sampler_is_level", "sampler_is_cap", "sampler_is_min"}:
                bad("sampler_is_level/sampler_is_cap/sampler_is_min have no effect with sampler_is_mode=null")
        elif self.sampler_is_mode == "truncate" and self.sampler_is_cap < 1:
            bad(f"sampler_is_cap must be >= 1 for truncation, got {self.sampler_is_cap}")
        elif self.sampler_is_mode == "mask" and self.sampler_is_cap <= 1:
            bad(f"sampler_is_cap must be > 1 for masking (it keeps weights inside [lower, cap]), got {self.sampler_is_cap}")
        if self.sampler_is_min is not None and self.sampler_is_min > 1:
            bad(f"sampler_is_min must be <= 1 (a weight of 1 is no correction), got {self.sampler_is_min}")
        return self


__all__ = ["Level", "LossConfig", "LossConfigError", "SamplerLevel", "SamplerMode"]
