"""``relu``: ``f = ReLU(h)`` with an L1 penalty weighted by decoder norms (SAELens ``standard``).

Decoder rows are free (initialised at norm 0.1, SAELens's ``decoder_init_norm``); the penalty is
``l1(t) * mean_rows sum_i f_i ||W_dec[i]||`` with ``l1(t)`` warmed up linearly over ``l1_warm_up_tokens``; dead
latents are resampled (Anthropic 2023). SAELens names: ``standard`` (SAE), ``transcoder``, ``skip_transcoder``.
"""

from __future__ import annotations

from typing import Any

import torch

from .kernels import warm_up
from .table import Architecture, register


def activate(d: Any, h: torch.Tensor) -> torch.Tensor:
    """``ReLU(h)``: ``[rows, d_sae] -> [rows, d_sae]``."""
    return h.relu()


def l1_penalty(d: Any, f: torch.Tensor) -> torch.Tensor:
    """``mean_rows sum_i f_i ||W_dec[i]||`` of ``f [rows, d_sae]`` (SAELens ``standard``'s sparsity term)."""
    return (f * d.W_dec.norm(dim=1)).sum(-1).mean()


def sparsity_loss(d: Any, h: torch.Tensor, f: torch.Tensor, settings: Any, tokens: int) -> torch.Tensor:
    """``l1_coefficient * warm-up * l1_penalty`` (``settings.l1_coefficient``, ``l1_warm_up_tokens``)."""
    return settings.l1_coefficient * warm_up(tokens, settings.l1_warm_up_tokens) * l1_penalty(d, f)


RELU = register(Architecture(
    name="relu", activate=activate, sparsity_loss=sparsity_loss, e2e_penalty=l1_penalty, revive="resample",
    saelens={"sae": "standard", "transcoder": "transcoder", "skip_transcoder": "skip_transcoder"},
    summary="ReLU with an L1 penalty weighted by decoder norms (SAELens standard)",
    citation="Bricken et al. 2023; SAELens standard"))
