"""Initialisation from the first buffer: input normalisation (SAELens's ``estimate_scaling_factor``) and ``b_dec``
(geometric median, mean or zeros)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from .settings import TrainSettings, TrainState


@torch.no_grad()
def initialise(states: Mapping[str, TrainState], first: tuple[dict[str, torch.Tensor], torch.Tensor],
                settings: TrainSettings, device: torch.device, dtype: torch.dtype) -> None:
    """Set each dictionary's normalisation factors and ``b_dec`` from the first buffer ``(site -> rows, codes)``;
    refuses a source with fewer usable rows than one batch, or a site of the wrong width."""
    acts, codes = first
    if codes.shape[0] < settings.batch_size:
        raise ValueError(f"the source holds {codes.shape[0]} usable tokens, fewer than one batch "
                         f"({settings.batch_size}); special tokens and padding are left out unless include_special")
    for state in states.values():
        cfg = state.dictionary.config
        x, y = acts[cfg.site].float(), acts[cfg.site_out or cfg.site].float()
        if x.shape[1] != cfg.d_in or y.shape[1] != cfg.width_out:
            raise ValueError(f"site {cfg.site!r} has width {x.shape[1]} (output {y.shape[1]}); the dictionary "
                             f"expects {cfg.d_in} (output {cfg.width_out})")
        if settings.normalise:
            state.scale_in = norm_scaling_factor(x)
            state.scale_out = state.scale_in if cfg.kind == "sae" else norm_scaling_factor(y)
        y = y * state.scale_out
        if settings.b_dec_init == "geometric_median":
            b = geometric_median(y[:8192])
        elif settings.b_dec_init == "mean":
            b = y.mean(0)
        else:
            b = torch.zeros(y.shape[1])
        state.dictionary.b_dec.copy_(b.to(device=device, dtype=dtype))


def norm_scaling_factor(x: torch.Tensor) -> float:
    """SAELens's ``estimate_scaling_factor``: ``sqrt(d) / mean_row ||x||`` (rows ``[n, d]``), the factor that
    gives the activations mean norm ``sqrt(d)``."""
    return float(math.sqrt(x.shape[1]) / x.float().norm(dim=-1).mean())


def geometric_median(x: torch.Tensor, *, max_iter: int = 100, tol: float = 1e-6) -> torch.Tensor:
    """The geometric median of rows ``x [n, d]`` (Weiszfeld's iteration, as SAELens's ``compute_geometric_median``
    before 6.x), started from the mean: the point minimising the sum of Euclidean distances."""
    x = x.double()
    m = x.mean(0)
    for _ in range(max_iter):
        w = 1.0 / (x - m).norm(dim=-1).clamp_min(1e-8)
        new = (w[:, None] * x).sum(0) / w.sum()
        if (new - m).norm() <= tol * max(1.0, float(m.norm())):
            m = new
            break
        m = new
    return m.float()
