"""The loss registry: one decorated function per objective, found by name or by import spec.

A loss function takes the prepared :class:`~agentrl.learn.losses.inputs.LossInputs` and returns the
per-token loss [B, T] (minus the objective; masking, the sampler weight, the KL term and the
aggregation are applied by ``policy_loss``) plus its own tensor metrics. ``@register_loss`` also
declares the loss's default aggregation, which ``loss.aggregation`` overrides.

``loss.loss_type`` accepts a registered name, a name published by an installed package under the
``agentrl.learn.losses`` entry-point group (``name = "module"``: importing it registers the loss), or an
import spec ``"package.module:name"`` / ``"path/to/file.py:name"``: the module is imported once
(its ``@register_loss`` decorators run) and ``name`` is the registered name or the decorated
function's attribute name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

import torch

from agentrl.core.errors import UserError
from agentrl.core.registry import Registry
from agentrl.learn.losses.aggregation import AGGREGATIONS

Metrics = dict[str, torch.Tensor]
LossFn = Callable[[Any], tuple[torch.Tensor, Metrics]]  # (LossInputs) -> (per-token loss [B, T], metrics)
ENTRY_POINT_GROUP = "agentrl.losses"  # a published contract: plugins name it in their metadata


@dataclass(frozen=True)
class LossSpec:
    """A registered loss: its function and the aggregation it uses unless the config overrides it."""

    name: str
    fn: LossFn
    aggregation: str


LOSSES: Registry[LossSpec] = Registry("loss")
_RESOLVED: dict[str, LossSpec] = {}  # import spec -> spec, so a user file is executed once per process


class UnknownLoss(UserError, LookupError):
    """No loss matches a ``loss_type``; the message lists what is known."""


def register_loss(name: str, *, aggregation: str = "token_mean") -> Callable[[LossFn], LossFn]:
    """Decorator: make ``fn`` selectable as ``loss.loss_type=name``, aggregated by ``aggregation`` by default."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"register_loss({name!r}): unknown aggregation {aggregation!r}; known: {', '.join(AGGREGATIONS)}")

    def deco(fn: LossFn) -> LossFn:
        # the same function again (a module imported twice, e.g. a user file) replaces its entry
        LOSSES.add(name, LossSpec(name, fn, aggregation), same=lambda old, new: old.fn is fn or _qualname(old.fn) == _qualname(fn))
        fn.__agentrl_loss__ = name  # type: ignore[attr-defined]
        return fn

    return deco


def _qualname(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def loss_names() -> list[str]:
    """Registered names and installed plugin names, sorted."""
    return sorted(set(LOSSES) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def resolve_loss(loss_type: str) -> LossSpec:
    """The :class:`LossSpec` behind a name, a plugin name or an import spec; :class:`UnknownLoss` otherwise."""
    if not isinstance(loss_type, str) or not loss_type:
        raise UnknownLoss(f"loss_type must be a non-empty string, got {loss_type!r}")
    if loss_type in LOSSES:
        return LOSSES[loss_type]
    if loss_type in _RESOLVED:
        return _RESOLVED[loss_type]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == loss_type:
            ep.load()  # importing the plugin module runs its @register_loss
            if loss_type in LOSSES:
                return LOSSES[loss_type]
            raise UnknownLoss(f"plugin {ep.value!r} (entry point {loss_type!r}) registered no loss named {loss_type!r}")
    if ":" in loss_type:
        spec = _from_import_spec(loss_type)
        _RESOLVED[loss_type] = spec
        return spec
    raise UnknownLoss(
        f"loss_type={loss_type!r} is unknown; known: {', '.join(loss_names())}. "
        "A loss of your own: decorate it with @agentrl.learn.losses.register_loss(name) and give "
        "loss_type='path/to/file.py:name' or 'package.module:name' (or publish it under the "
        "'agentrl.losses' entry-point group)."
    )


def _from_import_spec(loss_type: str) -> LossSpec:
    from agentrl.core.loading import SpecError, load_spec  # the one loader of user files

    name = loss_type.rpartition(":")[2]
    try:
        obj = load_spec(loss_type)
    except SpecError as exc:  # also "has no attribute": the registered name may differ from it
        if name in LOSSES:
            return LOSSES[name]
        if "has no attribute" in str(exc):
            raise UnknownLoss(_not_registered(loss_type, name)) from None
        raise UnknownLoss(f"loss_type={loss_type!r}: {exc}") from None
    except Exception as exc:  # the user's file raised while importing
        raise UnknownLoss(f"loss_type={loss_type!r}: importing it failed: {type(exc).__name__}: {exc}") from exc
    registered = getattr(obj, "__agentrl_loss__", None)
    if registered in LOSSES:
        return LOSSES[registered]
    if name in LOSSES:
        return LOSSES[name]
    raise UnknownLoss(_not_registered(loss_type, name))


def _not_registered(loss_type: str, name: str) -> str:
    return (
        f"loss_type={loss_type!r}: the module was imported but no loss {name!r} is registered; decorate the "
        "function with @agentrl.learn.losses.register_loss(name)"
    )


__all__ = ["LOSSES", "LossFn", "LossSpec", "UnknownLoss", "loss_names", "register_loss", "resolve_loss"]
