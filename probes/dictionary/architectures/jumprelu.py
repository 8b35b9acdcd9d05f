"""``jumprelu``: ``f = h * (h > threshold)`` with ``threshold = exp(log_threshold) > 0`` learnt through
straight-through estimators (SAELens ``JumpReLU``; Rajamanoharan et al. 2024).

Decoder rows at unit norm; the sparsity term is ``l0(t) * mean_rows sum_i step(h_i - theta_i)`` (SAELens's
``"step"`` mode, bandwidth ``jumprelu_bandwidth``), warmed up over ``l0_warm_up_tokens``; dead latents are
resampled (their threshold lowered so they fire on their row). SAELens names: ``jumprelu`` (SAE),
``jumprelu_transcoder``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .kernels import JumpReLUFunction, StepFunction, warm_up
from .table import Architecture, register


def activate(d: Any, h: torch.Tensor) -> torch.Tensor:
    """Inference: ``ReLU(h) * (h > threshold)`` (``h [rows, d_sae]``; the threshold is positive)."""
    return h.relu() * (h > threshold(d)).to(h.dtype)


def train_activate(d: Any, h: torch.Tensor, settings: Any) -> torch.Tensor:
    """Training: ``h * (h > threshold)`` with the straight-through threshold gradient."""
    return JumpReLUFunction.apply(h, threshold(d), settings.jumprelu_bandwidth)


def sparsity_loss(d: Any, h: torch.Tensor, f: torch.Tensor, settings: Any, tokens: int) -> torch.Tensor:
    """``l0_coefficient * warm-up * mean_rows sum_i step(h_i - theta_i)`` (straight-through)."""
    coef = settings.l0_coefficient * warm_up(tokens, settings.l0_warm_up_tokens)
    return coef * StepFunction.apply(h, threshold(d), settings.jumprelu_bandwidth).sum(-1).mean()


def setup(d: Any, kw: dict[str, Any]) -> None:
    """The learnt ``log_threshold [d_sae]``."""
    d.log_threshold = nn.Parameter(torch.full((d.config.d_sae,), math.log(0.01), **kw))


def init(d: Any, init_threshold: float) -> None:
    """Every threshold at ``init_threshold`` (SAELens's ``jumprelu_init_threshold``)."""
    d.log_threshold.fill_(math.log(init_threshold))


def threshold(d: Any) -> torch.Tensor:
    """``exp(log_threshold)`` ``[d_sae]``."""
    return d.log_threshold.exp()


def load_threshold(d: Any, t: torch.Tensor) -> None:
    """Read SAELens's ``threshold [d_sae]``."""
    d.log_threshold.copy_(t.clamp_min(1e-30).log())


def revive_threshold(d: Any, idx: torch.Tensor, h_row: torch.Tensor, settings: Any) -> None:
    """A resampled latent fires on its row again: threshold at most half its new pre-activation ``h_row`` there."""
    d.log_threshold[idx] = torch.minimum(torch.full_like(h_row, settings.jumprelu_init_threshold),
                                         0.5 * h_row).log().to(d.log_threshold.dtype)


JUMPRELU = register(Architecture(
    name="jumprelu", activate=activate, train_activate=train_activate, sparsity_loss=sparsity_loss,
    unit_norm_decoder=True, revive="resample", setup=setup, init=init, threshold=threshold,
    load_threshold=load_threshold, revive_threshold=revive_threshold,
    saelens={"sae": "jumprelu", "transcoder": "jumprelu_transcoder"},
    summary="a learnt per-latent threshold with an L0 penalty, straight-through (SAELens JumpReLU)",
    citation="Rajamanoharan et al. 2024, arXiv:2407.14435"))
