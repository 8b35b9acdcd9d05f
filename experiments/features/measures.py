"""Measures of the features experiment, on arrays: single-unit labels chosen on dev rows and scored on test
rows, and k-sparse probing (SAEBench's protocol), each with a group-bootstrap interval over test sentences.

A *unit* is one coordinate of a representation: a dictionary latent, a neuron (a coordinate of the site), or a
PCA direction. A unit *fires* by a rule ``sign * (a - t) > 0``; the rule and the concept a unit is labelled with
are the pair with the highest Matthews correlation (MCC, 0 at chance whatever the base rate) on the dev rows,
and the label's score is the MCC of that same rule on the test rows. A latent's rules: ``a > t`` with ``t`` in
``{0}`` and the 25/50/75% quantiles of its non-zero dev values; a dense unit's rules: above its 50/75/90/95/99%
dev quantiles or below its 50/25/10/5/1% ones.

Intervals are percentile group bootstraps over test sentences (`bertscope.probes.bootstrap`): they cover the
choice of test sentences, not the training of the dictionary or the probes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from bertscope.probes.bootstrap import percentile_interval, resample_counts

SPARSE_QUANTILES = (0.25, 0.5, 0.75)
DENSE_QUANTILES = (0.5, 0.75, 0.9, 0.95, 0.99)


def mcc(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray, tn: np.ndarray) -> np.ndarray:
    """Matthews correlation from confusion counts (any matching shapes); 0 where a margin is empty."""
    tp, fp, fn, tn = (np.asarray(a, dtype=np.float64) for a in (tp, fp, fn, tn))
    den = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (tp * tn - fp * fn) / den
    return np.where(den > 0, out, 0.0)


def rules(a_dev: np.ndarray, sparse: bool) -> tuple[np.ndarray, np.ndarray]:
    """Firing rules per unit from its dev activations ``[n, m]``: signs and thresholds ``[n_rules, m]``."""
    if sparse:
        pos = np.where(a_dev > 0, a_dev, np.nan)
        with np.errstate(all="ignore"):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                q = np.nanquantile(pos, SPARSE_QUANTILES, axis=0)
        q = np.where(np.isfinite(q), q, np.inf)
        thresholds = np.concatenate([np.zeros((1, a_dev.shape[1])), q])
        return np.ones_like(thresholds), thresholds
    hi = np.quantile(a_dev, DENSE_QUANTILES, axis=0)
    lo = np.quantile(a_dev, [1 - q for q in DENSE_QUANTILES], axis=0)
    return np.concatenate([np.ones_like(hi), -np.ones_like(lo)]), np.concatenate([hi, lo])


def fire(a: np.ndarray, sign: np.ndarray, threshold: np.ndarray) -> np.ndarray:
    """``sign * (a - threshold) > 0`` with broadcasting."""
    return sign * (a - threshold) > 0


@dataclass
class DevScores:
    """Dev-split choices: per unit its best (concept, rule) and dev MCC; per concept its best (unit, rule)."""

    unit_concept: np.ndarray  # [m]
    unit_sign: np.ndarray
    unit_threshold: np.ndarray
    unit_mcc: np.ndarray
    concept_unit: np.ndarray  # [c]
    concept_sign: np.ndarray
    concept_threshold: np.ndarray
    concept_mcc: np.ndarray


def dev_scores(a_dev: np.ndarray, y_dev: np.ndarray, *, sparse: bool, chunk: int = 512) -> DevScores:
    """For units ``a_dev [n, m]`` and concepts ``y_dev [n, c]`` (bool): the best (rule, concept) of every unit
    and the best (unit, rule) of every concept by dev MCC (see the module docstring)."""
    n, m = a_dev.shape
    c = y_dev.shape[1]
    y = y_dev.astype(np.float32)
    pos = y.sum(0)
    u = {k: np.zeros(m) for k in ("concept", "sign", "threshold")}
    u["mcc"] = np.full(m, -np.inf)
    best_c = {"unit": np.zeros(c, int), "sign": np.ones(c), "threshold": np.zeros(c), "mcc": np.full(c, -np.inf)}
    for start in range(0, m, chunk):
        a = a_dev[:, start:start + chunk]
        signs, thresholds = rules(a, sparse)
        for r in range(len(signs)):
            p = fire(a, signs[r], thresholds[r]).astype(np.float32)  # [n, mc]
            tp = p.T @ y  # [mc, c]
            fired = p.sum(0)[:, None]
            score = mcc(tp, fired - tp, pos[None, :] - tp, n - fired - pos[None, :] + tp)
            j = score.argmax(1)
            top = score[np.arange(len(j)), j]
            idx = np.arange(start, start + a.shape[1])
            better = top > u["mcc"][idx]
            u["mcc"][idx[better]] = top[better]
            u["concept"][idx[better]] = j[better]
            u["sign"][idx[better]] = signs[r][better]
            u["threshold"][idx[better]] = thresholds[r][better]
            i = score.argmax(0)
            topc = score[i, np.arange(c)]
            bc = topc > best_c["mcc"]
            best_c["mcc"][bc] = topc[bc]
            best_c["unit"][bc] = idx[i[bc]]
            best_c["sign"][bc] = signs[r][i[bc]]
            best_c["threshold"][bc] = thresholds[r][i[bc]]
    return DevScores(u["concept"].astype(int), u["sign"], u["threshold"], u["mcc"], best_c["unit"],
                     best_c["sign"], best_c["threshold"], best_c["mcc"])


def score_on_test(a_test: np.ndarray, y_test: np.ndarray, units: np.ndarray, concepts: np.ndarray, signs: np.ndarray,
             thresholds: np.ndarray, sentence: np.ndarray, *, n_boot: int, seed: int,
             ci: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Test MCC of each (unit, concept, rule) triple, with its percentile interval from a bootstrap over test
    sentences (``sentence``: the sentence of each test row). Returns (value, low, high), each ``[T]``."""
    if len(units) == 0:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    p = fire(a_test[:, units], signs, thresholds)
    y = y_test[:, concepts]
    groups, inv = np.unique(sentence, return_inverse=True)
    member = _membership(inv, len(groups))
    counts = np.stack([member @ cell.astype(np.float64) for cell in (p & y, p & ~y, ~p & y, ~p & ~y)])
    value = mcc(*counts.sum(1))
    if n_boot <= 0:
        return value, np.full_like(value, np.nan), np.full_like(value, np.nan)
    w = resample_counts(len(groups), n_boot, seed)
    reps = mcc(*(w @ counts[k] for k in range(4)))
    low, high = percentile_interval(reps, ci)
    return value, low, high


