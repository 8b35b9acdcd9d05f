"""Grouped cross-validated probe evaluation with bootstrap intervals and baselines.

`evaluate` splits rows into K folds by group (sentence/document; never by token), picks the L2 strength in
each outer training split by an inner grouped CV, predicts every row out of fold, and scores the pooled
out-of-fold predictions. Intervals are percentile intervals over bootstrap resamples of whole groups of the
test predictions. The fitted probes are held fixed, so the interval is about which sentences were evaluated,
not about training on other data: out-of-fold predictions of different folds are dependent and K-fold CV has
no unbiased variance estimator (Bengio & Grandvalet 2004). In our simulations with unlearnable labels, 95%
intervals contained chance in 88-95% of datasets (fewer with few groups and strongly fitting probes).
Beside every score: the majority baseline (the intercept-only probe of each training split: its majority
class, or its mean target) and the chance baseline (`metrics.chance_baseline`).

With `control` labels (Hewitt & Liang control task, see `controls.control_labels`) the same probe (same folds,
and in each fold the alpha chosen for the task) is fit to the control labels, and selectivity rows give
task - control for every metric, with an interval from the same group resamples (a paired bootstrap).

Repeated cross-validation (`repeats=R`): the whole procedure runs R times with seeds seed, seed+1, ...,
seed+R-1, which redraw the fold split, the inner alpha-selection folds, the bootstrap resamples, and (when
`control` is a function of the seed) the control labels. The headline `value` is the mean of the R repeats'
scores; the interval is the percentile interval of all R x n_boot replicates pooled (each repeat's own group
resamples around its own score), so its width includes the spread between repeats as well as the sentence
variance. The `ci_covers` column says which variance an interval covers: "groups" (one split, fitted probes
held fixed: sentence resampling only) or "groups+repeats" (also fold splits, alpha choices and control draws,
with the probes refit in every repeat); `value_sd_repeats` is the standard deviation of the repeats' scores.

Alpha (see `LinearProbe`) is the L2 strength on the MEAN loss, so an alpha chosen by the inner CV on
(inner_folds - 1) / inner_folds of a training split means the same when the probe is refit on all of it.

Cost: one fit per outer fold per label set per repeat when `alphas` is a single value; with a grid, add
inner_folds x len(alphas) fits per outer fold (`LinearProbe.fit_path`: warm-started along the grid from strong
to weak L2, within one training split only: a warm start never crosses splits, where it would leak).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy import sparse

from ._checks import (
    as_numeric_labels,
    check_backend,
    check_classes,
    check_features,
    check_groups,
    check_target,
    infer_task,
    thread_limit,
)
from .bootstrap import iter_resample_counts, percentile_interval
from .estimator import LinearProbe, _to_tensor
from .metrics import GroupScorer, chance_baseline, metric_names

# L2 strengths on the mean loss (`LinearProbe`): from barely regularised to shrunk to the majority class. The
# old sum-loss grid (0.01 ... 10000) on training splits of ~1,000 rows is this grid.
DEFAULT_ALPHAS = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)

COLUMNS = [
    "labels", "metric", "value", "ci_low", "ci_high", "baseline_majority", "baseline_chance",
    "n_train", "n_test", "n_groups", "alpha", "alpha_by_fold", "converged", "n_folds", "n_boot", "ci_level",
    "task", "backend", "repeats", "value_sd_repeats", "ci_covers",
]  # fmt: skip


@dataclass
class CrossValPredictions:
    """Out-of-fold predictions of `grouped_cross_val_predict` (all arrays [n], in the row order given)."""

    y_pred: np.ndarray
    majority_pred: np.ndarray  # intercept-only probe of each training split
    fold: np.ndarray  # outer fold of each row
    group_idx: np.ndarray  # group of each row as 0..n_groups-1
    n_groups: int
    alpha_by_fold: list[float]
    n_train_by_fold: list[int]
    control_pred: np.ndarray | None = None
    control_majority_pred: np.ndarray | None = None
    converged: list[bool] = field(default_factory=list)  # task fit of each fold reached `tol`
    control_converged: list[bool] = field(default_factory=list)


def evaluate(
    X: Any,
    y: Any,
    groups: Any = None,
    *,
    task: str | None = None,
    n_folds: int = 5,
    cv: Any = None,
    alphas: float | Sequence[float] | None = None,
    backend: str = "sklearn",
    device: str | torch.device | None = None,
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
    within_k: int | Sequence[int] | None = None,
    control: Any = None,
    ordinal: bool | None = None,
    metrics: Sequence[str] | None = None,
    inner_folds: int = 3,
    standardize: bool = True,
    max_iter: int = 1000,
    tol: float = 1e-4,
    n_threads: int | None = None,
    repeats: int = 1,
) -> pd.DataFrame:
    """Grouped K-fold probe scores with group-bootstrap intervals and baselines, as a long table.

    X: [n, d] features (numpy, or a torch tensor for backend="torch"); y: [n] labels or targets;
    task: "classification", "regression", or None = from y (`_checks.infer_task`: floats -> regression,
        integers/strings with few values -> classification); classification on continuous y is refused.
    groups: [n] sentence/document id of each row (use `np.arange(n)` only to demonstrate token-level leakage);
        None = every row its own group, with a warning (rows of one sentence share information, so folds and
        intervals that treat them as independent are optimistic).
    cv: a scikit-learn splitter (``KFold``, ``GroupKFold``, ``StratifiedGroupKFold`` ...) for the outer folds
        instead of `n_folds` grouped, label-stratified folds; called as ``cv.split(X, y, groups)`` and must put
        every row in exactly one test fold. Its own ``random_state`` decides the split (repeats do not redraw
        it); a split that cuts a group across folds is warned about. The inner alpha CV stays grouped.
    alphas: None = inner grouped CV over `DEFAULT_ALPHAS`; a number or one-element list = that alpha, no
        inner CV (the fast path for many calls); a list = inner CV over it. See `LinearProbe` for the scale.
    within_k: int or ints; adds `accuracy_within_<k>` (|prediction - truth| <= k). For classification it also
        marks labels as ordinal (numeric), which adds `mae` and `spearman` (or pass `ordinal=True`).
    control: [n] control labels (e.g. `control_labels(word_types, y)`), or a function seed -> [n] labels (e.g.
        `lambda s: control_labels(word_types, y, seed=s)`) so that repeats redraw them; adds control and
        selectivity rows.
    repeats: run the cross-validation this many times (seeds seed .. seed + repeats - 1) and pool them
        (module docstring): `value` is the mean over repeats and the interval includes the repeat variance.
    metrics: subset of the default metric names to compute (e.g. to skip a slow `spearman` on huge data).
    n_boot: bootstrap resamples of groups (0 = no interval); ci: interval level.
    n_threads: cap torch / BLAS / OpenMP threads for the call (None = leave them; 1 is several times faster
        on a CPU shared with other busy processes, see `LinearProbe`).

    Returns one row per (labels, metric): labels in {"task", "control", "selectivity"}; columns `COLUMNS`.
    `n_train` is the mean training-split size, `n_test` the number of rows scored (all of them, out of fold),
    `alpha` the median of the per-fold alphas (all in `alpha_by_fold`, repeats separated by "|"), `converged`
    whether every final fit of that label set reached `tol` within `max_iter` (a small `max_iter` buys speed
    with early-stopped probes; this column says so), `repeats`, `value_sd_repeats` (NaN for one repeat) and
    `ci_covers` ("groups" or "groups+repeats": the variance the interval covers, module docstring).

    Over 60 lines through its signature and docstring (every argument of the public entry point documented
    here); the body checks the arguments, runs the repeats and pools them.
    """
    task = infer_task(y, task)  # before any fitting
    if groups is None:
        groups = np.arange(len(y))
        warnings.warn("evaluate: no groups given, so every row is its own group; rows of one sentence share "
                      "information, which makes folds leak and intervals too narrow: pass groups= (sentence ids)",
                      UserWarning, stacklevel=2)  # fmt: skip
    if not 0 < ci < 1:
        raise ValueError(f"ci must be a level in (0, 1), got {ci}")
    if n_boot < 0:
        raise ValueError(f"n_boot must be >= 0, got {n_boot}")
    names, numeric = _checked_metrics(task, y, control, within_k, ordinal, metrics)
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    runs = []
    for r in range(repeats):
        seed_r = repeat_seed(seed, r)
        control_r = control(seed_r) if callable(control) else control
        runs.append(_one_repeat(
            X, y, groups, control_r, names, numeric, task=task, n_folds=n_folds, cv=cv, alphas=alphas, backend=backend,
            device=device, seed=seed_r, inner_folds=inner_folds, standardize=standardize, max_iter=max_iter,
            tol=tol, n_threads=n_threads, n_boot=n_boot,
        ))  # fmt: skip
    return _pooled_rows(runs, names, n_boot=n_boot, ci=ci, task=task, backend=backend)


def evaluate_split(
    X_train: Any,
    y_train: Any,
    X_test: Any,
    y_test: Any,
    groups_test: Any,
    *,
    groups_train: Any = None,
    task: str | None = None,
    alphas: float | Sequence[float] | None = None,
    backend: str = "sklearn",
    device: str | torch.device | None = None,
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
    within_k: int | Sequence[int] | None = None,
    control_train: Any = None,
    control_test: Any = None,
    ordinal: bool | None = None,
    metrics: Sequence[str] | None = None,
    inner_folds: int = 3,
    standardize: bool = True,
    max_iter: int = 1000,
    tol: float = 1e-4,
    n_threads: int | None = None,
) -> pd.DataFrame:
    """Train on one split, score on another: `evaluate`'s table for a probe fit on ALL of
    (X_train [n_train, d], y_train [n_train]) and scored on every row of (X_test [n_test, d], y_test [n_test]),
    one prediction per test row (e.g. train on one corpus, report on another).

    The fit, metrics, baselines (majority = the training split's majority class / mean) and the group bootstrap
    are `evaluate`'s own code: the interval resamples whole ``groups_test`` (test sentences/windows) with the
    fitted probe held fixed (``ci_covers="groups"``: test-sample variance only, not training variance).
    ``alphas``: a number = that alpha; a list = chosen by a grouped inner CV on the TRAINING rows only (needs
    ``groups_train``); None = that CV over `DEFAULT_ALPHAS`. ``control_train`` / ``control_test``: Hewitt &
    Liang control labels of the two splits (both or neither; draw them together, e.g. `control_labels` on the
    concatenated word types, so a type keeps its label across splits): the same probe at the same alpha is fit
    to the training control labels and scored on the test ones; adds control and selectivity rows (paired
    bootstrap). Other arguments as in `evaluate`.

    Returns `evaluate`'s columns; ``n_train`` / ``n_test`` are the two splits' row counts, ``n_groups`` the
    test groups, ``n_folds`` 0 (no folds), ``repeats`` 1.
    """
    task = infer_task(y_train, task)
    if not 0 < ci < 1:
        raise ValueError(f"ci must be a level in (0, 1), got {ci}")
    if n_boot < 0:
        raise ValueError(f"n_boot must be >= 0, got {n_boot}")
    if (control_train is None) != (control_test is None):
        raise ValueError("pass control_train and control_test together (control labels of both splits), or neither")
    names, numeric = _checked_metrics(task, y_test, control_test, within_k, ordinal, metrics)
    check_backend(backend)
    X_train, X_test = check_features(X_train, name="X_train"), check_features(X_test, name="X_test", min_rows=1)
    if X_train.shape[1] != X_test.shape[1]:
        raise ValueError(f"X_train has {X_train.shape[1]} features and X_test {X_test.shape[1]}; they must match")
    n_train, n_test = X_train.shape[0], X_test.shape[0]
    y_tr, y_te = check_target(y_train, n_train, task, name="y_train"), check_target(y_test, n_test, task, name="y_test")
    group_idx, n_groups = check_groups(groups_test, n_test)
    if task == "classification":
        check_classes(y_tr, name="y_train")
    elif np.ptp(y_tr) == 0:
        raise ValueError("the regression target y_train is constant; check the target")
    grid = _alpha_grid(alphas)
    if backend == "torch":
        dev = torch.device(device) if device is not None else torch.device("cpu")
        X_train, X_test = _to_tensor(X_train, dev), _to_tensor(X_test, dev)

    def new_probe() -> LinearProbe:
        return LinearProbe(task=task, standardize=standardize, backend=backend, device=device,
                           max_iter=max_iter, seed=seed, tol=tol, warm_start=True, n_threads=n_threads)  # fmt: skip

    if len(grid) == 1:
        alpha = grid[0]
    else:
        if groups_train is None:
            raise ValueError(f"choosing among {len(grid)} alphas needs groups_train (an inner grouped CV on the "
                             "training rows); pass it, or a single alpha")  # fmt: skip
        train_idx, _ = check_groups(groups_train, n_train)
        alpha = _choose_alpha(X_train, y_tr, train_idx, grid, inner_folds, fold_rng(seed), new_probe, task,
                              " (training split)")  # fmt: skip
    y_pred, majority, ok = _fit_predict(new_probe(), alpha, X_train, y_tr, X_test, task)
    cv = CrossValPredictions(
        y_pred=np.asarray(y_pred), majority_pred=np.full(n_test, majority, dtype=_pred_dtype(y_tr, task)),
        fold=np.zeros(n_test, dtype=np.int64), group_idx=group_idx, n_groups=n_groups, alpha_by_fold=[alpha],
        n_train_by_fold=[n_train], converged=[ok],
    )  # fmt: skip
    if control_train is not None:
        c_tr = check_target(control_train, n_train, task, name="control_train")
        check_target(control_test, n_test, task, name="control_test")
        if task == "classification":
            check_classes(c_tr, name="control_train")
        c_pred, c_majority, c_ok = _fit_predict(new_probe(), alpha, X_train, c_tr, X_test, task)
        cv.control_pred = np.asarray(c_pred)
        cv.control_majority_pred = np.full(n_test, c_majority, dtype=_pred_dtype(c_tr, task))
        cv.control_converged = [c_ok]
    run = _score_run(cv, y_te, control_test, names, numeric, task=task, n_boot=n_boot, seed=seed,
                     n_threads=n_threads)  # fmt: skip
    out = _pooled_rows([run], names, n_boot=n_boot, ci=ci, task=task, backend=backend)
    out["n_folds"] = 0
    return out


def _pooled_rows(runs: list[dict[str, Any]], names: list[str], *, n_boot: int, ci: float, task: str,
                 backend: str) -> pd.DataFrame:  # fmt: skip
    """`evaluate`'s long table from its runs (one per repeat, `_score_run`): mean points, pooled intervals."""
    repeats = len(runs)
    labels_all = list(runs[0]["points"])
    common = {
        "n_train": int(round(np.mean([np.mean(run["cv"].n_train_by_fold) for run in runs]))),
        "n_test": len(runs[0]["cv"].y_pred),
        "n_groups": runs[0]["cv"].n_groups,
        "alpha": float(np.median([a for run in runs for a in run["cv"].alpha_by_fold])),
        "alpha_by_fold": "|".join(";".join(f"{a:g}" for a in run["cv"].alpha_by_fold) for run in runs),
        "n_folds": int(runs[0]["cv"].fold.max()) + 1,
        "n_boot": n_boot,
        "ci_level": ci,
        "task": task,
        "backend": backend,
        "repeats": repeats,
        "ci_covers": "groups" if repeats == 1 else "groups+repeats",
    }
    rows = []
    for labels in labels_all:
        converged = all(run["converged"][labels] for run in runs)
        for m in names:
            values = np.array([run["points"][labels][m] for run in runs])
            pooled = np.concatenate([run["replicates"][labels][m] for run in runs]) if n_boot else np.empty(0)
            lo, hi = (float(b) for b in percentile_interval(pooled, ci)) if n_boot else (np.nan, np.nan)
            base = [run["baselines"].get(labels, {}).get(m, (np.nan, np.nan)) for run in runs]
            majority, chance = (float(np.mean([b[i] for b in base])) for i in (0, 1))
            rows.append({"labels": labels, "metric": m, "value": float(np.mean(values)), "ci_low": lo,
                         "ci_high": hi, "baseline_majority": majority, "baseline_chance": chance, **common,
                         "converged": converged,
                         "value_sd_repeats": float(np.std(values, ddof=1)) if repeats > 1 else np.nan})  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)


