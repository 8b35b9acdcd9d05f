"""Training losses: reconstruction plus each architecture's sparsity term (SAELens's conventions), the sparse TopK
form, and the AuxK loss."""

from __future__ import annotations

import torch

from .models import (
    Dictionary,
    JumpReLUFunction,
    SparseDecodeFunction,
    StepFunction,
    TopKEncodeFunction,
    batch_topk_activation,
    topk_activation,
)
from .settings import TrainSettings


def dictionary_loss(d: Dictionary, x: torch.Tensor, y: torch.Tensor, settings: TrainSettings, *, tokens: int,
                    dead: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training loss of one batch (normalised space): ``(loss, f [rows, d_sae], y_hat [rows, d_out])``.

    ``mse = sum_d (y_hat - y)^2`` averaged over rows (SAELens's ``mse_loss``), plus by architecture
    ``relu``: ``l1(t) * mean_rows sum_i f_i ||W_dec[i]||``; ``jumprelu``: ``l0(t) * mean_rows sum_i
    step(h_i - theta_i)`` (straight-through, SAELens ``"step"`` mode); ``topk`` / ``batchtopk``: AuxK, SAELens's
    ``calculate_topk_aux_loss``: the top ``k_aux = d_in // 2`` pre-activations among ``dead`` latents, decoded
    (with ``b_dec``), against the detached residual ``y - y_hat``: ``aux * min(n_dead / k_aux, 1) * mean_rows
    sum_d (decode(aux_acts) - residual)^2``. Coefficients ``l1(t)``, ``l0(t)`` ramp linearly from 0 over their
    warm-up tokens.
    """
    cfg = d.config
    if cfg.arch == "topk" and d.W_skip is None:
        loss, values, indices, y_hat = topk_loss(d, x, y, settings, dead=dead)
        f = torch.zeros(x.shape[0], cfg.d_sae, dtype=values.dtype, device=values.device).scatter_(
            -1, indices, values.detach())
        return loss, f, y_hat
    h = d.pre_activation(x)
    if cfg.arch == "relu":
        f = h.relu()
    elif cfg.arch == "topk":
        f = topk_activation(h, cfg.k)
    elif cfg.arch == "batchtopk":
        f = batch_topk_activation(h, cfg.k)
    else:
        f = JumpReLUFunction.apply(h, d.threshold, settings.jumprelu_bandwidth)
    y_hat = d.decode(f, x)
    loss = (y_hat - y).pow(2).sum(-1).mean()
    if cfg.arch == "relu":
        coef = settings.l1_coefficient * warm_up(tokens, settings.l1_warm_up_tokens)
        loss = loss + coef * (f * d.W_dec.norm(dim=1)).sum(-1).mean()
    elif cfg.arch == "jumprelu":
        coef = settings.l0_coefficient * warm_up(tokens, settings.l0_warm_up_tokens)
        loss = loss + coef * StepFunction.apply(h, d.threshold, settings.jumprelu_bandwidth).sum(-1).mean()
    elif dead is not None and int(dead.sum()) > 0:
        loss = loss + settings.aux_coefficient * auxk_loss(d, h, y, y_hat, dead)
    return loss, f, y_hat


def topk_loss(d: Dictionary, x: torch.Tensor, y: torch.Tensor, settings: TrainSettings, *,
              dead: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`dictionary_loss` of a TopK dictionary (no skip path) on its sparse form: ``(loss, values [rows, k],
    indices [rows, k], y_hat [rows, d_out])``, the ``k`` kept activations of each row (after ReLU) and their
    latents. The encoder's backward and the decoder (forward and backward) touch only the ``k`` active latents
    of each row (:class:`TopKEncodeFunction`, :class:`SparseDecodeFunction`), AuxK only the dead latents'
    pre-activations: the same loss and gradients as the dense formulas."""
    cfg = d.config
    x_in = x.to(d.W_enc.dtype)
    values, indices = TopKEncodeFunction.apply(x_in, d.b_dec if d.is_sae else None, d.W_enc, d.b_enc, cfg.k)
    values = values.relu()
    y_hat = SparseDecodeFunction.apply(values, indices, d.W_dec) + d.b_dec
    loss = (y_hat - y).pow(2).sum(-1).mean()
    if dead is not None and int(dead.sum()) > 0:
        cols = dead.nonzero().squeeze(1)
        shifted = x_in - d.b_dec if d.is_sae else x_in
        h_dead = torch.addmm(d.b_enc[cols], shifted, d.W_enc[:, cols])
        loss = loss + settings.aux_coefficient * _auxk_on_dead(d, h_dead, cols, y, y_hat)
    return loss, values, indices, y_hat


def auxk_loss(d: Dictionary, h: torch.Tensor, y: torch.Tensor, y_hat: torch.Tensor, dead: torch.Tensor) -> torch.Tensor:
    """SAELens's TopK auxiliary loss without its coefficient: ``min(n_dead / k_aux, 1) * mean_rows sum_d
    (aux_acts @ W_dec + b_dec - (y - y_hat).detach())^2`` with ``k_aux = min(d_in // 2, n_dead)`` largest
    pre-activations ``h`` among the ``dead`` latents (``[d_sae]`` bool)."""
    n_dead = int(dead.sum())
    if n_dead == 0:
        return h.new_zeros(())
    k_aux = d.config.d_in // 2
    scale = min(n_dead / k_aux, 1.0)
    k_aux = min(k_aux, n_dead)
    masked = torch.where(dead[None], h, torch.full_like(h, -torch.inf))
    top = masked.topk(k_aux, dim=-1, sorted=False)
    acts = torch.zeros_like(h).scatter_(-1, top.indices, top.values)
    recon = acts @ d.W_dec + d.b_dec
    return scale * (recon - (y - y_hat).detach()).pow(2).sum(-1).mean()


def _auxk_on_dead(d: Dictionary, h_dead: torch.Tensor, cols: torch.Tensor, y: torch.Tensor,
                  y_hat: torch.Tensor) -> torch.Tensor:
    """:func:`auxk_loss` from the dead latents' pre-activations ``h_dead [rows, n_dead]`` (latents ``cols``)."""
    n_dead = int(cols.numel())
    k_aux = d.config.d_in // 2
    scale = min(n_dead / k_aux, 1.0)
    top = h_dead.topk(min(k_aux, n_dead), dim=-1, sorted=False)
    recon = SparseDecodeFunction.apply(top.values, top.indices, d.W_dec[cols]) + d.b_dec
    return scale * (recon - (y - y_hat).detach()).pow(2).sum(-1).mean()


def warm_up(tokens: int, warm_up_tokens: int) -> float:
    """A coefficient's linear warm-up factor after ``tokens`` tokens (1 without warm-up)."""
    return 1.0 if warm_up_tokens <= 0 else min(1.0, (tokens + 1) / warm_up_tokens)
