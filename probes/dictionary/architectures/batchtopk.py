"""``batchtopk``: in training keep the ``k * rows`` largest entries of ``ReLU(h)`` over the whole batch (SAELens
``BatchTopK``; Bussmann et al. 2024); at inference ``f = ReLU(h) * (h > threshold)`` with one threshold for every
latent, the running average of the smallest kept activation (``topk_threshold_lr``).

Decoder rows at unit norm; AuxK for dead latents. SAELens saves it as ``jumprelu`` (SAE) or
``jumprelu_transcoder`` with the threshold repeated; bertscope's metadata says it is a BatchTopK (its ``k``), and
a SAELens file of those names without it is read as a JumpReLU. A selection over the whole batch: data-parallel
training is not exact, so it is refused.
"""

from __future__ import annotations

from typing import Any

import torch

from .kernels import auxk_term, batch_topk_activation
from .table import Architecture, register


def activate(d: Any, h: torch.Tensor) -> torch.Tensor:
    """Inference: ``ReLU(h) * (h > threshold)`` per token (``h [rows, d_sae]``)."""
    return h.relu() * (h > threshold(d)).to(h.dtype)


def train_activate(d: Any, h: torch.Tensor, settings: Any) -> torch.Tensor:
    """Training: the ``int(k * rows)`` largest entries of ``ReLU(h)`` over the batch."""
    return batch_topk_activation(h, d.config.k)


def after_step(d: Any, f: torch.Tensor, settings: Any) -> None:
    """Move the threshold towards the smallest kept activation (rate ``settings.topk_threshold_lr``)."""
    positive = f > 0
    if positive.any():
        lr = settings.topk_threshold_lr
        d.batch_threshold.mul_(1 - lr).add_(lr * f[positive].min())


def setup(d: Any, kw: dict[str, Any]) -> None:
    """The inference threshold: a scalar buffer (not trained)."""
    d.register_buffer("batch_threshold", torch.zeros((), **kw))


def init(d: Any, init_threshold: float) -> None:
    """Threshold 0 (it is learnt as a running average)."""
    d.batch_threshold.zero_()


def threshold(d: Any) -> torch.Tensor:
    """The one threshold repeated ``[d_sae]``."""
    return d.batch_threshold.expand(d.config.d_sae)


def load_threshold(d: Any, t: torch.Tensor) -> None:
    """Read the threshold back from SAELens's ``threshold [d_sae]`` (one value repeated)."""
    d.batch_threshold.fill_(float(t.flatten()[0]))


BATCHTOPK = register(Architecture(
    name="batchtopk", activate=activate, train_activate=train_activate, uses_k=True, unit_norm_decoder=True,
    revive="auxk", aux_loss=auxk_term, after_step=after_step, setup=setup, init=init, threshold=threshold,
    load_threshold=load_threshold, saelens={"sae": "jumprelu", "transcoder": "jumprelu_transcoder"},
    reads_saelens=False, data_parallel=False,
    summary="k active latents per token on average over a batch, a threshold at inference (SAELens BatchTopK)",
    citation="Bussmann et al. 2024, arXiv:2412.06410"))
