"""Input validation shared by the probe estimator, `evaluate` and `mdl_probe`.

Every check raises a `ValueError` that names what was wrong and what to do about it; nothing is silently
dropped, imputed or truncated.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import threadpoolctl
import torch

TASKS = ("classification", "regression")
BACKENDS = ("sklearn", "torch")


def check_task(task: str) -> str:
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    return task


MAX_INFERRED_CLASSES = 50


def infer_task(y: Any, task: str | None = None, *, max_classes: int = MAX_INFERRED_CLASSES) -> str:
    """The probe task for labels ``y`` [n]: ``task`` checked against the labels, or inferred when None.

    Inference: float labels -> ``"regression"``; integer, boolean or string labels -> ``"classification"``,
    when they have at most ``max_classes`` distinct values (more integer values are ambiguous, e.g. positions
    0..127: pass ``task``). An explicit ``"classification"`` on floats that are not whole numbers is refused:
    it would make every distinct value a class and score ~0 after a long fit.
    """
    if task is not None:
        check_task(task)
    arr = np.asarray(y.detach().cpu().numpy() if isinstance(y, torch.Tensor) else y)
    kind = arr.dtype.kind
    if kind == "f":
        finite = arr[np.isfinite(arr)]
        continuous = bool(len(finite)) and not bool(np.all(finite == np.round(finite)))
        if task == "classification" and continuous:
            example = finite[finite != np.round(finite)][0]
            raise ValueError(
                f"y holds continuous values (e.g. {example:g}, {len(np.unique(finite))} distinct); a "
                "classification probe would treat each value as a class. Use task='regression', or bin the "
                "labels into classes first"
            )
        return task or "regression"
    if task is not None:
        return task
    if kind in "biu":
        n_classes = len(np.unique(arr))
        if kind != "b" and n_classes > max_classes:
            raise ValueError(
                f"y holds {n_classes} distinct integers: classes or a quantity? Pass task='classification' or "
                "task='regression'"
            )
        return "classification"
    if kind in "USO":
        return "classification"
    raise ValueError(f"cannot infer a probe task from labels of dtype {arr.dtype}; pass task=")


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def check_features(X: Any, *, name: str = "X", min_rows: int = 2) -> np.ndarray | torch.Tensor:
    """Return X as a 2-D finite float array (numpy) or tensor (kept on its device).

    X: [n, d]. Integer inputs are converted to float32; float64 numpy input is kept as float64.
    """
    if isinstance(X, torch.Tensor):
        if X.ndim != 2:
            raise ValueError(f"{name} must be 2-D [n_samples, n_features], got shape {tuple(X.shape)}")
        if not X.is_floating_point():
            X = X.float()
        bad = ~torch.isfinite(X)
        if bool(bad.any()):
            _raise_non_finite(name, bad.nonzero()[0].tolist(), int(bad.sum()))
        arr = X
    else:
        arr = np.asarray(X)
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
            raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
        if arr.ndim != 2:
            raise ValueError(f"{name} must be 2-D [n_samples, n_features], got shape {arr.shape}")
        if not np.issubdtype(arr.dtype, np.floating):
            arr = arr.astype(np.float32)
        bad = ~np.isfinite(arr)
        if bad.any():
            rows, cols = np.nonzero(bad)
            _raise_non_finite(name, [int(rows[0]), int(cols[0])], int(bad.sum()))
    if arr.shape[0] < min_rows:
        raise ValueError(f"{name} has {arr.shape[0]} rows; at least {min_rows} needed")
    if arr.shape[1] < 1:
        raise ValueError(f"{name} has no feature columns")
    return arr


def check_target(y: Any, n: int, task: str, *, name: str = "y") -> np.ndarray:
    """Return y as a 1-D array of length n; regression targets as finite float64."""
    if isinstance(y, torch.Tensor):
        y = y.detach().cpu().numpy()
    arr = np.asarray(y)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D [n_samples], got shape {arr.shape}")
    if len(arr) != n:
        raise ValueError(f"{name} has {len(arr)} entries but X has {n} rows; they must match one to one")
    if task == "regression":
        if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
            raise ValueError(f"regression needs a numeric {name}, got dtype {arr.dtype}")
        arr = arr.astype(np.float64)
        if not np.isfinite(arr).all():
            first = int(np.flatnonzero(~np.isfinite(arr))[0])
            raise ValueError(f"{name} contains NaN or inf (first at index {first}); drop those rows")
    else:
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            first = int(np.flatnonzero(~np.isfinite(arr))[0])
            raise ValueError(f"{name} contains NaN or inf labels (first at index {first}); drop those rows")
    return arr


def check_classes(y: np.ndarray, *, name: str = "y", where: str = "") -> tuple[np.ndarray, np.ndarray]:
    """Return (classes [K], y_index [n]); raise if fewer than two classes are present."""
    classes, y_idx = np.unique(y, return_inverse=True)
    if len(classes) < 2:
        label = classes[0] if len(classes) else None
        raise ValueError(
            f"{name}{where} has a single class ({label!r}); a classification probe needs at least two "
            "distinct labels. Check the target, or use more data."
        )
    return classes, y_idx.reshape(-1)


def check_spread(y: np.ndarray, *, name: str = "y", where: str = "") -> None:
    """Raise if a regression target ``y`` [n] has zero variance (every value equal): like a single-class
    classification target, it leaves nothing to predict, and R^2 would be undefined (scored as 1.0)."""
    if len(y) and np.ptp(y) == 0:
        raise ValueError(
            f"{name}{where} has zero variance (every value is {float(y[0])!r}); a regression probe needs a target "
            "that varies. Check the target, or use more data."
        )


def check_groups(groups: Any, n: int, *, min_groups: int = 1, purpose: str = "") -> tuple[np.ndarray, int]:
    """Return (group_index [n] in 0..G-1, G). groups: [n] sentence/document ids of each row."""
    if isinstance(groups, torch.Tensor):
        groups = groups.detach().cpu().numpy()
    arr = np.asarray(groups)
    if arr.ndim != 1:
        raise ValueError(f"groups must be 1-D [n_samples], got shape {arr.shape}")
    if len(arr) != n:
        raise ValueError(f"groups has {len(arr)} entries but X has {n} rows; they must match one to one")
    _, idx = np.unique(arr, return_inverse=True)
    n_groups = int(idx.max()) + 1
    if n_groups < min_groups:
        raise ValueError(
            f"only {n_groups} distinct groups but {purpose} needs at least {min_groups}: "
            "pass fewer folds, or more groups (sentences/documents)"
        )
    return idx.reshape(-1).astype(np.int64), n_groups


def as_numeric_labels(y: np.ndarray, *, what: str) -> np.ndarray:
    """Labels as float64 for ordinal metrics (MAE, Spearman, within-k); raise if they are not numbers."""
    if not (np.issubdtype(y.dtype, np.number) or y.dtype == bool):
        raise ValueError(f"{what} needs numeric (ordinal) labels, got dtype {y.dtype}")
    return y.astype(np.float64)


def _raise_non_finite(name: str, first: list[int], count: int) -> None:
    raise ValueError(
        f"{name} contains {count} non-finite values (NaN or inf), first at [row, column] = {first}; "
        "drop or repair those rows before probing"
    )


@contextmanager
def thread_limit(n_threads: int | None) -> Iterator[None]:
    """Cap torch, BLAS and OpenMP threads at n_threads inside the block (None: leave them alone).

    On a machine shared with other busy processes, one thread was 5-6x faster than two in our measurements
    (idle threads spin-wait for a descheduled partner); on an idle machine two threads are faster.
    """
    if n_threads is None:
        yield
        return
    if n_threads < 1:
        raise ValueError(f"n_threads must be a positive number of threads or None, got {n_threads}")
    before = torch.get_num_threads()
    torch.set_num_threads(n_threads)
    try:
        with threadpoolctl.threadpool_limits(limits=n_threads):
            yield
    finally:
        torch.set_num_threads(before)
