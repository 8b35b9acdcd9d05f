"""The probes of the positions experiment, on plain arrays: one probe's grouped scores, alpha selection on
tuning data, and the position-table probes (Wang & Chen 2020). Every split is grouped (``probes.evaluate``)."""

from __future__ import annotations

import warnings
from functools import partial
from typing import Any

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
    n_jobs: int | None = 1,
    threads: int | None = None,
) -> pd.DataFrame:
    """Probe a position table ``[positions, d]`` itself (Wang & Chen 2020).

    Absolute: ridge regression of the row index from the row (one group per row, alpha by nested CV over
    ``alphas``), with ``exact`` = share of rows whose out-of-fold prediction rounds to the true index.
    Relative: logistic pair probes (is j before i; distance bucket) on ``[p_i; p_j]`` and ``p_i - p_j``,
    grouped so no position is in two folds (``pair_folds`` outer folds, alpha by a 2-fold inner CV over
    ``pair_alphas``). Returns `probes.evaluate` rows tagged with ``target``,
    ``features`` and ``probe`` (the caller adds site, model, ...). The six probes are independent and run on
    ``n_jobs`` worker processes (`experiments.jobs.imap_unordered`; ``threads``: BLAS threads in each).
    """
    from bertscope.experiments.jobs import imap_unordered

    table = np.asarray(table, dtype=np.float64)
    n_pos = table.shape[0]
    y = np.arange(n_pos, dtype=np.float64)
    kw = dict(n_folds=n_folds, n_boot=n_boot, seed=seed, inner_folds=3)
    pairs, pair_groups = table_pairs(n_pos, 2 * pair_folds, n_pairs, seed=seed)
    pair_kw = {**kw, "n_folds": pair_folds, "inner_folds": 2, "alphas": list(pair_alphas)}
    # pair probes on float32 features, like every activation probe (float64 rows doubled their cost; the
    # logistic loss is accumulated in float64 either way)
    table32 = table.astype(np.float32)
    fns = [partial(_evaluate_quiet, table, y, np.arange(n_pos), task="regression", alphas=list(alphas),
                   metrics=list(REGRESSION_METRICS), **kw),
           partial(table_exact, table, alphas=alphas, n_folds=n_folds, n_boot=n_boot, seed=seed)]  # fmt: skip
    names = []
    for features in ("concat", "diff"):
        for target, labels in (("order", pairs.before), ("distance_bucket", pairs.bucket)):
            fns.append(partial(_evaluate_quiet, partial(pair_features, table32[None], pairs, features), labels,
                               pair_groups, metrics=["accuracy", "macro_f1"], **pair_kw))  # fmt: skip
            names.append((target, features))
    cost = [1.0, 1.0] + [10.0 * (2 if f == "concat" else 1) for _, f in names]
    out = dict(imap_unordered(fns, workers=n_jobs, threads=threads, cost=cost))
    absolute, exact = out[0], out[1]
    parts = [
        absolute.assign(target="abs_reg", features="table", probe="ridge", chosen="nested"),
        pd.DataFrame([{**absolute.iloc[0].to_dict(), "labels": "task", "metric": "exact", "value": exact["value"],
                       "ci_low": exact["ci_low"], "ci_high": exact["ci_high"], "alpha": exact["alpha"],
                       "chosen": "nested", "ci_covers": "groups", "baseline_majority": np.nan,
                       "baseline_chance": np.nan, "target": "abs_reg", "features": "table",
                       "probe": "ridge"}]),  # fmt: skip
    ]
    for k, (target, features) in enumerate(names):
        parts.append(out[2 + k].assign(target=target, features=features, probe="logistic", chosen="nested"))
    return pd.concat(parts, ignore_index=True)


def _evaluate_quiet(X: Any, y: np.ndarray, groups: np.ndarray, **kwargs: Any) -> pd.DataFrame:
    """`probes.evaluate` on X (or on ``X()`` when X is a callable making the features), warnings silenced."""
    from bertscope.probes import evaluate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return evaluate(X() if callable(X) else X, y, groups, **kwargs)