def _one_repeat(
    X: Any,
    y: Any,
    groups: Any,
    control: Any,
    names: list[str],
    numeric: bool,
    *,
    task: str,
    n_boot: int,
    seed: int,
    n_threads: int | None,
    **cv_kwargs: Any,
) -> dict[str, Any]:
    """Points, bootstrap replicates, baselines and convergence of one cross-validation run (one seed)."""
    cv = grouped_cross_val_predict(X, y, groups, task=task, seed=seed, control=control, n_threads=n_threads,
                                   **cv_kwargs)  # fmt: skip
    return _score_run(cv, y, control, names, numeric, task=task, n_boot=n_boot, seed=seed, n_threads=n_threads)


def _score_run(
    cv: CrossValPredictions, y: Any, control: Any, names: list[str], numeric: bool, *, task: str, n_boot: int,
    seed: int, n_threads: int | None,
) -> dict[str, Any]:  # fmt: skip
    """Points, group-bootstrap replicates, baselines and convergence of the predictions ``cv`` of the rows
    whose truth is ``y`` (and ``control``): one CV run of `evaluate`, or the test rows of `evaluate_split`."""
    n = len(cv.y_pred)
    y = check_target(y, n, task)
    label_sets = {"task": (y, cv.y_pred, cv.majority_pred)}
    if cv.control_pred is not None:
        label_sets["control"] = (check_target(control, n, task, name="control"), cv.control_pred,
                                 cv.control_majority_pred)  # fmt: skip
    scorers, baselines = {}, {}
    for labels, (truth, pred, majority) in label_sets.items():
        if numeric:
            truth, pred, majority = (as_numeric_labels(a, what=labels) for a in (truth, pred, majority))
        scorers[labels] = GroupScorer(truth, pred, cv.group_idx, cv.n_groups, names)
        majority_scores = GroupScorer(truth, majority, cv.group_idx, cv.n_groups, names).point()
        baselines[labels] = {m: (majority_scores[m], chance_baseline(m, truth)) for m in names}
    with thread_limit(n_threads):
        replicates = _bootstrap(scorers, cv.n_groups, n_boot, seed)
    if "control" in scorers:
        replicates["selectivity"] = {m: replicates["task"][m] - replicates["control"][m] for m in names}
    points = {labels: sc.point() for labels, sc in scorers.items()}
    if "control" in points:
        points["selectivity"] = {m: points["task"][m] - points["control"][m] for m in names}
    converged = {"task": all(cv.converged), "control": all(cv.control_converged)}
    converged["selectivity"] = converged["task"] and converged["control"]
    return {"cv": cv, "points": points, "replicates": replicates, "baselines": baselines, "converged": converged}


