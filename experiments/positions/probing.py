"""The probes of the positions experiment, on plain arrays: one probe's grouped scores, alpha selection on
tuning data, and the position-table probes (Wang & Chen 2020). Every split is grouped (``probes.evaluate``)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from bertscope.experiments.positions.measures import pair_features, table_pairs

CLASS_METRICS = ("accuracy", "macro_f1", "accuracy_within_1", "mae")
REGRESSION_METRICS = ("r2", "mae")
TABLE_ALPHAS = (3e-9, 3e-7, 3e-5, 3e-3, 0.3)  # mean-loss L2 (the old summed-loss grid / ~341 training rows)


def position_table_views(table: np.ndarray, n_components: int = 4) -> tuple[pd.DataFrame, pd.DataFrame]:
    """PCA of a position table ``[positions, d]`` (component scores against position, with explained
    variance) and its cosine-similarity matrix, as long tables."""
    table = np.asarray(table, dtype=np.float64)
    centered = table - table.mean(0)
    _, s, vt = np.linalg.svd(centered, full_matrices=False)
    k = min(n_components, len(s))
    scores = centered @ vt[:k].T
    explained = s**2 / (s**2).sum()
    n_pos = table.shape[0]
    pca = pd.DataFrame({
        "position": np.tile(np.arange(n_pos), k),
        "component": np.repeat(np.arange(1, k + 1), n_pos),
        "score": scores.T.reshape(-1),
        "explained_variance": np.repeat(explained[:k], n_pos),
    })  # fmt: skip
    unit = table / np.maximum(np.linalg.norm(table, axis=1, keepdims=True), 1e-12)
    cos = unit @ unit.T
    i, j = np.meshgrid(np.arange(n_pos), np.arange(n_pos), indexing="ij")
    cosine = pd.DataFrame({"i": i.reshape(-1), "j": j.reshape(-1), "cosine": cos.reshape(-1).astype(np.float32)})
    return pca, cosine


def table_probes(
    table: np.ndarray,
    *,
    n_folds: int = 5,
    n_boot: int = 500,
    n_pairs: int = 3000,
    alphas: tuple[float, ...] = TABLE_ALPHAS,
    pair_alphas: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 0.1),
    pair_folds: int = 3,
    seed: int = 0,
) -> pd.DataFrame:
    """Probe a position table ``[positions, d]`` itself (Wang & Chen 2020).

    Absolute: ridge regression of the row index from the row (one group per row, alpha by nested CV over
    ``alphas``), with ``exact`` = share of rows whose out-of-fold prediction rounds to the true index.
    Relative: logistic pair probes (is j before i; distance bucket) on ``[p_i; p_j]`` and ``p_i - p_j``,
    grouped so no position is in two folds (``pair_folds`` outer folds, alpha by a 2-fold inner CV over
    ``pair_alphas``). Returns `probes.evaluate` rows tagged with ``target``,
    ``features`` and ``probe`` (the caller adds site, model, ...).
    """
    from bertscope.probes import evaluate

    table = np.asarray(table, dtype=np.float64)
    n_pos = table.shape[0]
    y = np.arange(n_pos, dtype=np.float64)
    groups = np.arange(n_pos)
    kw = dict(n_folds=n_folds, n_boot=n_boot, seed=seed, inner_folds=3)
    absolute = evaluate(table, y, groups, task="regression", alphas=list(alphas),
                        metrics=list(REGRESSION_METRICS), **kw)  # fmt: skip
    alpha = float(absolute["alpha"].iloc[0])
    pred = grouped_oof_predict(table, y, groups, task="regression", alpha=alpha, n_folds=n_folds, seed=seed)
    exact = float(np.mean(np.rint(pred) == y))
    parts = [
        absolute.assign(target="abs_reg", features="table", probe="ridge"),
        pd.DataFrame([{**absolute.iloc[0].to_dict(), "labels": "task", "metric": "exact", "value": exact,
                       "ci_low": np.nan, "ci_high": np.nan, "baseline_majority": np.nan,
                       "baseline_chance": np.nan, "target": "abs_reg", "features": "table",
                       "probe": "ridge"}]),  # fmt: skip
    ]
    pairs, pair_groups = table_pairs(n_pos, 2 * pair_folds, n_pairs, seed=seed)
    grid = table[None]
    kw.update(n_folds=pair_folds, inner_folds=2)
    for features in ("concat", "diff"):
        X = pair_features(grid, pairs, features)
        for target, labels in (("order", pairs.before), ("distance_bucket", pairs.bucket)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = evaluate(X, labels, pair_groups, alphas=list(pair_alphas), metrics=["accuracy", "macro_f1"],
                               **kw)  # fmt: skip
            parts.append(res.assign(target=target, features=features, probe="logistic"))
    return pd.concat(parts, ignore_index=True)


def probe_scores(
    X: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray,
    *,
    task: str,
    alpha: float,
    n_folds: int = 3,
    n_boot: int = 500,
    seed: int = 0,
    control: np.ndarray | None = None,
    control_name: str = "none",
    metrics: tuple[str, ...] | None = None,
) -> pd.DataFrame:
    """Grouped cross-validated scores of one linear probe (`probes.evaluate` at a fixed ``alpha``).

    X ``[n, d]``; y, groups (window/sentence id of each row), control (Hewitt-Liang labels) ``[n]``.
    Returns evaluate's rows with ``probe`` ("logistic" | "ridge") and ``control``: ``control_name`` for the
    task rows, ``"control_task"`` and ``"selectivity"`` (task - control) when ``control`` is given.
    """
    from bertscope.probes import evaluate

    if metrics is None:
        metrics = CLASS_METRICS if task == "classification" else REGRESSION_METRICS
    within = 1 if task == "classification" and "accuracy_within_1" in metrics else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a rare non-converged fit should not flood the log
        res = evaluate(X, y, groups, task=task, n_folds=n_folds, alphas=alpha, n_boot=n_boot, seed=seed,
                       control=control, metrics=list(metrics), within_k=within)  # fmt: skip
    res["probe"] = "logistic" if task == "classification" else "ridge"
    res["control"] = res["labels"].map({"task": control_name, "control": "control_task",
                                        "selectivity": "selectivity"})  # fmt: skip
    return res.drop(columns=["labels"])


def select_alpha(
    feats: list[np.ndarray],
    y: np.ndarray,
    groups: np.ndarray,
    *,
    task: str,
    alphas: tuple[float, ...],
    n_folds: int = 3,
    seed: int = 0,
) -> tuple[float, dict[str, float]]:
    """The alpha with the best grouped-CV score (accuracy, or R^2 for regression) averaged over several
    feature sets ``feats`` (each ``[n, d]``, same rows ``y``/``groups``); ties go to the stronger L2.

    Meant for held-out tuning data, so the chosen alpha never saw the rows it is later scored on. Returns
    ``(alpha, {str(alpha): mean score})``.
    """
    from bertscope.probes import evaluate

    metric = "accuracy" if task == "classification" else "r2"
    scores = {}
    for alpha in sorted(alphas, reverse=True):
        values = []
        for X in feats:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = evaluate(X, y, groups, task=task, n_folds=n_folds, alphas=alpha, n_boot=0, seed=seed,
                               metrics=[metric])  # fmt: skip
            values.append(float(res["value"].iloc[0]))
        scores[f"{alpha:g}"] = float(np.mean(values))
    best = max(scores.values())
    chosen = next(a for a in sorted(alphas, reverse=True) if scores[f"{a:g}"] == best)
    return float(chosen), scores


def grouped_oof_predict(
    X: np.ndarray, y: np.ndarray, groups: np.ndarray, *, task: str, alpha: float, n_folds: int, seed: int = 0
) -> np.ndarray:
    """Out-of-fold predictions ``[n]`` at a fixed alpha: `probes.grouped_cross_val_predict` (grouped folds,
    stratified by label as `probes.evaluate` makes them)."""
    from bertscope.probes import grouped_cross_val_predict

    return grouped_cross_val_predict(X, y, groups, task=task, n_folds=n_folds, alphas=alpha, seed=seed).y_pred