def table_exact(
    table: np.ndarray, *, alphas: tuple[float, ...] = TABLE_ALPHAS, n_folds: int = 5, n_boot: int = 500,
    seed: int = 0, inner_folds: int = 3,
) -> dict[str, float]:
    """``exact``: share of the rows of ``table [positions, d]`` whose out-of-fold ridge prediction of the row
    index rounds to the index, with alpha chosen per outer fold by an inner CV on that fold's training rows
    only (nested: no row is scored by an alpha it helped choose), and a percentile bootstrap over rows.
    Returns ``{"value", "ci_low", "ci_high", "alpha"}`` (alpha: the median per-fold choice)."""
    from bertscope.probes import group_bootstrap, grouped_cross_val_predict

    table = np.asarray(table, dtype=np.float64)
    n_pos = table.shape[0]
    y = np.arange(n_pos, dtype=np.float64)
    cv = grouped_cross_val_predict(table, y, np.arange(n_pos), task="regression", n_folds=n_folds,
                                   alphas=list(alphas), seed=seed, inner_folds=inner_folds)  # fmt: skip
    hit = (np.rint(cv.y_pred) == y).astype(np.float64)
    out = group_bootstrap(lambda c: (c @ hit) / c.sum(1), n_pos, n_boot=n_boot, level=0.95, seed=seed)
    return {"value": float(out.value), "ci_low": float(out.low), "ci_high": float(out.high),
            "alpha": float(np.median(cv.alpha_by_fold))}


def memorisation_ceiling(
    types: np.ndarray, y: np.ndarray, groups: np.ndarray, *, n_folds: int, seed: int = 0, repeats: int = 1,
) -> dict[str, float]:
    """The accuracy a probe that memorises type -> control label would reach on the control task: the share
    of test tokens whose type (word piece) occurs in the training folds, computed per fold from the same
    grouped, stratified splits `probes.evaluate` makes (seeds seed .. seed + repeats - 1).

    types, y (the task labels the folds are stratified by), groups: ``[n]``. Returns ``{"value"`` (pooled
    share over all test tokens, averaged over repeats), ``"low"``, ``"high"`` (the range of the per-fold
    shares)}``."""
    from bertscope.probes import check_groups, fold_rng, grouped_folds, strata_of

    types, y = np.asarray(types), np.asarray(y)
    group_idx, n_groups = check_groups(groups, len(y))
    pooled, per_fold = [], []
    for r in range(repeats):
        fold = grouped_folds(group_idx, n_groups, n_folds, fold_rng(seed, r), strata_of(y, "classification"))
        seen_all = np.zeros(len(y), dtype=bool)
        for f in range(n_folds):
            test = fold == f
            seen = np.isin(types[test], np.unique(types[~test]))
            seen_all[test] = seen
            per_fold.append(float(seen.mean()))
        pooled.append(float(seen_all.mean()))
    return {"value": float(np.mean(pooled)), "low": float(min(per_fold)), "high": float(max(per_fold))}


def memorisation_ceiling_split(
    types_train: np.ndarray, types: np.ndarray, groups: np.ndarray, *, n_boot: int, seed: int = 0,
) -> dict[str, float]:
    """`memorisation_ceiling` for a probe fit on one corpus and scored on another (``--eval-corpus``): the
    share of the scored tokens (``types``, ``groups``: ``[n]``) whose type occurs among the training tokens
    ``types_train`` ``[m]``, with a percentile interval over bootstrap resamples of the scored groups
    (`probes.ratio_of_sums`). Returns ``{"value", "low", "high"}``."""
    from bertscope.probes import check_groups, ratio_of_sums

    seen = np.isin(np.asarray(types), np.unique(np.asarray(types_train))).astype(np.float64)
    group_idx, n_groups = check_groups(groups, len(seen))
    hits = np.bincount(group_idx, weights=seen, minlength=n_groups)
    sizes = np.bincount(group_idx, minlength=n_groups).astype(np.float64)
    out = ratio_of_sums(hits, sizes, n_boot=n_boot, seed=seed)
    return {"value": float(out.value), "low": float(out.low), "high": float(out.high)}


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
    repeats: int = 1,
    backend: str = "sklearn",
) -> pd.DataFrame:
    """Grouped cross-validated scores of one linear probe (`probes.evaluate` at a fixed ``alpha``, fit by
    ``backend``).

    X ``[n, d]``; y, groups (window/sentence id of each row), control (Hewitt-Liang labels) ``[n]``.
    ``alpha``: a number, or a list (nested CV per outer fold); ``control`` may be a function seed -> labels
    (redrawn per repeat); ``repeats``: CV runs with seeds seed .. seed + repeats - 1, pooled (evaluate).
    Returns evaluate's rows with ``probe`` ("logistic" | "ridge") and ``control``: ``control_name`` for the
    task rows, ``"control_task"`` and ``"selectivity"`` (task - control) when ``control`` is given.
    """
    from bertscope.probes import evaluate

    metrics, within = _metric_args(task, metrics)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a rare non-converged fit should not flood the log
        res = evaluate(X, y, groups, task=task, n_folds=n_folds, alphas=alpha, n_boot=n_boot, seed=seed,
                       control=control, metrics=metrics, within_k=within, repeats=repeats,
                       backend=backend)  # fmt: skip
    return _tagged(res, task, control_name)