def _checked_metrics(task: str, y: Any, control: Any, within_k: Any, ordinal: bool | None,
                     metrics: Sequence[str] | None) -> tuple[list[str], bool]:  # fmt: skip
    """`evaluate`'s metric names (the default set for the task, within-k and ordinal flags, cut to `metrics`)
    and whether they need numeric labels; labels that cannot be numbers fail here, before any fit."""
    ks = _as_ks(within_k)
    ordinal = bool(ks) if ordinal is None else ordinal
    names = metric_names(task, ks, ordinal)
    if metrics is not None:
        unknown = sorted(set(metrics) - set(names))
        if unknown:
            raise ValueError(f"metrics {unknown} are not available here; choose from {names}")
        names = [m for m in names if m in set(metrics)]
    numeric = task == "regression" or ordinal or bool(ks)
    if numeric:  # fail before fitting, not after
        for what, labels in (("y", y), ("control", control)):
            if labels is not None and not callable(labels):
                as_numeric_labels(np.asarray(labels), what=f"{what} with metrics {names}")
    return names, numeric


def grouped_cross_val_predict(
    X: Any,
    y: Any,
    groups: Any,
    *,
    task: str = "classification",
    n_folds: int = 5,
    alphas: float | Sequence[float] | None = None,
    backend: str = "sklearn",
    device: str | torch.device | None = None,
    seed: int = 0,
    control: Any = None,
    cv: Any = None,
    inner_folds: int = 3,
    standardize: bool = True,
    max_iter: int = 1000,
    tol: float = 1e-4,
    n_threads: int | None = None,
) -> CrossValPredictions:
    """Out-of-fold predictions [n] from grouped K-fold CV with a nested grouped CV for alpha.

    Arguments as in `evaluate`. Folds keep groups whole and are stratified by label (`grouped_folds`), in an
    order shuffled by `seed`. Raises if a training split holds a single class.

    Over 60 lines only through its signature (one keyword per line, as `evaluate`'s); the body is the fold
    loop, with input checks and each fit in helpers.
    """
    X, y, y_control, group_idx, n_groups, grid = _check_cv_inputs(
        X, y, groups, control, task=task, n_folds=2 if cv is not None else n_folds, alphas=alphas,
        inner_folds=inner_folds, backend=backend, device=device,
    )  # fmt: skip
    n = X.shape[0]
    rng = fold_rng(seed)  # the outer folds, then the inner alpha-selection folds, from one stream
    if cv is None:
        fold = grouped_folds(group_idx, n_groups, n_folds, rng, strata_of(y, task))
    else:
        fold = folds_from_splitter(cv, n, y, groups, group_idx)
        n_folds = int(fold.max()) + 1

    def new_probe() -> LinearProbe:
        return LinearProbe(task=task, standardize=standardize, backend=backend, device=device,
                           max_iter=max_iter, seed=seed, tol=tol, warm_start=True, n_threads=n_threads)  # fmt: skip

    y_pred = np.empty(n, dtype=_pred_dtype(y, task))
    majority = np.empty(n, dtype=y_pred.dtype)
    control_pred = control_majority = None
    if y_control is not None:
        control_pred = np.empty(n, dtype=_pred_dtype(y_control, task))
        control_majority = np.empty(n, dtype=control_pred.dtype)
    alpha_by_fold, n_train_by_fold, converged, control_converged = [], [], [], []
    for f in range(n_folds):
        train, test = np.flatnonzero(fold != f), np.flatnonzero(fold == f)
        where = f" (training split of outer fold {f})"
        if task == "classification":
            check_classes(y[train], where=where)
        alpha = grid[0] if len(grid) == 1 else _choose_alpha(
            _rows(X, train), y[train], group_idx[train], grid, inner_folds, rng, new_probe, task, where
        )  # fmt: skip
        Xtr, Xte = _rows(X, train), _rows(X, test)
        # a fresh probe per fold: warm-starting from another fold's solution would carry that fold's fit on
        # this fold's test rows into directions the penalty barely shrinks (a leak we measured)
        y_pred[test], majority[test], ok = _fit_predict(new_probe(), alpha, Xtr, y[train], Xte, task)
        converged.append(ok)
        if y_control is not None:
            if task == "classification":
                check_classes(y_control[train], name="control", where=where)
            control_pred[test], control_majority[test], ok = _fit_predict(
                new_probe(), alpha, Xtr, y_control[train], Xte, task
            )
            control_converged.append(ok)
        alpha_by_fold.append(alpha)
        n_train_by_fold.append(len(train))
    return CrossValPredictions(
        y_pred=y_pred, majority_pred=majority, fold=fold, group_idx=group_idx, n_groups=n_groups,
        alpha_by_fold=alpha_by_fold, n_train_by_fold=n_train_by_fold, control_pred=control_pred,
        control_majority_pred=control_majority, converged=converged, control_converged=control_converged,
    )  # fmt: skip


