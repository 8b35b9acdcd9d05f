"""Per-head attention statistics on plain tensors (no model): the measures of Clark et al. (2019).

Every function takes one layer's attention pattern ``[batch, head, query, key]`` plus boolean token masks
``[batch, pos]`` and returns one value per (sentence, head), so that each sentence can be weighted equally
and bootstrapped over. Queries are all real (non-padding) tokens of a sentence, [CLS] and [SEP] included.

The masses and the norm weighting (Kobayashi et al. 2020: ``||A[i, j] f(x_j)||`` with ``f(x_j) = v_j W_O[h]``)
come from :mod:`bertscope.experiments.attention`; a norm-weighted mass is the share of a query's total
contribution that comes from the keys of a category. Output names keep this experiment's public metric
names (``mass_prev`` is ``attention.previous_mass`` averaged over real queries, ...).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import einops
import numpy as np
import torch
from bertscope.experiments import attention

# Scalar statistics, one value per (sentence, head). ``norm_*`` are the Kobayashi norm-weighted versions.
MASS_METRICS = ("mass_cls", "mass_sep", "mass_punct", "mass_self", "mass_prev", "mass_next")
SCALAR_METRICS = (
    *MASS_METRICS,
    "sep_to_sep",
    "entropy",
    "entropy_max",
    "entropy_ratio",
    "confidence",
    "mean_distance",
)
NORM_METRICS = tuple("norm_" + m.removeprefix("mass_") for m in MASS_METRICS)


@dataclass
class SentenceStats:
    """Statistics of one layer for a batch of sentences.

    ``scalars[name]``: ``[batch, head]`` float64 (NaN where undefined, e.g. ``sep_to_sep`` without a [SEP]).
    ``offset_fraction``: ``[batch, head, 2 * max_offset + 1]``, the fraction of a sentence's queries whose
    argmax key lies at offset ``k - i`` (bin ``offset + max_offset``; offsets beyond are clipped to the end bins).
    """

    scalars: dict[str, torch.Tensor]
    offset_fraction: torch.Tensor
    max_offset: int

    @property
    def offsets(self) -> np.ndarray:
        """Offsets of the histogram bins, ``[2 * max_offset + 1]``."""
        return np.arange(-self.max_offset, self.max_offset + 1)


def attention_statistics(
    pattern: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    cls_mask: torch.Tensor,
    sep_mask: torch.Tensor,
    punct_mask: torch.Tensor,
    value_norms: torch.Tensor | None = None,
    max_offset: int = 128,
    smoothing: float = 1e-6,
) -> SentenceStats:
    """Per-(sentence, head) statistics of one layer.

    Args:
        pattern: ``[batch, head, query, key]`` attention weights; rows of real queries sum to 1 over real keys.
        attention_mask: ``[batch, pos]`` 1/True for real tokens, 0/False for padding.
        cls_mask, sep_mask, punct_mask: ``[batch, pos]`` bool, which keys are [CLS], [SEP], punctuation.
        value_norms: optional ``[batch, head, key]`` norms ``||v_j W_O[h]||``; adds the ``norm_*`` metrics.
        max_offset: half-width of the argmax-offset histogram.
        smoothing: ``alpha`` in ``p' = (1 - alpha) p + alpha / n`` before the log of the entropy (a mixture
            with the uniform row, so a uniform row keeps entropy ``ln n`` exactly).

    Returns:
        ``SentenceStats``; entropies are in nats, ``entropy_max`` is ``ln n`` for a sentence of ``n`` tokens.
    """
    _check_inputs(pattern, attention_mask, cls_mask, sep_mask, punct_mask, value_norms)
    p = pattern.detach().to(torch.float64)
    valid = attention_mask.to(torch.bool)
    keys = valid[:, None, None, :].to(p.dtype)  # [batch, 1, 1, key]
    p = p * keys
    n = valid.sum(-1).to(p.dtype)  # [batch]

    scalars = _masses(p, valid, cls_mask, sep_mask, punct_mask, prefix="mass_")
    scalars["sep_to_sep"] = _sep_to_sep(p, valid, sep_mask.to(torch.bool))

    smoothed = (1.0 - smoothing) * p + smoothing * keys / n[:, None, None, None]
    row_entropy = -torch.special.xlogy(smoothed, smoothed).sum(-1)  # [batch, head, query]
    scalars["entropy"] = _mean_over_queries(row_entropy, valid)
    entropy_max = torch.log(n)[:, None].expand_as(scalars["entropy"])
    scalars["entropy_max"] = entropy_max.clone()
    scalars["entropy_ratio"] = scalars["entropy"] / entropy_max.clamp_min(math.log(2))

    scalars["confidence"] = _mean_over_queries(p.amax(-1), valid)
    pos = torch.arange(p.shape[-1], device=p.device, dtype=p.dtype)
    distance = (pos[None, :] - pos[:, None]).abs()  # [query, key]
    scalars["mean_distance"] = _mean_over_queries((p * distance).sum(-1), valid)

    if value_norms is not None:
        weighted = attention.norm_weighted(p, value_norms.detach())
        scalars.update(_masses(weighted, valid, cls_mask, sep_mask, punct_mask, prefix="norm_"))

    offset_fraction = _argmax_offset_fraction(p, valid, max_offset)
    return SentenceStats(scalars=scalars, offset_fraction=offset_fraction, max_offset=max_offset)


# ----------------------------------------------------------------------------------------------- helpers


def _check_inputs(
    pattern: torch.Tensor,
    attention_mask: torch.Tensor,
    cls_mask: torch.Tensor,
    sep_mask: torch.Tensor,
    punct_mask: torch.Tensor,
    value_norms: torch.Tensor | None,
) -> None:
    if pattern.ndim != 4 or pattern.shape[-1] != pattern.shape[-2]:
        raise ValueError(f"pattern must be [batch, head, query, key] with query == key, got {tuple(pattern.shape)}")
    batch, head, pos, _ = pattern.shape
    for name, mask in (
        ("attention_mask", attention_mask),
        ("cls_mask", cls_mask),
        ("sep_mask", sep_mask),
        ("punct_mask", punct_mask),
    ):
        if tuple(mask.shape) != (batch, pos):
            raise ValueError(f"{name} must be [batch, pos] = {(batch, pos)} to match pattern, got {tuple(mask.shape)}")
    if not attention_mask.to(torch.bool).any(-1).all():
        raise ValueError("every sentence needs at least one real token (attention_mask row of all zeros)")
    if value_norms is not None and tuple(value_norms.shape) != (batch, head, pos):
        raise ValueError(
            f"value_norms must be [batch, head, key] = {(batch, head, pos)}, got {tuple(value_norms.shape)}"
        )


def _mean_over_queries(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``x [batch, head, query]`` averaged over real queries -> ``[batch, head]`` (NaN if none)."""
    q = valid[:, None, :].to(x.dtype)
    return (x * q).sum(-1) / q.sum(-1)


