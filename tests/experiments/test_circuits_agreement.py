"""The circuits agreement measures (issue 40.13): Spearman, Kramár et al.'s top-k recall and E|effect|, each with a
bootstrap interval over pairs, on planted answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from bertscope.experiments.circuits.measures import agreement_measures, agreement_table


def _planted(n_pairs: int = 4, n_nodes: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """Exact effect of node i = i + 1 in every pair; the estimate misses the true top 5 (scores them 0)."""
    exact = np.tile(np.arange(1.0, n_nodes + 1), (n_pairs, 1))
    est = exact.copy()
    est[:, -5:] = 0.0
    return est, exact


def test_top_k_recall_and_mean_abs_effect_are_the_planted_counts():
    est, exact = _planted()
    m = agreement_measures(est, exact, n_boot=50)
    # true top 5 = nodes 25..29, scored 0; the estimate's top 5/10/20 are nodes 24..20 / 24..15 / 24..5
    assert m["recall_at_5"] == 0.0 and m["recall_at_10"] == 0.5 and m["recall_at_20"] == 0.75
    assert m["mean_abs_exact"] == pytest.approx(15.5)  # mean of 1..30
    assert m["mean_abs_estimate"] == pytest.approx(sum(range(1, 26)) / 30)
    for name in ("recall_at_10", "mean_abs_exact", "spearman"):  # identical pairs: nothing varies on resampling
        assert m[f"{name}_low"] == pytest.approx(m[name]) and m[f"{name}_high"] == pytest.approx(m[name])
    perfect = agreement_measures(exact, exact, n_boot=0)
    assert perfect["spearman"] == pytest.approx(1.0) and perfect["recall_at_20"] == 1.0
    assert np.isnan(perfect["recall_at_5_low"])  # no resamples asked for: no interval


def test_a_magnitude_estimate_is_compared_with_the_mean_absolute_effect():
    """Effects whose sign flips between pairs average to 0; a magnitude estimate (AtP*'s GradDrop) is scored against
    the mean of |effect|, which it matches exactly here, and the signed comparison would call it unrelated."""
    n_nodes = 12
    exact = np.stack([np.arange(1.0, n_nodes + 1) * (-1) ** p for p in range(4)])
    est = np.abs(exact)
    m = agreement_measures(est, exact, signed=False, n_boot=50)
    assert m["spearman"] == pytest.approx(1.0) and m["recall_at_5"] == 1.0 and m["recall_at_10"] == 1.0
    assert "recall_at_20" not in m  # k >= the number of nodes is no test
    assert m["mean_abs_exact"] == pytest.approx(m["mean_abs_estimate"]) == pytest.approx(6.5)
    assert agreement_measures(est, exact, signed=True, n_boot=0)["mean_abs_exact"] == pytest.approx(0.0)


def test_the_bootstrap_interval_varies_with_the_pairs():
    rng = np.random.default_rng(0)
    exact = rng.normal(size=(40, 30)) + np.arange(30) * 0.1
    est = exact + rng.normal(scale=2.0, size=exact.shape)
    m = agreement_measures(est, exact, n_boot=200)
    for name in ("spearman", "recall_at_10", "mean_abs_estimate"):
        assert m[f"{name}_low"] <= m[name] <= m[f"{name}_high"] and m[f"{name}_low"] < m[f"{name}_high"], name


def test_agreement_table_has_the_new_columns_and_says_what_atp_star_is_compared_with():
    est, exact = _planted()
    t = agreement_table({"exact": exact, "atp": est, "atp*": np.abs(est)}, n_boot=20)
    assert isinstance(t, pd.DataFrame) and list(t.method) == ["atp", "atp*"]
    for col in ("spearman", "spearman_low", "pearson", "n_heads", "n_pairs", "recall_at_5", "recall_at_10_low",
                "recall_at_20_high", "mean_abs_exact", "mean_abs_estimate", "mean_abs_estimate_high", "reference"):
        assert col in t, col
    assert list(t.reference) == ["mean effect", "mean |effect|"]
    assert t.recall_at_10.tolist() == [0.5, 0.5]
