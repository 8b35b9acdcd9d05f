"""Known-answer tests of the positions experiment's controls: memorisation ceiling, capacity choice on tuning
data, nested table `exact` with an interval, and findings generated from saved tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from bertscope.experiments import positions
from bertscope.experiments.findings import Finding
from bertscope.experiments.positions import capacity, probing
from bertscope.probes import control_labels, evaluate


def test_memorisation_ceiling_is_the_share_of_test_types_seen_in_training_and_bounds_control_accuracy():
    rng = np.random.default_rng(0)
    n_win, P = 60, 8
    groups = np.repeat(np.arange(n_win), P)
    y = np.tile(np.arange(P), n_win)
    # 40 common types + one unique type per window at position 0: those 60 tokens are never seen in training
    types = rng.integers(0, 40, size=n_win * P)
    types[y == 0] = 1000 + np.arange(n_win)
    ceil = probing.memorisation_ceiling(types, y, groups, n_folds=3, seed=0, repeats=2)
    assert ceil["value"] == pytest.approx(1 - 1 / P)  # every common type is seen (40 types, 420 tokens)
    assert ceil["low"] <= ceil["value"] <= ceil["high"]
    # a probe that can memorise (one-hot type features) reaches the ceiling; beyond it only lucky guesses on
    # the unseen tokens (at most their share times the commonest control label's rate)
    X = np.zeros((len(types), 1100))
    X[np.arange(len(types)), np.where(types >= 1000, types - 1000 + 40, types)] = 1
    control = control_labels(types, y, seed=0)
    res = evaluate(X, control, groups, task="classification", n_folds=3, alphas=1e-4, n_boot=0, seed=0,
                   metrics=["accuracy"])  # fmt: skip
    top = np.bincount(control).max() / len(control)
    assert res["value"].iloc[0] <= ceil["value"] + (1 - ceil["value"]) * top + 0.02
    assert res["value"].iloc[0] > ceil["value"] - 0.1


def _planted_capacity_data(seed: int = 1):
    """Windows of P positions; features = noisy one-hot position + one-hot word type (12 types)."""
    rng = np.random.default_rng(seed)
    n_win, P = 30, 6
    groups = np.repeat(np.arange(n_win), P)
    y = np.tile(np.arange(P), n_win)
    types = rng.integers(0, 12, size=len(y))
    X = np.concatenate([np.eye(P)[y] + 0.3 * rng.normal(size=(len(y), P)), np.eye(12)[types]], axis=1)
    return X, y, groups, control_labels(types, y, seed=0)


def test_capacity_choice_prefers_the_probe_that_keeps_position_and_loses_word_identity():
    X, y, groups, control = _planted_capacity_data()
    scores = capacity.sweep_scores(X, y, groups, control, alphas=(1e-3, 10.0), n_folds=3, n_boot=0)
    sel = scores[scores["control"] == "selectivity"].set_index("alpha")["value"]
    assert set(sel.index) == {1e-3, 10.0}
    # a weak-L2 probe memorises types (high control accuracy); strong L2 keeps position and loses types
    assert sel[10.0] > sel[1e-3]
    assert capacity.choose_capacity(scores) == 10.0
    ties = scores.assign(value=0.0)
    assert capacity.choose_capacity(ties) == 10.0  # ties go to the stronger L2


def test_capacity_sweep_path_equals_separate_fits_on_evaluates_folds():
    """One warm-started path per fold gives the scores `probes.evaluate` gives at each alpha (same folds)."""
    X, y, groups, control = _planted_capacity_data(seed=2)
    alphas = (1e-2, 1.0)
    scores = capacity.sweep_scores(X, y, groups, control, alphas=alphas, n_folds=3, seed=4, n_boot=50)
    for alpha in alphas:
        ref = evaluate(X, y, groups, task="classification", n_folds=3, alphas=alpha, n_boot=0, seed=4,
                       control=control, metrics=["accuracy"], backend="torch")  # fmt: skip
        got = scores[scores["alpha"] == alpha].set_index("control")["value"]
        want = ref.set_index("labels")["value"]
        assert got["none"] == pytest.approx(want["task"], abs=0.01)
        assert got["control_task"] == pytest.approx(want["control"], abs=0.01)
        assert got["selectivity"] == pytest.approx(want["selectivity"], abs=0.02)
    scored = scores[scores["control"] != "selectivity"]
    assert scored["baseline_chance"].notna().all() and scored["baseline_majority"].notna().all()
    ok = scores["ci_low"] <= scores["value"] + 1e-12
    assert ok.all() and (scores["value"] <= scores["ci_high"] + 1e-12).all()


def test_table_exact_is_nested_with_an_interval_and_decodes_a_one_hot_table():
    table = np.eye(16) * 3.0
    exact = probing.table_exact(table, alphas=(1e-6, 1e-2), n_folds=4, n_boot=100)
    assert np.isfinite(exact["ci_low"]) and exact["ci_low"] <= exact["value"] <= exact["ci_high"]
    # a held-out one-hot row carries nothing about its index: ridge cannot extrapolate to an unseen direction
    assert exact["value"] < 0.5
    smooth = np.stack([np.arange(16.0), np.ones(16)], axis=1)  # index is a linear function of the row
    assert probing.table_exact(smooth, alphas=(1e-6, 1.0), n_folds=4, n_boot=50)["value"] == 1.0


def _fake_tables(tmp_path, acc_last: float, zeroed: float):
    summary = pd.DataFrame({
        "site": ["embed.hook_word", "embed.hook_out", "blocks.5.hook_resid_post"],
        "layer": [0, 0, 6], "accuracy": [0.03, 0.99, acc_last], "accuracy_ci_low": [0.02, 0.98, acc_last - 0.02],
        "accuracy_ci_high": [0.04, 1.0, acc_last + 0.02], "zeroed_accuracy": [0.03, 0.03, zeroed],
        "zeroed_accuracy_ci_low": [0.02, 0.02, zeroed - 0.01], "zeroed_accuracy_ci_high": [0.04, 0.04, zeroed + 0.01],
        "chance": [1 / 32] * 3, "ci_covers": ["groups+repeats"] * 3, "repeats": [3] * 3, "alpha": [1e-3] * 3,
        "control_accuracy": [0.5, 0.9, 0.85], "control_accuracy_ci_low": [0.45, 0.88, 0.83],
        "control_accuracy_ci_high": [0.55, 0.92, 0.87], "memorisation_ceiling": [0.961] * 3,
        "selectivity": [-0.47, 0.09, acc_last - 0.85], "selectivity_ci_low": [-0.5, 0.07, acc_last - 0.88],
        "selectivity_ci_high": [-0.44, 0.11, acc_last - 0.82],
    })  # fmt: skip
    summary.to_csv(tmp_path / "summary_absolute.csv", index=False)
    pd.DataFrame({
        "site": ["blocks.5.hook_resid_post"] * 2, "layer": [6, 6], "alpha": [0.1, 1.0], "accuracy": [0.5, 0.4],
        "accuracy_ci_low": [0.45, 0.35], "accuracy_ci_high": [0.55, 0.45], "control_accuracy": [0.6, 0.3],
        "control_accuracy_ci_low": [0.55, 0.25], "control_accuracy_ci_high": [0.65, 0.35],
        "selectivity": [-0.1, 0.1], "selectivity_ci_low": [-0.15, 0.05], "selectivity_ci_high": [-0.05, 0.15],
        "memorisation_ceiling": [0.96, 0.96], "chosen": [False, True], "ci_covers": ["groups"] * 2,
    }).to_csv(tmp_path / "capacity_sweep.csv", index=False)  # fmt: skip


@pytest.mark.parametrize("acc_last, zeroed, holds", [(0.60, 0.03, True), (0.20, 0.03, None), (0.035, 0.03, False)])
def test_findings_come_from_the_tables_and_the_verdict_follows_the_null(tmp_path, acc_last, zeroed, holds):
    _fake_tables(tmp_path, acc_last, zeroed)
    found = positions.findings(tmp_path)
    assert all(isinstance(f, Finding) for f in found)
    claim = [f for f in found if f.claim == "position"]
    assert len(claim) == 1 and claim[0].holds is holds
    assert f"{acc_last:.3f}" in claim[0].text and "0.031" in claim[0].text  # numbers formatted from the table
    sweep = [f for f in found if "capacity chosen by selectivity" in f.text]
    assert sweep and "0.960" in sweep[0].text and "alpha 1" in sweep[0].text  # the chosen row, not the other
    assert "strongest in the grid" in sweep[0].text  # alpha 1 is the grid's end here: said so
    verdict = {True: "claim holds", None: "holds only in part", False: "does not hold"}[holds]
    assert verdict in claim[0].text
    assert "3 repeated fold" in claim[0].text  # the variance the interval covers, in words
    control = [f for f in found if "control task" in f.text and "0.961" in f.text]
    assert control and "0.850" in control[0].text  # last layer's control accuracy beside the ceiling
    assert positions.findings(tmp_path / "missing") == []


def test_every_figure_has_a_caption():
    from bertscope.experiments.positions import plots

    assert set(positions.CAPTIONS) >= {"fig_absolute_vs_layer", "fig_capacity_sweep", "fig_mdl_vs_layer",
                                       "fig_confusion", "fig_position_table", "fig_probe_free_vs_layer"}  # fmt: skip
    assert plots.site_title("blocks.5.hook_resid_post") == "after layer 5"  # blocks from 0, as in hook names
    assert plots.site_title("embed.hook_out") == "embedding output"