def probe_split_scores(
    X_train: np.ndarray,
    y_train: np.ndarray,
    groups_train: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray,
    *,
    task: str,
    alpha: Any,
    n_boot: int = 500,
    seed: int = 0,
    control: tuple[np.ndarray, np.ndarray] | None = None,
    control_name: str = "none",
    metrics: tuple[str, ...] | None = None,
    backend: str = "sklearn",
) -> pd.DataFrame:
    """`probe_scores` for a probe fit on one corpus's rows and scored on another's (`probes.evaluate_split`):
    fit on all of X_train ``[m, d]`` / y_train ``[m]`` at ``alpha`` (a number, or a list chosen by an inner
    grouped CV on the training rows, ``groups_train``), scored on every row of X ``[n, d]`` / y ``[n]`` with
    a bootstrap over ``groups`` (the scored windows/sentences). ``control``: (training, scored) Hewitt-Liang
    labels. X_train and X may be callables making the features. Same rows and columns as `probe_scores`
    (``n_folds`` 0: no folds)."""
    from bertscope.probes import evaluate_split

    metrics, within = _metric_args(task, metrics)
    c_train, c_test = control if control is not None else (None, None)
    X_train, X = (a() if callable(a) else a for a in (X_train, X))  # pair features are made in the worker
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = evaluate_split(X_train, y_train, X, y, groups, groups_train=groups_train, task=task, alphas=alpha,
                             n_boot=n_boot, seed=seed, control_train=c_train, control_test=c_test,
                             metrics=metrics, within_k=within, backend=backend)  # fmt: skip
    return _tagged(res, task, control_name)


def _metric_args(task: str, metrics: tuple[str, ...] | None) -> tuple[list[str], int | None]:
    """The metric names (the task's defaults when None) and ``within_k`` (1 when accuracy within one class is
    asked of a classifier) that `probe_scores` and `probe_split_scores` hand to the probes."""
    if metrics is None:
        metrics = CLASS_METRICS if task == "classification" else REGRESSION_METRICS
    return list(metrics), 1 if task == "classification" and "accuracy_within_1" in metrics else None


