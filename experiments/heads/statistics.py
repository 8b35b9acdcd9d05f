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
from bertscope.probes.bootstrap import mean_of_groups, percentile_interval, resample_counts

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


def heldout_folds(n: int, seed: int) -> np.ndarray:
    """Seeded split of ``n`` sentences into halves -> ``[n]`` fold 0/1 (selection on one, report on the other)."""
    fold = np.zeros(n, dtype=np.int64)
    fold[np.random.default_rng(seed).permutation(n)[: n // 2]] = 1
    return fold


def ratio_with_se(
    numerators: np.ndarray, denominators: np.ndarray, *, n_boot: int = 1000, ci: float = 0.95, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``probes.bootstrap.ratio_of_sums`` over groups plus the standard deviation of its replicates.

    Args:
        numerators: ``[group, k]`` per-group sums (e.g. hits per sentence).
        denominators: ``[group]`` per-group counts (e.g. arcs per sentence).

    Returns:
        ``(ratio, ci_low, ci_high, se)``, each ``[k]``; the replicates are ``ratio_of_sums``'s (same counts from
        ``resample_counts(groups, n_boot, seed)``), their standard deviation is the bootstrap standard error.
    """
    num = np.asarray(numerators, dtype=np.float64)
    den = np.asarray(denominators, dtype=np.float64)
    if num.ndim != 2 or den.shape != num.shape[:1] or len(den) == 0:
        raise ValueError(f"ratio_with_se needs numerators [group, k] and denominators [group]; got {num.shape}, "
                         f"{den.shape}")  # fmt: skip
    counts = resample_counts(len(den), n_boot, seed)  # [boot, group]
    with np.errstate(invalid="ignore", divide="ignore"):
        replicates = (counts @ num) / (counts @ den)[:, None]  # [boot, k]
    low, high = percentile_interval(replicates, ci)
    se = np.nanstd(replicates, axis=0) if n_boot else np.zeros(num.shape[1])
    return num.sum(0) / den.sum(), low, high, se


def crossed_bootstrap_mean(
    values: np.ndarray, *, n_boot: int = 1000, ci: float = 0.95, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over sentences AND orders of ``values [sentence, order, ...]``, with a bootstrap that resamples
    sentences and orders independently (so the interval covers both sources of variance).

    Counts come from ``probes.bootstrap.resample_counts`` (sentences with ``seed``, orders with ``[seed, 1]``).
    Returns ``(mean, ci_low, ci_high)``, each shaped ``values.shape[2:]``.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim < 2 or 0 in x.shape[:2]:
        raise ValueError(f"crossed_bootstrap_mean needs [sentence, order, ...] with both non-empty, got {x.shape}")
    s, o = x.shape[:2]
    flat = x.reshape(s, o, -1)
    mean = flat.mean((0, 1))
    w_s = resample_counts(s, n_boot, seed) / s  # [boot, sentence]
    w_o = resample_counts(o, n_boot, [seed, 1]) / o  # [boot, order]
    replicates = np.einsum("bs,sok,bo->bk", w_s, flat, w_o)
    low, high = percentile_interval(replicates, ci)
    shape = x.shape[2:]
    return mean.reshape(shape), low.reshape(shape), high.reshape(shape)


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
        OTHER half; ``probes.bootstrap.mean_of_groups`` over sentences, the choice held fixed), and the in-sample
        ``value`` of the unit chosen on all sentences (``chosen_all``), for comparison.
    """
    x = np.asarray(values, dtype=np.float64)
    fold = np.asarray(fold)
    k = min(k, x.shape[1])
    chosen = np.stack([np.argsort(-x[fold == f].mean(0), kind="stable")[:k] for f in (0, 1)])  # [fold, rank]
    overall = np.argsort(-x.mean(0), kind="stable")[:k]
    # a sentence of half f is scored with the unit chosen on the other half
    heldout = np.take_along_axis(x, chosen[1 - fold], axis=1)  # [sentence, rank]
    out, n = mean_of_groups(heldout, n_boot=n_boot, level=ci, seed=seed)
    return [
        {"rank": r + 1, "chosen_on_0": int(chosen[0][r]), "chosen_on_1": int(chosen[1][r]),
         "heldout_value": out.value[r], "ci_low": out.low[r], "ci_high": out.high[r], "n": int(n[r]),
         "chosen_all": int(overall[r]), "value": x[:, overall[r]].mean()}
        for r in range(k)
    ]  # fmt: skip