def folds_from_splitter(cv: Any, n: int, y: Any, groups: Any, group_idx: np.ndarray) -> np.ndarray:
    """Fold [n] of each row from a scikit-learn splitter's test sets (``cv.split(X, y, groups)``); every row must
    be tested exactly once (a K-fold splitter, not a shuffle-split). Warns when a group is cut across folds."""
    if not hasattr(cv, "split"):
        raise TypeError(f"cv must be a scikit-learn splitter with a split() method (e.g. GroupKFold(5)), got "
                        f"{type(cv).__name__}")  # fmt: skip
    fold = np.full(n, -1, dtype=np.int64)
    for f, (_, test) in enumerate(cv.split(np.zeros((n, 1)), np.asarray(y), None if groups is None else
                                           np.asarray(groups))):  # fmt: skip
        if np.any(fold[test] >= 0):
            raise ValueError(f"cv {type(cv).__name__} tests some rows in several folds; out-of-fold prediction "
                             "needs each row tested exactly once (a K-fold splitter)")  # fmt: skip
        fold[test] = f
    if np.any(fold < 0):
        raise ValueError(f"cv {type(cv).__name__} leaves {int(np.sum(fold < 0))} rows out of every test fold; "
                         "out-of-fold prediction needs each row tested exactly once (a K-fold splitter)")
    if fold.max() < 1:
        raise ValueError(f"cv {type(cv).__name__} made a single fold; it needs at least 2")
    cut = len({(g, f) for g, f in zip(group_idx.tolist(), fold.tolist(), strict=True)}) > len(np.unique(group_idx))
    if cut:  # some group has rows in more than one fold
        warnings.warn(f"cv {type(cv).__name__} puts rows of one group in several folds, so training and test "
                      "share sentences (a leak); use a group-aware splitter such as GroupKFold", UserWarning,
                      stacklevel=3)  # fmt: skip
    return fold