def _membership(inv: np.ndarray, n_groups: int):
    """Sparse ``[n_groups, n_rows]`` indicator of each row's group."""
    from scipy.sparse import csr_matrix

    return csr_matrix((np.ones(len(inv)), (inv, np.arange(len(inv)))), shape=(n_groups, len(inv)))


# --------------------------------------------------------------------------------------- k-sparse probing
def logistic_fit(x: np.ndarray, y: np.ndarray, *, c: float = 1.0, max_iter: int = 100,
                 tol: float = 1e-10) -> tuple[np.ndarray, float]:
    """L2-regularised logistic regression with sklearn's objective (``0.5 |w|^2 + C * sum log-loss``, intercept
    not penalised), solved by Newton's method (the few-unit probes of k-sparse probing: exact and fast). Returns
    (weights ``[k]``, intercept)."""
    x = np.asarray(x, dtype=np.float64)
    t = np.asarray(y, dtype=np.float64)
    z = np.concatenate([x, np.ones((len(x), 1))], axis=1)
    w = np.zeros(z.shape[1])
    reg = np.ones(z.shape[1]) / c
    reg[-1] = 0.0
    for _ in range(max_iter):
        p = 1.0 / (1.0 + np.exp(-np.clip(z @ w, -50, 50)))
        grad = z.T @ (p - t) + reg * w
        hess = (z * (p * (1 - p))[:, None]).T @ z + np.diag(reg) + 1e-12 * np.eye(len(w))
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < tol:
            break
    return w[:-1], float(w[-1])

