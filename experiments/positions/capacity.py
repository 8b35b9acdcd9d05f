"""The capacity sweep of the absolute-position probe (Hewitt & Liang 2019): task accuracy, control-task
accuracy and selectivity along a grid of L2 strengths, with the operating point chosen by selectivity on
tuning data only.

One warm-started alpha path per training split (`probes.LinearProbe.fit_path`, strongest L2 first) for the
task and one for the control labels, on the grouped, label-stratified folds `probes.evaluate` makes for the
same seed (`probes.grouped_folds`): a sweep over A alphas costs about two fits per fold instead of 2A, and the
warm start never crosses splits. Intervals: the shared group bootstrap (`probes.bootstrap.group_bootstrap`)
over windows with the fitted probes held fixed; task, control and selectivity share each resample (paired).
Alpha is the L2 strength on the MEAN loss (`probes.LinearProbe`), so the grid means the same on tuning folds
(~1,000 rows) and on probe folds (~2,700 rows).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd


def oof_path(
    X: np.ndarray,
    labels: dict[str, np.ndarray],
    groups: np.ndarray,
    *,
    task: str = "classification",
    alphas: Sequence[float],
    n_folds: int = 3,
    seed: int = 0,
    backend: str = "sklearn",
) -> dict:
    """Out-of-fold predictions of one probe per label set at every alpha, one warm-started path per fold.

    X ``[n, d]``; each ``labels`` value and groups ``[n]``. The folds are the ones `probes.evaluate` makes for
    ``seed`` (grouped, stratified by the first label set). Returns ``{"pred": {name: [A, n]}, "majority":
    {name: [n]} (each training split's majority class / mean, for its test rows), "group_idx": [n],
    "n_train": mean training-split size}``. The sklearn backend by default: the torch solver stops early at the
    strongest L2 of a wide grid (its tolerance is not scaled to the tiny weights there).
    """
    from bertscope.probes import LinearProbe, check_groups, fold_rng, grouped_folds, strata_of

    labels = {k: np.asarray(v) for k, v in labels.items()}
    first = next(iter(labels.values()))
    group_idx, n_groups = check_groups(groups, len(first), min_groups=n_folds, purpose=f"n_folds={n_folds}")
    fold = grouped_folds(group_idx, n_groups, n_folds, fold_rng(seed), strata_of(first, task))
    grid = [float(a) for a in alphas]
    X = np.asarray(X, dtype=np.float32)
    pred = {k: np.empty((len(grid), len(v)), dtype=v.dtype if task == "classification" else np.float64)
            for k, v in labels.items()}  # fmt: skip
    majority = {k: np.empty(len(v), dtype=pred[k].dtype) for k, v in labels.items()}
    probe, n_train = LinearProbe(task=task, backend=backend, seed=seed), []
    for f in range(n_folds):
        train, test = np.flatnonzero(fold != f), np.flatnonzero(fold == f)
        for name, y in labels.items():
            pred[name][:, test], majority[name][test] = _path_predict(probe, X[train], y[train], X[test], grid, task)
        n_train.append(len(train))
    return {"pred": pred, "majority": majority, "group_idx": group_idx, "n_train": float(np.mean(n_train))}


def split_path(
    X_train: np.ndarray, labels_train: dict[str, np.ndarray], X: np.ndarray, groups: np.ndarray, *,
    task: str = "classification", alphas: Sequence[float], seed: int = 0, backend: str = "sklearn",
) -> dict:
    """`oof_path` for a probe fit on one corpus and scored on another (``--eval-corpus``): one warm-started
    alpha path per label set on all of X_train ``[m, d]`` (labels ``[m]``), predicting every row of X
    ``[n, d]`` (groups ``[n]``: the scored windows). Returns `oof_path`'s dict (``n_train`` = m)."""
    from bertscope.probes import LinearProbe, check_groups

    group_idx, _ = check_groups(groups, len(X))
    grid = [float(a) for a in alphas]
    probe = LinearProbe(task=task, backend=backend, seed=seed)
    X_train, X = np.asarray(X_train, dtype=np.float32), np.asarray(X, dtype=np.float32)
    pred, majority = {}, {}
    for name, y in labels_train.items():
        path, base = _path_predict(probe, X_train, np.asarray(y), X, grid, task)
        pred[name], majority[name] = path, np.full(len(X), base)
    return {"pred": pred, "majority": majority, "group_idx": group_idx, "n_train": float(len(X_train))}


def _path_predict(probe: object, Xtr: np.ndarray, ytr: np.ndarray, Xte: np.ndarray, grid: list[float],
                  task: str) -> tuple[np.ndarray, object]:  # fmt: skip
    """Predictions ``[A, n_test]`` of one warm-started alpha path fit on (Xtr, ytr), and the training split's
    intercept-only prediction (majority class, or mean)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a rare early stop at the weakest L2 should not flood the log
        pred = np.stack([fitted.predict(Xte) for fitted in probe.fit_path(Xtr, ytr, grid)])
    if task == "classification":
        values, counts = np.unique(ytr, return_counts=True)
        return pred, values[np.argmax(counts)]
    return pred, ytr.mean()


def sweep_scores(
    X: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray,
    control: np.ndarray,
    *,
    alphas: Sequence[float],
    n_folds: int = 3,
    seed: int = 0,
    n_boot: int = 200,
    ci: float = 0.95,
    backend: str = "sklearn",
    train: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> pd.DataFrame:
    """Accuracy of the task (``control="none"``), of the control task (``"control_task"``) and selectivity
    (``"selectivity"``, task - control) at every alpha, with paired group-bootstrap intervals (``n_boot`` 0: no
    interval). Arguments as in `oof_path`. One row per (alpha, control), metric ``accuracy``, with
    the columns of a positions long-table probe row (``probe="sweep"``, ``ci_covers="groups"``). ``train``:
    ``(X, y, control)`` of another corpus's rows to fit the probes on (`split_path`; ``n_folds`` 0), scoring
    every row of X."""
    from bertscope.probes import group_bootstrap
    from bertscope.probes.metrics import chance_baseline

    if train is None:
        path = oof_path(X, {"task": y, "control": control}, groups, alphas=alphas, n_folds=n_folds, seed=seed,
                        backend=backend)  # fmt: skip
    else:
        path = split_path(train[0], {"task": train[1], "control": train[2]}, X, groups, alphas=alphas, seed=seed,
                          backend=backend)  # fmt: skip
        n_folds = 0
    pred = {**path["pred"], "n_train": path["n_train"]}
    g = path["group_idx"]
    n_groups = int(g.max()) + 1
    rows_per_group = np.bincount(g, minlength=n_groups).astype(np.float64)
    hits = np.stack([pred["task"] == np.asarray(y)[None], pred["control"] == np.asarray(control)[None]])  # [2, A, n]
    per_group = np.array([[np.bincount(g, weights=h, minlength=n_groups) for h in part]
                          for part in hits.astype(np.float64)])  # [2, A, G] correct predictions per window
    sums = per_group.reshape(2 * len(alphas), n_groups).T  # [G, 2A]

    def statistic(counts: np.ndarray) -> np.ndarray:  # counts [m, G] -> [m, 3, A]
        acc = ((counts @ sums) / (counts @ rows_per_group)[:, None]).reshape(len(counts), 2, len(alphas))
        return np.concatenate([acc, acc[:, :1] - acc[:, 1:]], axis=1)

    est = group_bootstrap(statistic, n_groups, n_boot=n_boot, level=ci, seed=[seed, 1])
    truth = {"none": np.asarray(y), "control_task": np.asarray(control)}
    chance = {k: chance_baseline("accuracy", v) for k, v in truth.items()}
    majority = {k: float(np.mean(path["majority"][m] == truth[k])) for k, m in (("none", "task"),
                                                                               ("control_task", "control"))}
    rows = []
    for i, alpha in enumerate(alphas):
        for j, name in enumerate(("none", "control_task", "selectivity")):
            rows.append({"alpha": float(alpha), "control": name, "metric": "accuracy",
                         "value": float(est.value[j, i]), "ci_low": float(est.low[j, i]),
                         "ci_high": float(est.high[j, i]), "baseline_chance": chance.get(name, np.nan),
                         "baseline_majority": majority.get(name, np.nan), "n_train": pred["n_train"],
                         "n_test": len(g), "n_groups": n_groups, "n_folds": n_folds, "n_boot": n_boot,
                         "repeats": 1, "ci_covers": "groups" if n_boot else "none", "probe": "sweep"})  # fmt: skip
    return pd.DataFrame(rows)


def choose_capacity(scores: pd.DataFrame) -> float:
    """The alpha with the best mean selectivity in ``scores`` (rows of `sweep_scores`, possibly from several
    sites; ``control == "selectivity"``), ties to the stronger L2 (less capacity)."""
    sel = scores[scores["control"] == "selectivity"].groupby("alpha")["value"].mean()
    best = sel.max()
    return float(max(a for a, v in sel.items() if v == best))
