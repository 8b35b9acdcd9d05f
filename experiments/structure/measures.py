"""Metrics of the structure experiment with group-bootstrap intervals over test sentences, and the baselines.

Point values are the reporter's (`bertscope.probes.structural`); an interval resamples whole test sentences
(`probes.bootstrap.iter_resample_counts`) and recomputes the same statistic: UUAS and root accuracy as ratios of
sums, DSpr / NSpr as the macro-average over sentence lengths 5-50 of the per-length means.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from bertscope.probes.bootstrap import iter_resample_counts, percentile_interval
from bertscope.probes.structural import (
    length_macro_mean,
    linear_chain_distances,
    root_hits,
    spearman_parts,
    uuas_counts,
)

METRICS = {"distance": ("uuas", "dspr"), "depth": ("root_acc", "nspr")}


class _Stat:
    """A statistic of per-sentence parts, evaluated on the sample (``point``) and on bootstrap weights."""

    def __init__(self, fn, n_sent: int) -> None:
        self.fn, self.n_sent = fn, n_sent

    def point(self) -> float:
        return float(self.fn(np.ones((1, self.n_sent)))[0])

    def interval(self, n_boot: int, seed: Sequence[int], ci: float) -> tuple[float, float]:
        if n_boot < 1:
            return float("nan"), float("nan")
        draws = iter_resample_counts(self.n_sent, n_boot, seed)
        samples = np.concatenate([self.fn(c.astype(np.float64)) for c in draws])
        low, high = percentile_interval(samples, ci)
        return float(low), float(high)


def _ratio(numer: np.ndarray, denom: np.ndarray):
    def fn(w: np.ndarray) -> np.ndarray:
        d = w @ denom
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(d > 0, (w @ numer) / np.where(d > 0, d, 1), np.nan)

    return fn


def metric_stats(pred: Sequence[np.ndarray], heads: Sequence[Sequence[int]], punct: Sequence[np.ndarray],
                 kind: str) -> dict[str, _Stat]:
    """The kind's two metrics as bootstrappable statistics: distance -> ``uuas``, ``dspr``; depth ->
    ``root_acc``, ``nspr``. ``pred``: per sentence ``[n, n]`` distances or ``[n]`` depths."""
    n = len(pred)
    total, count, length = spearman_parts(pred, heads, kind)
    spear = _Stat(lambda w: length_macro_mean(total, count, length, weights=w), n)
    if kind == "distance":
        correct, edges = uuas_counts(pred, heads, punct)
        return {"uuas": _Stat(_ratio(correct, edges), n), "dspr": spear}
    hits = root_hits(pred, heads, punct)
    return {"root_acc": _Stat(_ratio(hits, np.ones(n)), n), "nspr": spear}


def baseline_stats(heads: Sequence[Sequence[int]], punct: Sequence[np.ndarray]) -> dict[str, _Stat]:
    """UUAS of trees that use no representation: ``linear_chain`` (each non-punctuation word attached to the
    next: the MST of ``|i - j|``) and ``random_tree`` (the expected UUAS of a uniformly random spanning tree on
    the m non-punctuation words: each of the m - 1 gold edges is in it with probability 2 / m)."""
    n = len(heads)
    correct, edges = uuas_counts([linear_chain_distances(len(h)) for h in heads], heads, punct)
    m = np.array([(~np.asarray(p, dtype=bool)).sum() for p in punct], dtype=np.float64)
    expected = np.where(m > 1, (m - 1) * 2 / np.maximum(m, 1), 0.0)
    return {"linear_chain": _Stat(_ratio(correct, edges), n), "random_tree": _Stat(_ratio(expected, edges), n)}


def smallest_rank(sweep: dict[int, float], full_ci_low: float) -> int | None:
    """The smallest rank whose value reaches the full-rank probe's interval (>= its lower bound)."""
    reached = [k for k, v in sorted(sweep.items()) if np.isfinite(v) and v >= full_ci_low]
    return reached[0] if reached else None