def balanced(y: np.ndarray, rng: np.random.Generator, max_per_class: int) -> np.ndarray:
    """Row indices of a class-balanced sample: every positive (at most ``max_per_class``) and as many negatives
    drawn without replacement (SAEBench's `prepare_probe_data`)."""
    pos, neg = np.flatnonzero(y), np.flatnonzero(~y)
    n = min(len(pos), len(neg), max_per_class)
    return np.sort(np.concatenate([rng.choice(pos, n, replace=False), rng.choice(neg, n, replace=False)]))


def top_k_mean_diff(a: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """SAEBench's `get_top_k_mean_diff_mask`: the ``k`` units with the largest |mean over positives - mean over
    negatives| (ties broken by index)."""
    diff = np.abs(a[y].mean(0) - a[~y].mean(0))
    return np.argsort(-diff, kind="stable")[:k]


def sparse_probe(a_train: np.ndarray, y_train: np.ndarray, a_test: np.ndarray, y_test: np.ndarray,
                 test_sentence: np.ndarray, ks: Sequence[int], *, seed: int, max_per_class: int = 2000,
                 ) -> list[dict]:
    """k-sparse probing of one binary concept (SAEBench's protocol): balanced train and test samples, the top-k
    units by mean difference on train, an L2 logistic regression (sklearn's objective with C = 1, solved exactly by
    `logistic_fit`) on those k,
    scored by accuracy on the balanced test sample. Returns one dict per k with the chosen units and the
    per-test-sentence hits and counts (for intervals across concepts)."""
    rng = np.random.default_rng([seed, 29])
    tr, te = balanced(y_train, rng, max_per_class), balanced(y_test, rng, max_per_class)
    groups, inv = np.unique(test_sentence[te], return_inverse=True)
    out = []
    for k in ks:
        chosen = top_k_mean_diff(a_train[tr], y_train[tr], k)
        w, b = logistic_fit(a_train[tr][:, chosen], y_train[tr])
        hit = ((a_test[te][:, chosen] @ w + b) > 0) == y_test[te]
        hits = np.bincount(inv, weights=hit.astype(float), minlength=len(groups))
        counts = np.bincount(inv, minlength=len(groups)).astype(float)
        out.append({"k": int(k), "units": chosen.tolist(), "accuracy": float(hit.mean()), "groups": groups,
                    "hits": hits, "counts": counts})
    return out


def mean_accuracy_interval(parts: Sequence[dict], *, n_boot: int, seed: int, ci: float = 0.95) -> tuple[float, float,
                                                                                                       float]:
    """Mean over concepts of the balanced test accuracy, with a bootstrap over test sentences resampled jointly
    for every concept (``parts``: `sparse_probe` dicts, one per concept)."""
    groups = np.unique(np.concatenate([p["groups"] for p in parts]))
    hits, counts = np.zeros((len(groups), len(parts))), np.zeros((len(groups), len(parts)))
    for j, p in enumerate(parts):
        at = np.searchsorted(groups, p["groups"])
        hits[at, j], counts[at, j] = p["hits"], p["counts"]
    value = float(np.mean(hits.sum(0) / counts.sum(0)))
    if n_boot <= 0:
        return value, float("nan"), float("nan")
    w = resample_counts(len(groups), n_boot, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        reps = np.nanmean((w @ hits) / (w @ counts), axis=1)
    low, high = percentile_interval(reps, ci)
    return value, float(low), float(high)


def pca_basis(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean ``[d]`` and principal directions ``[d, d]`` (columns, by decreasing variance) of rows ``x``."""
    mean = x.mean(0)
    xc = (x - mean).astype(np.float64)
    values, vectors = np.linalg.eigh(xc.T @ xc)
    return mean, vectors[:, ::-1].astype(np.float32).copy()


def densities(a: np.ndarray) -> np.ndarray:
    """Share of rows on which each unit is non-zero."""
    return (a > 0).mean(0)


def histogram(values: np.ndarray, bins: int = 12) -> list[int]:
    """Counts of a latent's non-zero values in ``bins`` equal bins from 0 to its maximum."""
    v = values[values > 0]
    if len(v) == 0:
        return [0] * bins
    return np.histogram(v, bins=bins, range=(0.0, float(v.max())))[0].astype(int).tolist()


def as_frame(rows: list[dict]) -> pd.DataFrame:
    """A list of row dicts as a table (empty list -> empty table)."""
    return pd.DataFrame(rows)