def _fit_predict(probe: LinearProbe, alpha: float, Xtr: Any, ytr: np.ndarray, Xte: Any,
                 task: str) -> tuple[np.ndarray, Any, bool]:  # fmt: skip
    """One outer fold: the probe fitted at `alpha` on the training rows; its predictions on the test rows,
    the training majority (mean for regression) and whether the fit converged."""
    fitted = probe.set_params(alpha=alpha).fit(Xtr, ytr)
    return fitted.predict(Xte), _majority(ytr, task), bool(fitted.converged_)


def _check_cv_inputs(
    X: Any, y: Any, groups: Any, control: Any, *, task: str, n_folds: int, alphas: Any, inner_folds: int,
    backend: str, device: Any,
) -> tuple[Any, np.ndarray, np.ndarray | None, np.ndarray, int, list[float]]:  # fmt: skip
    """`grouped_cross_val_predict`'s inputs checked: (X [n, d] (a tensor on `device` for the torch
    backend), y [n], control [n] or None, group index [n], number of groups, alpha grid)."""
    infer_task(y, task)  # checks the name; refuses classification on continuous labels
    check_backend(backend)
    X = check_features(X)
    n = X.shape[0]
    y = check_target(y, n, task)
    if n_folds < 2:
        raise ValueError(f"n_folds must be >= 2, got {n_folds}")
    group_idx, n_groups = check_groups(groups, n, min_groups=n_folds, purpose=f"n_folds={n_folds}")
    grid = _alpha_grid(alphas)
    if len(grid) > 1 and inner_folds < 2:
        raise ValueError(f"inner_folds must be >= 2 to choose among {len(grid)} alphas, got {inner_folds}")
    if task == "classification":
        check_classes(y)
    elif np.ptp(y) == 0:
        raise ValueError("the regression target y is constant; R^2 and Spearman are undefined. Check the target")
    y_control = None
    if control is not None:
        y_control = check_target(control, n, task, name="control")
        if task == "classification":
            check_classes(y_control, name="control")
    if backend == "torch":
        X = _to_tensor(X, torch.device(device) if device is not None else torch.device("cpu"))
    return X, y, y_control, group_idx, n_groups, grid


