"""Hewitt & Liang (2019) control tasks and selectivity.

A control task keeps the output space of the real task but makes the label a fixed random function of the
word type: every occurrence of a type gets the same label, drawn once from the empirical label distribution.
A probe can only score on it by memorising word identity, so selectivity = task score - control score
measures how much of a probe's score is more than memorisation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ._checks import check_target
from .evaluate import evaluate


def control_labels(word_types: Any, y: Any, *, seed: int = 0) -> np.ndarray:
    """Control labels [n]: one label per distinct word type, drawn from the empirical distribution of y.

    word_types: [n] word type of each row (strings or ints, e.g. lower-cased word or token id);
    y: [n] real labels (class labels, or numbers for regression targets: the draw is then from the observed
    values). The map type -> label depends only on the set of types, the label counts and `seed` (types are
    visited in sorted order), not on the row order.
    """
    types = np.asarray(word_types)
    if types.ndim != 1:
        raise ValueError(f"word_types must be 1-D [n], got shape {types.shape}")
    y = check_target(y, len(types), "classification")
    if len(types) == 0:
        raise ValueError("word_types and y are empty")
    unique_types, type_idx = np.unique(types, return_inverse=True)
    values, counts = np.unique(y, return_counts=True)
    rng = np.random.default_rng(seed)
    drawn = rng.choice(len(values), size=len(unique_types), p=counts / counts.sum())
    return values[drawn][type_idx.reshape(-1)]


def selectivity(
    X: Any,
    y: Any,
    word_types: Any,
    groups: Any,
    *,
    seed: int = 0,
    **evaluate_kwargs: Any,
) -> pd.DataFrame:
    """Evaluate the task, a control task built from `word_types`, and their difference, in one table.

    X: [n, d]; y, word_types, groups: [n]. Keyword arguments go to `evaluate` (task, n_folds, alphas,
    backend, n_boot, within_k, repeats, ...). Returns `evaluate`'s long table with labels "task", "control"
    and "selectivity" (task - control, with a paired group-bootstrap interval). The control labels are drawn
    with the seed of each repeat (`seed`, `seed + 1`, ...), so with `repeats > 1` the interval also covers
    the choice of control task.
    """
    word_types = np.asarray(word_types)

    def control(repeat_seed: int) -> np.ndarray:
        return control_labels(word_types, y, seed=repeat_seed)

    return evaluate(X, y, groups, seed=seed, control=control, **evaluate_kwargs)
