"""Metrics of the structure experiment with group-bootstrap intervals over test sentences, and the baselines.

Point values are the reporter's (`bertscope.probes.structural`), computed for many probes at once (predictions
``[..., n, n]`` per sentence); an interval resamples whole test sentences (`probes.bootstrap`) and recomputes
the same statistic: UUAS and root accuracy as ratios of sums, DSpr / NSpr as the macro-average over sentence
lengths 5-50 of the per-length means. Every statistic of a run uses the same resamples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass
class Scored:
    """Values and intervals of one metric for many probes: each ``[...]`` (the predictions' leading axes)."""

    value: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray


def resample_weights(n_sent: int, n_boot: int, seed: Sequence[int]) -> np.ndarray:
    """``[n_boot, n_sent]`` bootstrap multiplicities of the test sentences (``[0, n_sent]`` for no intervals)."""
    if n_boot < 1:
        return np.zeros((0, n_sent))
    return np.concatenate(list(iter_resample_counts(n_sent, n_boot, seed))).astype(np.float64)


def _ratio(numer: np.ndarray, denom: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``sum(w numer) / sum(w denom)`` per weight row: numer ``[..., n_sent]``, w ``[m, n_sent]`` -> ``[..., m]``."""
    d = w @ denom
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(d > 0, (numer @ w.T) / np.where(d > 0, d, 1), np.nan)


def _scored(stat, n_sent: int, weights: np.ndarray, ci: float) -> Scored:
    value = stat(np.ones((1, n_sent)))[..., 0]
    boot = stat(weights)  # [..., n_boot]
    low, high = percentile_interval(np.moveaxis(boot, -1, 0), ci)
    return Scored(value, low, high)


def score(pred: Sequence[np.ndarray], heads: Sequence[Sequence[int]], punct: Sequence[np.ndarray], kind: str,
          weights: np.ndarray, ci: float) -> dict[str, Scored]:
    """The kind's two metrics with intervals for every prediction: distance -> ``uuas``, ``dspr``; depth ->
    ``root_acc``, ``nspr``. ``pred``: per sentence ``[..., n, n]`` distances or ``[..., n]`` depths;
    ``weights``: `resample_weights`."""
    n = len(pred)
    total, count, length = spearman_parts(pred, heads, kind)
    spear = _scored(lambda w: length_macro_mean(total, count, length, weights=w), n, weights, ci)
    if kind == "distance":
        correct, edges = uuas_counts(pred, heads, punct)
        return {"uuas": _scored(lambda w: _ratio(correct, edges, w), n, weights, ci), "dspr": spear}
    hits = root_hits(pred, heads, punct)
    return {"root_acc": _scored(lambda w: _ratio(hits, np.ones(n), w), n, weights, ci), "nspr": spear}


def baselines(heads: Sequence[Sequence[int]], punct: Sequence[np.ndarray], weights: np.ndarray,
              ci: float) -> dict[str, Scored]:
    """UUAS of trees that use no representation: ``linear_chain`` (each non-punctuation word attached to the
    next: the MST of ``|i - j|``) and ``random_tree`` (the expected UUAS of a uniformly random spanning tree on
    the m non-punctuation words: each of the m - 1 gold edges is in it with probability 2 / m)."""
    n = len(heads)
    correct, edges = uuas_counts([linear_chain_distances(len(h)) for h in heads], heads, punct)
    m = np.array([(~np.asarray(p, dtype=bool)).sum() for p in punct], dtype=np.float64)
    expected = np.where(m > 1, (m - 1) * 2 / np.maximum(m, 1), 0.0)
    return {"linear_chain": _scored(lambda w: _ratio(correct, edges, w), n, weights, ci),
            "random_tree": _scored(lambda w: _ratio(expected, edges, w), n, weights, ci)}


def smallest_rank(sweep: dict[int, float], full_ci_low: float) -> int | None:
    """The smallest rank whose value reaches the full-rank probe's interval (>= its lower bound)."""
    reached = [k for k, v in sorted(sweep.items()) if np.isfinite(v) and v >= full_ci_low]
    return reached[0] if reached else None