def _masses(
    p: torch.Tensor,
    valid: torch.Tensor,
    cls_mask: torch.Tensor,
    sep_mask: torch.Tensor,
    punct_mask: torch.Tensor,
    prefix: str,
) -> dict[str, torch.Tensor]:
    """Mean mass to [CLS], [SEP], punctuation, self, previous and next token; each ``[batch, head]``.

    Queries: every real token; previous / next: the real queries whose neighbour is real.
    """
    out = {}
    for name, keys in (("cls", cls_mask), ("sep", sep_mask), ("punct", punct_mask)):
        out[prefix + name] = _mean_over_queries(attention.key_mass(p, keys.to(torch.bool)), valid)
    out[prefix + "self"] = _mean_over_queries(attention.self_mass(p), valid)
    out[prefix + "prev"] = _mean_over_queries(attention.previous_mass(p), attention.has_previous(valid))
    out[prefix + "next"] = _mean_over_queries(attention.next_mass(p), attention.has_next(valid))
    return out


def _sep_to_sep(p: torch.Tensor, valid: torch.Tensor, sep: torch.Tensor) -> torch.Tensor:
    """Mean over [SEP] queries of their mass to [SEP] keys -> ``[batch, head]`` (NaN with no [SEP])."""
    to_sep = (p * sep[:, None, None, :].to(p.dtype)).sum(-1)
    return _mean_over_queries(to_sep, sep & valid)


def _argmax_offset_fraction(p: torch.Tensor, valid: torch.Tensor, max_offset: int) -> torch.Tensor:
    """Fraction of real queries whose argmax key is at each offset -> ``[batch, head, 2 * max_offset + 1]``."""
    batch, head, pos, _ = p.shape
    top = p.argmax(-1)  # [batch, head, query]; ties go to the lowest key index
    offset = top - torch.arange(pos, device=p.device)[None, None, :]
    bins = offset.clamp(-max_offset, max_offset) + max_offset
    weight = einops.repeat(valid.to(p.dtype), "b q -> b h q", h=head)
    hist = torch.zeros(batch, head, 2 * max_offset + 1, dtype=p.dtype, device=p.device)
    hist.scatter_add_(-1, bins, weight)
    return hist / valid.sum(-1).to(p.dtype)[:, None, None]
