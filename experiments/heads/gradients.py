"""Gradient head importance (Michel et al. 2019), on plain arguments.

Gradient importance (Michel et al. 2019) with an MLM head is what their code computes
(pmichel31415/pytorch-pretrained-BERT, ``calculate_head_importance``): with ``ctx`` a head's output at a token
(``z_h[b, t]``) and ``L`` the loss summed over examples, the token's score is ``|<dL/dctx, ctx>|``, i.e.
``|dL/dg_{h,b,t}|`` for a gate per head AND token; it is summed over the real tokens of every sentence, divided by
the number of real tokens, then normalised per layer by the L2 norm over that layer's heads
(``normalize_scores_by_layer``; their extra division of the last layer by the subset size is not reproduced).
``L`` is the masked-LM loss (15% of the word pieces masked, seeded; mean over a sentence's masked pieces).
Otherwise, for a sentence encoder without an MLM head, a per-example gate is used and
``L = <r, u>`` with ``u`` the unit-normalised mean-pooled embedding and ``r ~ N(0, I)`` a fixed random
direction per example (several per example): since ``E_r |<r, J>| = sqrt(2 / pi) ||J||``, the importance is
proportional to the norm of the first-order change of the embedding's direction when the head is scaled, a
first-order (Taylor) estimate of the ``pooled_cos`` ablation effect. The distance from the clean embedding
itself would be useless here: it is minimal at ``g = 1``, so its gradient there is zero.

Relation to the circuits' node attribution table (``hooks/circuits/table.py``): ``|dL/dg|`` is the absolute value
of AtP's estimate for zero-ablating the head (``(0 - z) . dL/dz``), but taken per token (Michel et al.'s gate per
head and token) before summing, on a loss that is not a task's metric, with no corrupted run; the table's ``atp``
sums the signed estimate over positions against a corrupted run. The two compute different quantities, so this
module does not read that table; ``circuits.attribute(model, task, "atp")`` is the AtP of a task's heads.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import einops
import numpy as np
import torch
import torch.nn.functional as F
from bertscope.experiments.heads.importance import (
    TokenBatch,
    _check_eval,
    _device,
    _dtype,
    _mlm_inputs,
    _mlm_loss,
    _replicate,
    has_mlm_head,
    mean_pool,
)

OBJECTIVE_DESCRIPTIONS = {
    "mlm": (
        "Michel et al.: |<dL/dz_h, z_h>| per token, masked-LM loss (15% of word pieces masked, seeded), mean over "
        "real tokens, L2-normalised per layer"
    ),
    "projection": (
        "consistency check, not Michel et al.'s score (no MLM head): L = <r, u> with u the unit mean-pooled "
        "embedding and r ~ N(0, I) fixed per sentence and projection; E|dL/dg_h| is proportional to the norm of "
        "the first-order change of u, i.e. a Taylor estimate of the pooled_cos ablation effect"
    ),
}


def gradient_importance(
    model: torch.nn.Module,
    batches: Iterable[Any],
    *,
    objective: Literal["auto", "mlm", "projection"] = "auto",
    n_projections: int = 4,
    mlm_mask_prob: float = 0.15,
    seed: int = 0,
) -> tuple[np.ndarray, str]:
    """Per-sentence gradient importance at ``g = 1``.

    Args:
        objective: ``mlm`` (needs an MLM head: Michel et al.'s per-token score, ``michel_importance``, as the mean
            over a sentence's real tokens, before the per-layer normalisation), ``projection`` (per-example gate,
            ``|dL/dg_h|`` averaged over random projections; a consistency check, see the module docstring) or
            ``auto`` (MLM when the model has a head for it, else projection).
        n_projections: random directions per sentence for the projection objective.

    Returns:
        ``(importance [sentence, layer, head] float64, objective name)``.
    """
    _check_eval(model)
    if objective == "auto":
        objective = "mlm" if has_mlm_head(model) else "projection"
    if objective == "mlm" and not has_mlm_head(model):
        raise ValueError("objective='mlm' needs a model with a masked-LM head; use objective='projection'")
    if objective not in ("mlm", "projection"):
        raise ValueError(f"objective must be 'auto', 'mlm' or 'projection', got {objective!r}")
    if objective == "mlm":
        sums, tokens = michel_importance(model, batches, mlm_mask_prob=mlm_mask_prob, seed=seed)
        return sums / tokens[:, None, None], objective
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    generator = torch.Generator().manual_seed(seed)
    copies = n_projections
    out = []
    for raw in batches:
        batch = TokenBatch.of(raw)
        b = batch.input_ids.shape[0]
        projections = torch.randn(copies * b, model.config.d_model, generator=generator)
        rep = _replicate(batch, copies)
        gates = torch.ones(copies * b, n_layers, n_heads, device=_device(model), dtype=_dtype(model))
        gates.requires_grad_(True)
        loss = gate_objective(model, rep, gates, projections=projections)
        (grad,) = torch.autograd.grad(loss.sum(), gates)
        grad = einops.reduce(grad.abs().double(), "(k b) l h -> b l h", "mean", k=copies)
        out.append(grad.cpu())
    return torch.cat(out).numpy(), objective


def michel_importance(
    model: torch.nn.Module, batches: Iterable[Any], *, mlm_mask_prob: float = 0.15, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Michel et al.'s per-token head importance on the masked-LM loss, per sentence (before normalisation).

    Returns:
        ``(token_sums [sentence, layer, head], tokens [sentence])``: ``sum_t |dL/dg_{h,t}|`` over the real tokens
        of each sentence (``g`` a gate per head and token on ``z``) and the number of real tokens. The corpus score
        is ``michel_normalise(token_sums.sum(0) / tokens.sum())``.
    """
    _check_eval(model)
    if not has_mlm_head(model):
        raise ValueError("Michel et al.'s importance needs a model with a masked-LM head")
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    generator = torch.Generator().manual_seed(seed)
    sums, tokens = [], []
    for raw in batches:
        batch = TokenBatch.of(raw)
        ids, labels = _mlm_inputs(model, batch, mlm_mask_prob, generator)
        b, p = ids.shape
        gates = torch.ones(b, p, n_layers, n_heads, device=_device(model), dtype=_dtype(model), requires_grad=True)
        hooks = [(f"blocks.{layer}.attn.hook_z", lambda z, hook, g=gates[:, :, layer, :, None]: z * g.to(z.dtype))
                 for layer in range(n_layers)]  # fmt: skip
        with model.hooks(hooks):
            hidden = model(ids, batch.attention_mask, batch.token_type_ids)
        loss = _mlm_loss(model, hidden, labels).sum()  # summed over examples, as their classifier loss
        (grad,) = torch.autograd.grad(loss, gates)
        real = batch.attention_mask.to(grad.device, torch.float64)[:, :, None, None]
        sums.append((grad.abs().double() * real).sum(1).cpu())
        tokens.append(batch.attention_mask.sum(-1).double().cpu())
    return torch.cat(sums).numpy(), torch.cat(tokens).numpy()