def _tagged(res: pd.DataFrame, task: str, control_name: str) -> pd.DataFrame:
    """Evaluate's rows with ``probe`` ("logistic" | "ridge") and ``control`` (``control_name`` for the task rows,
    ``"control_task"``, ``"selectivity"``) in place of its ``labels`` column."""
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
    ``(alpha, {str(alpha): mean score})``. `alpha_scores` per feature set, then `choose_alpha` (the run
    computes the feature sets' scores in parallel).
    """
    return choose_alpha([alpha_scores(X, y, groups, task=task, alphas=alphas, n_folds=n_folds, seed=seed)
                         for X in feats], alphas)  # fmt: skip


def alpha_scores(
    X: Any, y: np.ndarray, groups: np.ndarray, task: str, alphas: tuple[float, ...], *, n_folds: int = 3,
    seed: int = 0, backend: str = "sklearn",
) -> np.ndarray:
    """Grouped-CV score ``[A]`` of each alpha on one feature set X ``[n, d]`` (or a callable making it):
    out-of-fold accuracy, or R^2 for regression, from one warm-started alpha path per fold
    (`capacity.oof_path`)."""
    from bertscope.experiments.positions.capacity import oof_path

    X = X() if callable(X) else X
    pred = oof_path(X, {"y": y}, groups, task=task, alphas=alphas, n_folds=n_folds, seed=seed,
                    backend=backend)["pred"]["y"]
    if task == "classification":
        return (pred == np.asarray(y)[None]).mean(1)
    resid = ((pred - np.asarray(y, dtype=float)[None]) ** 2).sum(1)
    return 1 - resid / ((y - np.mean(y)) ** 2).sum()


def choose_alpha(scores: list[np.ndarray], alphas: tuple[float, ...]) -> tuple[float, dict[str, float]]:
    """`select_alpha`'s choice from per-feature-set scores ``[A]`` (`alpha_scores`): the best mean, ties to
    the stronger L2. Returns ``(alpha, {str(alpha): mean score})``."""
    total = np.zeros(len(alphas))
    for part in scores:  # summed in the order given, as the serial loop did
        total += part
    total /= len(scores)
    best = total.max()
    chosen = max(a for a, v in zip(alphas, total, strict=True) if v == best)
    return float(chosen), {f"{a:g}": float(v) for a, v in zip(alphas, total, strict=True)}


def mdl_rows(
    X: np.ndarray, y: np.ndarray, groups: np.ndarray, control: np.ndarray, *, n_blocks: int, seed: int = 0,
    backend: str = "sklearn",
) -> pd.DataFrame:
    """Online codelength (Voita & Titov 2020) of ``y`` and of its ``control`` labels from X ``[n, d]``
    (`probes.mdl_probe`, which chooses alpha per block from the already-transmitted prefix only: a valid
    online code), the probes fit by ``backend``. One row per (control in {"none", "control_task"}, metric);
    ``alpha`` is the last block's choice."""
    from bertscope.probes import mdl_probe

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence of the small early blocks is not the point
        res = mdl_probe(X, y, groups, seed=seed, control=control, n_blocks=n_blocks, backend=backend)
    rows = []
    for control_name, d in (("none", res), ("control_task", res["control"])):
        for metric in ("compression", "online_codelength", "uniform_codelength", "prior_codelength"):
            rows.append({"probe": "mdl", "control": control_name, "metric": metric, "value": float(d[metric]),
                         "n_test": int(d["n"]), "n_groups": len(np.unique(groups)), "alpha": float(d["alpha"]),
                         "chosen": "per_block_prefix", "ci_covers": "none"})  # fmt: skip
    return pd.DataFrame(rows)


def grouped_oof_predict(
    X: np.ndarray, y: np.ndarray, groups: np.ndarray, *, task: str, alpha: float, n_folds: int, seed: int = 0,
    backend: str = "sklearn",
) -> np.ndarray:
    """Out-of-fold predictions ``[n]`` at a fixed alpha: `probes.grouped_cross_val_predict` (grouped folds,
    stratified by label as `probes.evaluate` makes them)."""
    from bertscope.probes import grouped_cross_val_predict

    return grouped_cross_val_predict(X, y, groups, task=task, n_folds=n_folds, alphas=alpha, seed=seed,
                                     backend=backend).y_pred  # fmt: skip


def split_predict(
    X_train: np.ndarray, y_train: np.ndarray, X: np.ndarray, *, task: str, alpha: float, seed: int = 0,
    backend: str = "sklearn",
) -> np.ndarray:
    """`grouped_oof_predict` for ``--eval-corpus``: predictions ``[n]`` for every row of X ``[n, d]`` of the
    probe fit at ``alpha`` on all of X_train ``[m, d]`` / y_train ``[m]`` (the fit `probes.evaluate_split`
    makes)."""
    from bertscope.probes import LinearProbe

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        probe = LinearProbe(task=task, seed=seed, backend=backend, warm_start=True).set_params(alpha=alpha)
        return probe.fit(X_train, y_train).predict(X)
