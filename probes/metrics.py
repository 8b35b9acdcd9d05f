"""Probe metrics, their group-bootstrap distributions, and the baselines reported beside them.

A bootstrap replicate resamples whole groups (sentences/documents) with replacement; it is represented by a
count matrix `counts [n_boot, n_groups]` (how often each group was drawn; `probes.bootstrap` draws them).
Every metric is computed from per-group sufficient statistics, so one replicate costs a matrix product, not
a pass over the rows; the point estimate is the same computation with all counts equal to one. Using the same
count matrix for the task and the control gives the paired bootstrap of their difference (selectivity).

Metrics (names as they appear in tables):
- `accuracy`; `accuracy_within_<k>`: |prediction - truth| <= k (ordinal / numeric labels);
- `macro_f1`: unweighted mean over the classes present in truth or prediction of 2TP / (2TP + FP + FN)
  (scikit-learn's `f1_score(average="macro")`);
- `mae`: mean |prediction - truth|; `r2`: 1 - SSE / SST (scikit-learn's `r2_score`);
- `spearman`: Pearson correlation of mid-ranks (scipy's `spearmanr`); ranks of a resample are the mid-ranks
  of the resampled rows (ties and duplicates share ranks). NaN when either side is constant.

Chance baselines (`chance_baseline`) are the expected score of a predictor that draws each prediction
independently from the empirical distribution of the true labels: accuracy sum_k p_k^2; within-k
P(|Y - Y'| <= k); macro-F1 1/K (each class's F1 is p_k to first order); MAE E|Y - Y'|; R^2 -1; Spearman 0.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import sparse

ORDINAL_METRICS = ("mae", "spearman")


def metric_names(task: str, within_k: tuple[int, ...] = (), ordinal: bool = False) -> list[str]:
    """Metrics reported for a task. Classification adds ordinal metrics when `ordinal` (numeric labels)."""
    within = [f"accuracy_within_{k}" for k in within_k]
    if task == "regression":
        return ["r2", "mae", "spearman", *within]
    names = ["accuracy", "macro_f1"]
    if ordinal:
        names += [*within, "mae", "spearman"]
    return names


class GroupScorer:
    """Metrics of fixed predictions under group resampling.

    y_true, y_pred: [n] labels or values; group_idx: [n] ints in 0..n_groups-1.
    Calling it with counts [m, n_groups] returns {metric: [m]}.
    """

    def __init__(
        self,
        y_true: np.ndarray,
        y_pred: np.ndarray,
        group_idx: np.ndarray,
        n_groups: int,
        metrics: list[str],
    ) -> None:
        self.metrics = list(metrics)
        self.n_groups = n_groups
        g = group_idx

        def per_group(weights: np.ndarray | None = None) -> np.ndarray:
            return np.bincount(g, weights=weights, minlength=n_groups).astype(np.float64)

        self._rows = per_group()
        self._stats: dict[str, Callable[[np.ndarray], np.ndarray]] = {}
        for name in self.metrics:
            if name == "accuracy":
                self._stats[name] = self._ratio(per_group((y_true == y_pred).astype(np.float64)))
            elif name.startswith("accuracy_within_"):
                k = float(name.rsplit("_", 1)[1])
                hit = np.abs(y_pred.astype(np.float64) - y_true.astype(np.float64)) <= k
                self._stats[name] = self._ratio(per_group(hit.astype(np.float64)))
            elif name == "mae":
                err = np.abs(y_pred.astype(np.float64) - y_true.astype(np.float64))
                self._stats[name] = self._ratio(per_group(err))
            elif name == "r2":
                self._stats[name] = self._r2(y_true.astype(np.float64), y_pred.astype(np.float64), per_group)
            elif name == "macro_f1":
                self._stats[name] = self._macro_f1(y_true, y_pred, g, n_groups)
            elif name == "spearman":
                self._stats[name] = _SpearmanCells(y_true, y_pred, g)
            else:
                raise ValueError(f"unknown metric {name!r}")

    def __call__(self, counts: np.ndarray) -> dict[str, np.ndarray]:
        counts = np.asarray(counts, dtype=np.float64)
        return {name: self._stats[name](counts) for name in self.metrics}

    def point(self) -> dict[str, float]:
        """Metrics on the data as observed (every group once)."""
        return {k: float(v[0]) for k, v in self(np.ones((1, self.n_groups))).items()}

    def _ratio(self, numer_g: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        rows = self._rows
        return lambda c: (c @ numer_g) / (c @ rows)

    def _r2(self, y: np.ndarray, p: np.ndarray, per_group: Callable) -> Callable[[np.ndarray], np.ndarray]:
        shift = y.mean()  # centring keeps SST = Syy - Sy^2 / N well conditioned
        yc = y - shift
        sse, sy, syy, rows = per_group((y - p) ** 2), per_group(yc), per_group(yc**2), self._rows

        def r2(c: np.ndarray) -> np.ndarray:
            n = c @ rows
            sst = c @ syy - (c @ sy) ** 2 / n
            with np.errstate(divide="ignore", invalid="ignore"):
                return np.where(sst > 0, 1.0 - (c @ sse) / sst, np.nan)

        return r2

    @staticmethod
    def _macro_f1(y: np.ndarray, p: np.ndarray, g: np.ndarray, n_groups: int) -> Callable:
        classes, codes = np.unique(np.concatenate([y, p]), return_inverse=True)
        k = len(classes)
        t_code, p_code = codes[: len(y)], codes[len(y) :]
        size = n_groups * k
        true_gk = np.bincount(g * k + t_code, minlength=size).reshape(n_groups, k).astype(np.float64)
        pred_gk = np.bincount(g * k + p_code, minlength=size).reshape(n_groups, k).astype(np.float64)
        tp_gk = np.bincount(g * k + t_code, weights=(t_code == p_code).astype(np.float64), minlength=size)
        tp_gk = tp_gk.reshape(n_groups, k)
        support_gk = true_gk + pred_gk  # 2TP + FP + FN per group and class

        def macro_f1(c: np.ndarray) -> np.ndarray:
            tp, support = c @ tp_gk, c @ support_gk
            present = support > 0
            f1 = np.where(present, 2 * tp / np.where(present, support, 1.0), 0.0)
            return f1.sum(1) / present.sum(1)

        return macro_f1


def chance_baseline(name: str, y_true: np.ndarray) -> float:
    """Expected score of predictions drawn independently from the empirical distribution of y_true [n]."""
    if name == "r2":
        return -1.0  # E(Y - Y')^2 = 2 Var(Y)
    if name == "spearman":
        return 0.0
    if name == "accuracy":
        _, counts = np.unique(y_true, return_counts=True)
        p = counts / counts.sum()
        return float(np.sum(p**2))
    if name == "macro_f1":
        return 1.0 / len(np.unique(y_true))
    s = np.sort(y_true.astype(np.float64))
    n = len(s)
    if name == "mae":
        coef = 2 * np.arange(n) - n + 1
        return float(2 * np.sum(coef * s) / n**2)
    if name.startswith("accuracy_within_"):
        k = float(name.rsplit("_", 1)[1])
        inside = np.searchsorted(s, s + k, side="right") - np.searchsorted(s, s - k, side="left")
        return float(inside.sum() / n**2)
    raise ValueError(f"unknown metric {name!r}")


class _SpearmanCells:
    """Spearman correlation under group resampling, from sparse per-group tables.

    With value codes a (truth) and b (prediction), a replicate's weighted mid-ranks depend only on the
    resampled count of each value, and the rank cross-product only on the resampled count of each distinct
    (a, b) pair; both are `counts @ table` with sparse tables [n_groups, values] and [n_groups, pairs].
    """

    def __init__(self, y: np.ndarray, p: np.ndarray, g: np.ndarray) -> None:
        _, a = np.unique(y, return_inverse=True)
        _, b = np.unique(p, return_inverse=True)
        a, b = a.reshape(-1), b.reshape(-1)
        pairs, pair = np.unique(np.stack([a, b], axis=1), axis=0, return_inverse=True)
        self.pair_a, self.pair_b = pairs[:, 0], pairs[:, 1]
        n_groups = int(g.max()) + 1
        ones = np.ones(len(g))

        def table(code: np.ndarray, width: int) -> sparse.csr_matrix:
            # transposed [width, n_groups] so that table @ counts.T is a sparse-dense product
            return sparse.csr_matrix((ones, (code.reshape(-1), g)), shape=(width, n_groups))

        self.table_a = table(a, int(a.max()) + 1)
        self.table_b = table(b, int(b.max()) + 1)
        self.table_ab = table(pair, len(pairs))
        self.width = max(self.table_ab.shape[0], self.table_a.shape[0], self.table_b.shape[0])

    def __call__(self, counts: np.ndarray) -> np.ndarray:
        step = max(1, 2_000_000 // self.width)
        return np.concatenate([self._chunk(counts[s : s + step]) for s in range(0, len(counts), step)])

    def _chunk(self, counts: np.ndarray) -> np.ndarray:
        ct = counts.T
        wa, wb = (self.table_a @ ct).T, (self.table_b @ ct).T  # [m, values]
        wab = (self.table_ab @ ct).T  # [m, pairs]
        total = wa.sum(1)
        ra, rb = _midranks(wa), _midranks(wb)
        mean_a, mean_b = (wa * ra).sum(1) / total, (wb * rb).sum(1) / total
        var_a = (wa * ra * ra).sum(1) / total - mean_a**2
        var_b = (wb * rb * rb).sum(1) / total - mean_b**2
        cross = (wab * ra[:, self.pair_a] * rb[:, self.pair_b]).sum(1) / total - mean_a * mean_b
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where((var_a > 0) & (var_b > 0), cross / np.sqrt(var_a * var_b), np.nan)


def _midranks(per_value: np.ndarray) -> np.ndarray:
    """Mid-ranks [m, values] of sorted distinct values given their resampled row counts [m, values]."""
    return np.cumsum(per_value, axis=1) - (per_value - 1) / 2