def repeat_seed(seed: int, repeat: int) -> int:
    """The seed of repeat ``repeat`` of a repeated cross-validation run with ``seed`` (`evaluate`'s
    ``repeats``): ``seed + repeat``. It seeds that repeat's folds (`fold_rng`), inner folds, probes, bootstrap
    and control labels."""
    return int(seed) + int(repeat)


def fold_rng(seed: int, repeat: int = 0) -> np.random.Generator:
    """The generator that draws the outer folds (`grouped_folds`) of `grouped_cross_val_predict` with
    ``seed``, in repeat ``repeat`` of `evaluate`: code that needs the folds a probe was scored on (a
    memorisation ceiling, a capacity sweep over the same folds) draws them from here."""
    return np.random.default_rng([repeat_seed(seed, repeat), 0])


def grouped_folds(
    group_idx: np.ndarray,
    n_groups: int,
    n_folds: int,
    rng: np.random.Generator,
    strata: np.ndarray | None = None,
) -> np.ndarray:
    """Fold [n] of each row: whole groups per fold, stratified by label, balanced in rows.

    group_idx: [n] in 0..n_groups-1; strata: [n] small ints (class index, or target quantile bin), None = one
    stratum. Groups are visited largest first (ties in an order shuffled by rng) and each goes to the fold
    where its labels are currently rarest (fewest rows on ties). Stratifying matters: with unstratified
    folds the training split's label mix is anti-correlated with the test split's, which biases scores of
    unlearnable labels away from chance.
    """
    if n_groups < n_folds:
        raise ValueError(f"only {n_groups} distinct groups for {n_folds} folds; pass fewer folds or more groups")
    strata = np.zeros_like(group_idx) if strata is None else np.asarray(strata).reshape(-1)
    n_strata = int(strata.max()) + 1
    per_group = sparse.csr_matrix(
        (np.ones(len(group_idx)), (group_idx, strata)), shape=(n_groups, n_strata)
    )  # [group, stratum] row counts
    sizes = np.asarray(per_group.sum(1)).reshape(-1)
    shuffled = rng.permutation(n_groups)
    order = shuffled[np.argsort(-sizes[shuffled], kind="stable")]
    fold_counts = np.zeros((n_strata, n_folds))  # [stratum, fold]
    load = np.zeros(n_folds)
    fold_of_group = np.empty(n_groups, dtype=np.int64)
    indptr, cols, vals = per_group.indptr, per_group.indices, per_group.data
    for g in order:
        c, v = cols[indptr[g] : indptr[g + 1]], vals[indptr[g] : indptr[g + 1]]
        overlap = v @ fold_counts[c]  # [fold]: how much of this group's labels each fold already holds
        f = int(np.lexsort((np.arange(n_folds), load, overlap))[0])
        fold_of_group[g] = f
        fold_counts[c, f] += v
        load[f] += sizes[g]
    return fold_of_group[group_idx]


