"""Issue 27.16, probes: LinearProbe infers regression from float labels as evaluate does; evaluate runs without
groups (with a warning) and takes a scikit-learn splitter."""

from __future__ import annotations

import numpy as np
import pytest
from bertscope.probes import LinearProbe, evaluate
from sklearn.model_selection import GroupKFold, KFold, ShuffleSplit


def _data(n: int = 120, d: int = 5, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    w = np.arange(1, d + 1, dtype=float)
    return X, X @ w + 0.01 * rng.normal(size=n), (X @ w > 0).astype(int), np.repeat(np.arange(n // 4), 4)


@pytest.mark.parametrize("backend", ["sklearn", "torch"])
def test_linear_probe_infers_the_task_from_the_labels(backend):
    X, y_float, y_int, _ = _data()
    reg = LinearProbe(backend=backend).fit(X, y_float)
    assert reg.task is None and reg.task_ == "regression" and reg.score(X, y_float) > 0.99
    assert np.asarray(reg.coef_).shape == (5,)
    clf = LinearProbe(backend=backend).fit(X, y_int)
    assert clf.task_ == "classification" and list(clf.classes_) == [0, 1]
    assert LinearProbe(task="classification", backend=backend).fit(X, y_int).task_ == "classification"
    path = LinearProbe(backend=backend).fit_path(X, y_float, [1e-3, 0.0])
    assert [p.task_ for p in path] == ["regression", "regression"]  # alpha 0 is allowed for ridge


def test_evaluate_without_groups_warns_and_treats_rows_as_groups():
    X, _, y, groups = _data()
    with pytest.warns(UserWarning, match="no groups"):
        table = evaluate(X, y, n_boot=20, alphas=1e-2)
    assert int(table["n_groups"].iloc[0]) == len(y)
    assert table.query("labels == 'task' and metric == 'accuracy'")["value"].iloc[0] > 0.9


def test_evaluate_takes_a_scikit_learn_splitter():
    X, _, y, groups = _data()
    table = evaluate(X, y, groups, cv=GroupKFold(n_splits=4), n_boot=20, alphas=1e-2)
    assert int(table["n_folds"].iloc[0]) == 4
    with pytest.warns(UserWarning, match="one group in several folds"):
        evaluate(X, y, groups, cv=KFold(5, shuffle=True, random_state=0), n_boot=0, alphas=1e-2)
    with pytest.raises(ValueError, match="exactly once"):
        evaluate(X, y, groups, cv=ShuffleSplit(3, test_size=0.2, random_state=0), n_boot=0, alphas=1e-2)
    with pytest.raises(TypeError, match="splitter"):
        evaluate(X, y, groups, cv=5, n_boot=0, alphas=1e-2)
