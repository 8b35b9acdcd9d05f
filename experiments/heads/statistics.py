"""Per-head attention statistics on plain tensors (no model): the measures of Clark et al. (2019).

Every function takes one layer's attention pattern ``[batch, head, query, key]`` plus boolean token masks
``[batch, pos]`` and returns one value per (sentence, head), so that each sentence can be weighted equally
and bootstrapped over. Queries are all real (non-padding) tokens of a sentence, [CLS] and [SEP] included.

Norm-weighted masses follow Kobayashi et al. (2020): the contribution of key ``j`` to query ``i`` is
``||A[i, j] f(x_j)||`` with ``f(x_j) = v_j W_O[h]``; a norm-weighted mass is the share of a query's total
contribution that comes from the keys of a category.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import einops
import numpy as np
import torch

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
        weighted = p * value_norms.detach().to(p.dtype)[:, :, None, :]
        weighted = weighted / weighted.sum(-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)
        scalars.update(_masses(weighted, valid, cls_mask, sep_mask, punct_mask, prefix="norm_"))

    offset_fraction = _argmax_offset_fraction(p, valid, max_offset)
    return SentenceStats(scalars=scalars, offset_fraction=offset_fraction, max_offset=max_offset)


def value_norms(v: torch.Tensor, W_O: torch.Tensor) -> torch.Tensor:
    """Kobayashi norms ``||v_j W_O[h]||``.

    Args:
        v: ``[batch, pos, head, d_head]`` (``blocks.L.attn.hook_v``, bias included).
        W_O: ``[head, d_head, d_model]``.

    Returns:
        ``[batch, head, pos]``.
    """
    if v.ndim != 4 or W_O.ndim != 3 or v.shape[2:] != W_O.shape[:2]:
        raise ValueError(
            f"value_norms needs v [batch, pos, head, d_head] and W_O [head, d_head, d_model] with matching "
            f"head and d_head; got v {tuple(v.shape)} and W_O {tuple(W_O.shape)}"
        )
    dtype = torch.float64 if torch.float64 in (v.dtype, W_O.dtype) else torch.float32
    f = torch.einsum("bphd,hdm->bhpm", v.detach().to(dtype), W_O.detach().to(device=v.device, dtype=dtype))
    return torch.linalg.vector_norm(f, dim=-1)


def bootstrap_mean(
    values: np.ndarray, *, n_boot: int = 1000, ci: float = 0.95, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean over sentences with a percentile bootstrap CI, resampling sentences (rows).

    Args:
        values: ``[sentence, ...]``; NaN marks a sentence where the statistic is undefined (it is left out).

    Returns:
        ``(mean, ci_low, ci_high, n)``, each shaped ``values.shape[1:]``; ``n`` counts the defined sentences.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim == 0 or x.shape[0] == 0:
        raise ValueError(f"bootstrap_mean needs at least one sentence (a [sentence, ...] array), got {x.shape}")
    if not 0 < ci < 1:
        raise ValueError(f"ci must be in (0, 1), got {ci}")
    flat = x.reshape(x.shape[0], -1)
    defined = ~np.isnan(flat)
    filled = np.where(defined, flat, 0.0)
    n = defined.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = filled.sum(0) / n
    rng = np.random.default_rng(seed)
    s = flat.shape[0]
    # Resampling with replacement = multinomial counts per sentence; means are then two matrix products.
    counts = rng.multinomial(s, np.full(s, 1.0 / s), size=n_boot).astype(np.float64)  # [boot, sentence]
    with np.errstate(invalid="ignore", divide="ignore"):
        boots = (counts @ filled) / (counts @ defined)
    tail = (1.0 - ci) / 2.0
    low, high = np.nanquantile(boots, [tail, 1.0 - tail], axis=0) if n_boot > 0 else (mean, mean)
    low = np.where(n > 0, low, np.nan)
    high = np.where(n > 0, high, np.nan)
    shape = x.shape[1:]
    return mean.reshape(shape), low.reshape(shape), high.reshape(shape), n.reshape(shape)


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
    """Mean mass to [CLS], [SEP], punctuation, self, previous and next token; each ``[batch, head]``."""
    out = {}
    for name, keys in (("cls", cls_mask), ("sep", sep_mask), ("punct", punct_mask)):
        to_keys = (p * keys.to(torch.bool)[:, None, None, :].to(p.dtype)).sum(-1)
        out[prefix + name] = _mean_over_queries(to_keys, valid)
    out[prefix + "self"] = _mean_over_queries(torch.diagonal(p, dim1=-2, dim2=-1), valid)
    # Previous: A[i, i-1] for queries i >= 1 whose previous token is real; next: A[i, i+1] likewise.
    both = valid[:, 1:] & valid[:, :-1]  # [batch, pos - 1]: pair (i-1, i) both real
    prev = torch.diagonal(p, offset=-1, dim1=-2, dim2=-1)  # [batch, head, pos - 1], query i = 1..pos-1
    nxt = torch.diagonal(p, offset=1, dim1=-2, dim2=-1)  # [batch, head, pos - 1], query i = 0..pos-2
    out[prefix + "prev"] = _mean_over_queries(prev, both)
    out[prefix + "next"] = _mean_over_queries(nxt, both)
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


def bootstrap_ratio(
    numerators: np.ndarray, denominators: np.ndarray, *, n_boot: int = 1000, ci: float = 0.95, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Ratio of sums over groups with a percentile bootstrap that resamples groups (e.g. sentences) whole.

    Args:
        numerators: ``[group, k]`` per-group sums (e.g. hits per sentence).
        denominators: ``[group]`` per-group counts (e.g. arcs per sentence).

    Returns:
        ``(ratio, ci_low, ci_high, se)``, each ``[k]``: ``sum(num) / sum(den)``, the percentile interval and
        the standard deviation of the bootstrap replicates.
    """
    num = np.asarray(numerators, dtype=np.float64)
    den = np.asarray(denominators, dtype=np.float64)
    if num.ndim != 2 or den.shape != num.shape[:1] or len(den) == 0:
        raise ValueError(f"bootstrap_ratio needs numerators [group, k] and denominators [group]; got {num.shape}, "
                         f"{den.shape}")  # fmt: skip
    ratio = num.sum(0) / den.sum()
    if n_boot <= 0:
        return ratio, ratio.copy(), ratio.copy(), np.zeros_like(ratio)
    g = len(den)
    counts = np.random.default_rng(seed).multinomial(g, np.full(g, 1.0 / g), size=n_boot).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        boots = (counts @ num) / (counts @ den)[:, None]  # [boot, k]
    tail = (1.0 - ci) / 2.0
    low, high = np.nanquantile(boots, [tail, 1.0 - tail], axis=0)
    return ratio, low, high, np.nanstd(boots, axis=0)


