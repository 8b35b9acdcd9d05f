"""`evaluate` infers the probe task from the labels and refuses classification on continuous labels."""

from __future__ import annotations

import importlib
import time
import warnings

import numpy as np
import pytest
import torch
from bertscope.probes import evaluate
from bertscope.probes._checks import infer_task


@pytest.mark.parametrize(
    ("y", "task"),
    [
        (np.array([0.1, 2.5, 3.0]), "regression"),
        (np.array([1.0, 2.0, 3.0]), "regression"),  # floats are quantities, even whole ones
        (torch.tensor([0.5, 1.5]), "regression"),
        (np.array([0, 1, 1, 2]), "classification"),
        (torch.tensor([0, 1, 1]), "classification"),
        (np.array([True, False]), "classification"),
        (np.array(["NOUN", "VERB"]), "classification"),
        (["NOUN", "VERB"], "classification"),
        (np.array(["a", "b"], dtype=object), "classification"),
    ],
)
def test_infer_task(y, task):
    assert infer_task(y) == task


def test_explicit_task_is_checked():
    assert infer_task(np.array([0.0, 1.0, 1.0]), "classification") == "classification"  # whole floats are fine
    assert infer_task(np.arange(500), "regression") == "regression"
    assert infer_task(np.arange(500), "classification") == "classification"
    with pytest.raises(ValueError, match="continuous values"):
        infer_task(np.array([0.25, 1.0]), "classification")
    with pytest.raises(ValueError, match="task must be one of"):
        infer_task(np.array([0, 1]), "ranking")
    with pytest.raises(ValueError, match="500 distinct integers"):
        infer_task(np.arange(500))


def _data(n_groups=30, per=6, seed=0):
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(n_groups), per)
    X = rng.normal(size=(len(groups), 4))
    return X, groups, rng


def test_evaluate_infers_regression_for_float_labels():
    X, groups, rng = _data()
    y = X[:, 0] * 2.0 + 0.1 * rng.normal(size=len(X))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the old default (classification) fitted one class per value, noisily
        table = evaluate(X, y, groups, alphas=1e-3, n_boot=0)  # L2 on the mean loss (probes convention)
    assert set(table.task) == {"regression"}
    assert float(table.loc[table.metric == "r2", "value"].iloc[0]) > 0.9


def test_evaluate_infers_classification_for_integer_and_string_labels():
    X, groups, _ = _data()
    y = (X[:, 0] > 0).astype(int)
    assert set(evaluate(X, y, groups, alphas=1.0, n_boot=0).task) == {"classification"}
    names = np.array(["NOUN", "VERB"])[y]
    table = evaluate(X, names, groups, alphas=1.0, n_boot=0)
    assert set(table.task) == {"classification"}
    assert float(table.loc[table.metric == "accuracy", "value"].iloc[0]) > 0.8


def test_classification_on_continuous_labels_is_refused_before_fitting(monkeypatch):
    X, groups, rng = _data()
    y = rng.normal(size=len(X))
    evaluate_module = importlib.import_module("bertscope.probes.evaluate")  # the module, not the function

    def no_fit(*args, **kwargs):
        raise AssertionError("fitting started before the labels were checked")

    monkeypatch.setattr(evaluate_module, "grouped_cross_val_predict", no_fit)
    start = time.perf_counter()
    with pytest.raises(ValueError, match="task='regression'"):
        evaluate(X, y, groups, task="classification")
    assert time.perf_counter() - start < 1.0
