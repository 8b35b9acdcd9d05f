"""``topk``: keep the ``k`` largest entries of ``h`` per row, then ReLU (SAELens ``TopK``; Gao et al. 2024).

Decoder rows at unit norm; dead latents come back through the AuxK loss (SAELens's ``calculate_topk_aux_loss``).
Training uses the exact sparse form (:func:`topk_loss`): the encoder's backward and the decoder touch only the
``k`` active latents of each row. SAELens name: ``topk`` (with ``k``; a file with ``rescale_acts_by_decoder_norm``
is folded into unit-norm decoder rows on reading, SAELens's ``_fold_norm_topk``). SAELens has no TopK transcoder.
"""

from __future__ import annotations

from typing import Any

import torch

from .kernels import SparseDecodeFunction, TopKEncodeFunction, auxk_dead_term, auxk_term, topk_activation
from .table import Architecture, register


def activate(d: Any, h: torch.Tensor) -> torch.Tensor:
    """The ``k`` largest entries of each row of ``h [rows, d_sae]``, ReLU'd; zero elsewhere."""
    return topk_activation(h, d.config.k)


def topk_loss(d: Any, x: torch.Tensor, y: torch.Tensor, settings: Any, dead: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training loss of a TopK dictionary (no skip path) on its sparse form: ``(loss, values [rows, k],
    indices [rows, k], y_hat [rows, d_out])``, the ``k`` kept activations of each row (after ReLU) and their
    latents; AuxK over the ``dead`` latents' pre-activations only: the same loss and gradients as the dense
    formulas."""
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
        loss = loss + auxk_dead_term(d, h_dead, cols, y, y_hat, settings)
    return loss, values, indices, y_hat


def saelens_fields(config: Any) -> dict[str, Any]:
    """``cfg.json``'s ``k`` and ``rescale_acts_by_decoder_norm`` (False: bertscope's decoders are unit norm)."""
    return {"k": int(config.k), "rescale_acts_by_decoder_norm": False}


def saelens_in(cfg: dict[str, Any], state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fold SAELens's ``rescale_acts_by_decoder_norm`` into unit-norm decoder rows (``_fold_norm_topk``)."""
    if not cfg.get("rescale_acts_by_decoder_norm", False):
        return state
    n = state["W_dec"].norm(dim=-1)
    return {**state, "b_enc": state["b_enc"] * n, "W_enc": state["W_enc"] * n, "W_dec": state["W_dec"] / n[:, None]}


TOPK = register(Architecture(
    name="topk", activate=activate, uses_k=True, unit_norm_decoder=True, revive="auxk", aux_loss=auxk_term,
    sparse_loss=topk_loss, saelens={"sae": "topk"}, saelens_fields=saelens_fields, saelens_in=saelens_in,
    summary="exactly k active latents per token, AuxK for dead latents (SAELens TopK)",
    citation="Gao et al. 2024, arXiv:2406.04093"))