def crossed_bootstrap_mean(
    values: np.ndarray, *, n_boot: int = 1000, ci: float = 0.95, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over sentences AND orders of ``values [sentence, order, ...]``, with a bootstrap that resamples
    sentences and orders independently (so the interval covers both sources of variance).

    Returns ``(mean, ci_low, ci_high)``, each shaped ``values.shape[2:]``.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim < 2 or 0 in x.shape[:2]:
        raise ValueError(f"crossed_bootstrap_mean needs [sentence, order, ...] with both non-empty, got {x.shape}")
    s, o = x.shape[:2]
    flat = x.reshape(s, o, -1)
    mean = flat.mean((0, 1))
    rng = np.random.default_rng(seed)
    w_s = rng.multinomial(s, np.full(s, 1.0 / s), size=n_boot) / s  # [boot, sentence]
    w_o = rng.multinomial(o, np.full(o, 1.0 / o), size=n_boot) / o  # [boot, order]
    boots = np.einsum("bs,sok,bo->bk", w_s, flat, w_o)
    tail = (1.0 - ci) / 2.0
    low, high = np.quantile(boots, [tail, 1.0 - tail], axis=0) if n_boot else (mean, mean)
    shape = x.shape[2:]
    return mean.reshape(shape), np.reshape(low, shape), np.reshape(high, shape)


def heldout_top(
    values: np.ndarray, fold: np.ndarray, k: int, *, n_boot: int = 1000, ci: float = 0.95, seed: int = 0
) -> list[dict]:
    """The ``k`` largest units chosen on one half of the sentences, their value read on the other half.

    Args:
        values: ``[sentence, unit]`` (e.g. a head's ablation effect per sentence, heads flattened).
        fold: ``[sentence]`` 0/1.

    Returns:
        One dict per rank ``1..k``: ``rank, chosen_on_0, chosen_on_1`` (units chosen on each half),
        ``heldout_value, ci_low, ci_high, n`` (the mean over sentences of the value of the unit chosen on the
        OTHER half; bootstrap over sentences, the choice held fixed), and the in-sample ``value`` of the unit
        chosen on all sentences (``chosen_all``), for comparison.
    """
    x = np.asarray(values, dtype=np.float64)
    fold = np.asarray(fold)
    k = min(k, x.shape[1])
    chosen = {f: np.argsort(-x[fold == f].mean(0), kind="stable")[:k] for f in (0, 1)}
    overall = np.argsort(-x.mean(0), kind="stable")[:k]
    # sentence in half f is scored with the unit chosen on the other half
    heldout = np.stack([x[i, chosen[1 - fold[i]]] for i in range(len(x))])  # [sentence, rank]
    mean, low, high, n = bootstrap_mean(heldout, n_boot=n_boot, ci=ci, seed=seed)
    return [
        {"rank": r + 1, "chosen_on_0": int(chosen[0][r]), "chosen_on_1": int(chosen[1][r]),
         "heldout_value": mean[r], "ci_low": low[r], "ci_high": high[r], "n": int(n[r]),
         "chosen_all": int(overall[r]), "value": x[:, overall[r]].mean()}
        for r in range(k)
    ]  # fmt: skip
