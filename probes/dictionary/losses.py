"""Training losses: reconstruction plus the architecture's own sparsity and auxiliary terms (each architecture's
file in ``architectures/`` holds them), and the sparse form an architecture may give instead."""

from __future__ import annotations

import torch

from .architectures.kernels import auxk_loss, warm_up
from .architectures.topk import topk_loss
from .models import Dictionary
from .settings import TrainSettings

__all__ = ["auxk_loss", "dictionary_loss", "topk_loss", "warm_up"]


def dictionary_loss(d: Dictionary, x: torch.Tensor, y: torch.Tensor, settings: TrainSettings, *, tokens: int,
                    dead: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training loss of one batch (normalised space): ``(loss, f [rows, d_sae], y_hat [rows, d_out])``.

    ``mse = sum_d (y_hat - y)^2`` averaged over rows (SAELens's ``mse_loss``), plus the architecture's
    ``sparsity_loss(d, h, f, settings, tokens)`` (with its coefficient and warm-up) and its ``aux_loss(d, h, y,
    y_hat, dead, settings)`` (e.g. AuxK over the ``dead`` latents). An architecture with a ``sparse_loss`` (TopK)
    is trained on that exact sparse form when it has no skip path; ``f`` is then scattered from its kept values.
    """
    cfg, spec = d.config, d.spec
    if spec.sparse_loss is not None and d.W_skip is None:
        loss, values, indices, y_hat = spec.sparse_loss(d, x, y, settings, dead)
        f = torch.zeros(x.shape[0], cfg.d_sae, dtype=values.dtype, device=values.device).scatter_(
            -1, indices, values.detach())
        return loss, f, y_hat
    h = d.pre_activation(x)
    f = spec.train_activate(d, h, settings) if spec.train_activate is not None else spec.activate(d, h)
    y_hat = d.decode(f, x)
    loss = (y_hat - y).pow(2).sum(-1).mean()
    if spec.sparsity_loss is not None:
        loss = loss + spec.sparsity_loss(d, h, f, settings, tokens)
    if spec.aux_loss is not None:
        aux = spec.aux_loss(d, h, y, y_hat, dead, settings)
        if aux is not None:
            loss = loss + aux
    return loss, f, y_hat
