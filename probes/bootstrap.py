"""The group bootstrap with percentile intervals: the one implementation every table in bertscope uses.

A replicate resamples whole groups (sentences, documents, windows) with replacement. It is represented by a
count matrix ``counts [n_boot, n_groups]`` (how often each group was drawn: one multinomial draw of
``n_groups`` over equal probabilities per replicate), so any statistic written as a function of per-group
sufficient statistics costs a matrix product per replicate, vectorised over many metrics at once:

- ratio of sums: ``(counts @ numer) / (counts @ denom)`` with ``numer, denom [n_groups, ...]`` (e.g. per-sentence
  sums of a mass and of the number of queries);
- mean of per-group means: the same with ``numer`` the per-group means and ``denom`` 1 where the group's value
  is defined (``mean_of_groups``).

The point estimate is the statistic at the identity resample (every count 1). Intervals are percentile
intervals at ``level`` (quantiles ``(1 - level) / 2`` and ``1 - (1 - level) / 2``, linear interpolation,
non-finite replicates left out). Draws come from ``numpy.random.default_rng(seed)``; drawing in chunks gives the
same replicates as drawing at once, so a result depends only on ``(n_groups, n_boot, seed)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

Seed = int | Sequence[int]


@dataclass(frozen=True)
class Interval:
    """A point estimate with its percentile bootstrap interval; arrays share the statistic's trailing shape."""

    value: np.ndarray
    low: np.ndarray
    high: np.ndarray


def resample_counts(n_groups: int, n_boot: int, seed: Seed) -> np.ndarray:
    """Group counts ``[n_boot, n_groups]`` (float64) of ``n_boot`` resamples with replacement."""
    parts = list(iter_resample_counts(n_groups, n_boot, seed))
    return np.concatenate(parts).astype(np.float64) if parts else np.zeros((0, n_groups))


def iter_resample_counts(n_groups: int, n_boot: int, seed: Seed, *, max_cells: int = 4_000_000) -> Iterator[np.ndarray]:
    """Yield the rows of ``resample_counts`` in chunks ``[m, n_groups]`` of at most ``max_cells`` cells."""
    if n_groups < 1:
        raise ValueError(f"the bootstrap needs at least one group, got {n_groups}")
    if n_boot < 0:
        raise ValueError(f"n_boot must be >= 0, got {n_boot}")
    rng = np.random.default_rng(seed)
    per_chunk = max(1, max_cells // n_groups)
    pvals = np.full(n_groups, 1.0 / n_groups)
    for start in range(0, n_boot, per_chunk):
        yield rng.multinomial(n_groups, pvals, size=min(per_chunk, n_boot - start))


def percentile_interval(replicates: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval over axis 0 of ``replicates [n_boot, ...]`` -> ``(low, high)``, each ``[...]``.

    Non-finite replicates are left out; where none is finite (or ``n_boot == 0``) both bounds are NaN.
    """
    _check_level(level)
    x = np.asarray(replicates, dtype=np.float64)
    shape = x.shape[1:]
    if x.shape[0] == 0:
        return np.full(shape, np.nan), np.full(shape, np.nan)
    tail = (1.0 - level) / 2.0
    finite = np.isfinite(x)
    if finite.all():
        low, high = np.quantile(x, [tail, 1.0 - tail], axis=0)
    else:
        masked = np.where(finite, x, np.nan)
        keep = finite.any(0)
        low, high = np.full(shape, np.nan), np.full(shape, np.nan)
        if keep.any():
            low[keep], high[keep] = np.nanquantile(masked[:, keep], [tail, 1.0 - tail], axis=0)
    return np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)


def group_bootstrap(
    statistic: Callable[[np.ndarray], np.ndarray],
    n_groups: int,
    *,
    n_boot: int,
    level: float = 0.95,
    seed: Seed = 0,
    max_cells: int = 4_000_000,
) -> Interval:
    """Point estimate and percentile interval of ``statistic(counts [m, n_groups]) -> [m, ...]``.

    ``statistic`` must be vectorised over resamples (row ``r`` of its result is the statistic under the
    counts of row ``r``); the point estimate is its value at counts all ones. ``n_boot == 0`` gives NaN bounds.
    """
    _check_level(level)
    value = np.asarray(statistic(np.ones((1, n_groups))), dtype=np.float64)[0]
    reps = [
        np.asarray(statistic(c.astype(np.float64)), dtype=np.float64)
        for c in iter_resample_counts(n_groups, n_boot, seed, max_cells=max_cells)
    ]
    replicates = np.concatenate(reps) if reps else np.zeros((0, *value.shape))
    low, high = percentile_interval(replicates, level)
    return Interval(value=value, low=low, high=high)


def ratio_of_sums(
    numer: np.ndarray, denom: np.ndarray, *, n_boot: int, level: float = 0.95, seed: Seed = 0
) -> Interval:
    """``sum_g numer[g] / sum_g denom[g]`` with its group-bootstrap interval.

    Args:
        numer, denom: ``[n_groups, ...]`` per-group sums (``denom`` broadcasts against ``numer``).

    Returns:
        ``Interval`` with arrays ``[...]``; NaN where the resampled denominator is 0.
    """
    num = np.asarray(numer, dtype=np.float64)
    den = np.broadcast_to(np.asarray(denom, dtype=np.float64), num.shape)
    if num.ndim == 0 or num.shape[0] == 0:
        raise ValueError(f"ratio_of_sums needs [n_groups, ...] arrays with at least one group, got {num.shape}")
    num2, den2 = num.reshape(num.shape[0], -1), den.reshape(num.shape[0], -1)

    def ratio(counts: np.ndarray) -> np.ndarray:
        top, bottom = counts @ num2, counts @ den2
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(bottom != 0, top / np.where(bottom != 0, bottom, 1.0), np.nan)

    out = group_bootstrap(ratio, num.shape[0], n_boot=n_boot, level=level, seed=seed)
    shape = num.shape[1:]
    return Interval(out.value.reshape(shape), out.low.reshape(shape), out.high.reshape(shape))


def mean_of_groups(
    values: np.ndarray, *, n_boot: int, level: float = 0.95, seed: Seed = 0
) -> tuple[Interval, np.ndarray]:
    """Mean over groups of per-group values ``[n_groups, ...]`` (NaN = undefined for that group, left out).

    Returns ``(Interval, n)`` where ``n [...]`` counts the groups where the value is defined; bounds are NaN
    where ``n == 0``.
    """
    x = np.asarray(values, dtype=np.float64)
    defined = ~np.isnan(x)
    out = ratio_of_sums(np.where(defined, x, 0.0), defined.astype(np.float64), n_boot=n_boot, level=level, seed=seed)
    return out, defined.sum(0)


def _check_level(level: float) -> None:
    if not 0 < level < 1:
        raise ValueError(f"the interval level must be in (0, 1), got {level}")