def strata_of(y: np.ndarray, task: str, n_bins: int = 10) -> np.ndarray:
    """Stratum [n] of each row: class index (classification) or quantile bin of the target (regression)."""
    if task == "classification":
        return np.unique(y, return_inverse=True)[1].reshape(-1)
    edges = np.quantile(y, np.linspace(0, 1, n_bins + 1)[1:-1])
    return np.searchsorted(edges, y, side="right")


# -- helpers ------------------------------------------------------------------------------------------------


def _choose_alpha(
    X: Any,
    y: np.ndarray,
    group_idx: np.ndarray,
    grid: list[float],
    inner_folds: int,
    rng: np.random.Generator,
    new_probe: Any,
    task: str,
    where: str,
) -> float:
    """Alpha with the best pooled inner out-of-fold accuracy / R^2 (ties: the stronger L2)."""
    _, local = np.unique(group_idx, return_inverse=True)
    n_local = int(local.max()) + 1
    if n_local < inner_folds:
        raise ValueError(
            f"only {n_local} groups{where} for inner_folds={inner_folds}; pass fewer inner folds, "
            "more groups, or a single alpha"
        )
    inner = grouped_folds(local.reshape(-1), n_local, inner_folds, rng, strata_of(y, task))
    path = sorted(grid, reverse=True)
    correct = np.zeros(len(path))
    sse = np.zeros(len(path))
    for j in range(inner_folds):
        train, test = np.flatnonzero(inner != j), np.flatnonzero(inner == j)
        if task == "classification":
            check_classes(y[train], where=f"{where[:-1]}, inner fold {j})")
        Xtr, Xte = _rows(X, train), _rows(X, test)
        # one alpha path per inner training split, warm-started within it only
        for i, probe in enumerate(new_probe().fit_path(Xtr, y[train], path)):
            pred = probe.predict(Xte)
            if task == "classification":
                correct[i] += np.sum(pred == y[test])
            else:
                sse[i] += np.sum((pred - y[test]) ** 2)
    score = correct if task == "classification" else -sse  # pooled R^2 is monotone in -SSE
    return path[int(np.argmax(score))]  # argmax takes the first (largest alpha) among ties


