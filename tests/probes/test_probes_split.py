"""`probes.evaluate_split`: a probe trained on one split and scored on another, with evaluate's own metrics,
baselines, controls and group bootstrap."""

from __future__ import annotations

import numpy as np
import pytest
from bertscope.probes import LinearProbe, control_labels, evaluate_split


def _planted(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """X [n, 8] whose first coordinate carries a 3-class concept; word types (20) and sentence groups."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    X = rng.normal(size=(n, 8))
    X[:, 0] += 4.0 * y
    types = rng.integers(0, 20, n)
    return X, y, types, np.arange(n) // 5


def test_split_scores_exactly_the_fits_predictions_on_the_test_rows() -> None:
    Xa, ya, _, ga = _planted(300, 0)
    Xb, yb, _, gb = _planted(120, 1)
    res = evaluate_split(Xa, ya, Xb, yb, gb, task="classification", alphas=1e-3, n_boot=50, seed=0)
    fitted = LinearProbe(task="classification", seed=0, warm_start=True).set_params(alpha=1e-3).fit(Xa, ya)
    want = float(np.mean(fitted.predict(Xb) == yb))
    acc = res.set_index("metric").loc["accuracy"]
    assert acc["value"] == want and want > 0.9  # the planted concept transfers
    assert acc["n_test"] == 120 and acc["n_train"] == 300 and acc["n_groups"] == 24 and acc["n_folds"] == 0
    assert acc["ci_low"] <= want <= acc["ci_high"] and acc["ci_covers"] == "groups"
    # the majority baseline is the TRAINING split's majority class scored on the test rows
    values, counts = np.unique(ya, return_counts=True)
    assert acc["baseline_majority"] == float(np.mean(yb == values[np.argmax(counts)]))


def test_split_control_task_and_selectivity_are_defined() -> None:
    Xa, ya, ta, _ = _planted(300, 0)
    Xb, yb, tb, gb = _planted(120, 1)
    control = control_labels(np.concatenate([ta, tb]), np.concatenate([ya, yb]), seed=0)  # one label per type
    res = evaluate_split(Xa, ya, Xb, yb, gb, task="classification", alphas=1e-3, n_boot=50,
                         control_train=control[:300], control_test=control[300:])  # fmt: skip
    acc = res[res.metric == "accuracy"].set_index("labels")["value"]
    assert set(acc.index) == {"task", "control", "selectivity"}
    fitted = LinearProbe(task="classification", seed=0, warm_start=True).set_params(alpha=1e-3)
    want = float(np.mean(fitted.fit(Xa, control[:300]).predict(Xb) == control[300:]))
    assert acc["control"] == want
    assert acc["selectivity"] == pytest.approx(acc["task"] - acc["control"])
    assert (res.n_test == 120).all()


def test_split_fit_never_sees_test_labels_and_alpha_grid_uses_train_groups() -> None:
    Xa, ya, _, ga = _planted(200, 0)
    Xb, yb, _, gb = _planted(60, 1)
    kw = dict(task="classification", alphas=[1e-4, 1e-2, 1.0], groups_train=ga, n_boot=0)
    one = evaluate_split(Xa, ya, Xb, yb, gb, **kw)
    other = evaluate_split(Xa, ya, Xb, (yb + 1) % 3, gb, **kw)  # relabelled test rows
    assert one.alpha.iloc[0] == other.alpha.iloc[0]  # alpha chosen on the training rows only
    acc_one = one.set_index("metric").loc["accuracy", "value"]
    acc_other = other.set_index("metric").loc["accuracy", "value"]
    assert acc_one > 0.9 and acc_other < 0.1  # the same fit, scored against other truths
    with pytest.raises(ValueError, match="groups_train"):
        evaluate_split(Xa, ya, Xb, yb, gb, task="classification", alphas=[1e-3, 1.0])
    with pytest.raises(ValueError, match="together"):
        evaluate_split(Xa, ya, Xb, yb, gb, task="classification", alphas=1e-3, control_train=ya)


def test_split_regression() -> None:
    Xa, ya, _, _ = _planted(200, 0)
    Xb, yb, _, gb = _planted(80, 1)
    res = evaluate_split(Xa, ya.astype(float), Xb, yb.astype(float), gb, task="regression", alphas=1e-3, n_boot=20)
    fitted = LinearProbe(task="regression", seed=0, warm_start=True).set_params(alpha=1e-3).fit(Xa, ya.astype(float))
    pred = fitted.predict(Xb)
    r2 = 1 - np.sum((pred - yb) ** 2) / np.sum((yb - yb.mean()) ** 2)
    assert res.set_index("metric").loc["r2", "value"] == pytest.approx(r2)