def michel_normalise(importance: np.ndarray) -> np.ndarray:
    """Per-layer L2 normalisation of ``[..., layer, head]`` scores (their ``normalize_scores_by_layer``)."""
    x = np.asarray(importance, dtype=np.float64)
    return x / (np.sqrt((x**2).sum(-1, keepdims=True)) + 1e-20)


def gate_objective(
    model: torch.nn.Module,
    batch: TokenBatch,
    gates: torch.Tensor,
    *,
    projections: torch.Tensor | None = None,
    mlm_labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-example objective with head outputs scaled by gates: ``z[b, :, h] *= gates[b, layer, h]``.

    Args:
        batch: inputs ``[batch, pos]``.
        gates: ``[batch, layer, head]`` (requires grad for importance).
        projections: ``[batch, d_model]`` random directions -> ``L_b = <r_b, u_b>``, ``u_b`` the unit
            mean-pooled embedding.
        mlm_labels: ``[batch, pos]`` token ids at masked positions, -100 elsewhere -> masked-LM loss.

    Returns:
        ``[batch]``.
    """
    if (projections is None) == (mlm_labels is None):
        raise ValueError("gate_objective needs exactly one of projections or mlm_labels")
    hooks = []
    for layer in range(model.config.n_layers):
        g = einops.rearrange(gates[:, layer], "b h -> b 1 h 1")
        hooks.append((f"blocks.{layer}.attn.hook_z", lambda z, hook, g=g: z * g.to(z.dtype)))
    with model.hooks(hooks):
        hidden = model(batch.input_ids, batch.attention_mask, batch.token_type_ids)
    if mlm_labels is not None:
        return _mlm_loss(model, hidden, mlm_labels)
    pooled = F.normalize(mean_pool(hidden, batch.attention_mask).double(), dim=-1)
    return (pooled * projections.to(pooled)).sum(-1)