def _bootstrap(
    scorers: dict[str, GroupScorer], n_groups: int, n_boot: int, seed: int
) -> dict[str, dict[str, np.ndarray]]:
    """Replicates {labels: {metric: [n_boot]}}; every label set sees the same group resamples (paired)."""
    parts: dict[str, dict[str, list[np.ndarray]]] = {k: {m: [] for m in s.metrics} for k, s in scorers.items()}
    for counts in iter_resample_counts(n_groups, n_boot, [seed, 1]):
        for labels, scorer in scorers.items():
            for m, v in scorer(counts).items():
                parts[labels][m].append(v)
    return {k: {m: np.concatenate(v) if v else np.empty(0) for m, v in d.items()} for k, d in parts.items()}


def _alpha_grid(alphas: float | Sequence[float] | None) -> list[float]:
    if alphas is None:
        return list(DEFAULT_ALPHAS)
    grid = [float(a) for a in np.atleast_1d(np.asarray(alphas, dtype=np.float64))]
    if not grid or any(not np.isfinite(a) or a < 0 for a in grid):
        raise ValueError(f"alphas must be finite non-negative numbers, got {alphas!r}")
    return grid


def _as_ks(within_k: int | Sequence[int] | None) -> tuple[int, ...]:
    if within_k is None:
        return ()
    ks = tuple(int(k) for k in np.atleast_1d(within_k))
    if any(k < 0 for k in ks):
        raise ValueError(f"within_k must be >= 0, got {within_k!r}")
    return ks


def _rows(X: Any, idx: np.ndarray) -> Any:
    if isinstance(X, torch.Tensor):
        return X[torch.as_tensor(idx, device=X.device)]
    return X[idx]


def _majority(y_train: np.ndarray, task: str) -> Any:
    if task == "regression":
        return float(np.mean(y_train))
    values, counts = np.unique(y_train, return_counts=True)
    return values[int(np.argmax(counts))]  # ties: the smallest label


def _pred_dtype(y: np.ndarray, task: str) -> np.dtype:
    return np.dtype(np.float64) if task == "regression" else y.dtype
