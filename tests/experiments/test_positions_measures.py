"""Known-answer tests for the probe-free measures and pair designs of the positions experiment."""

from __future__ import annotations

import numpy as np
import pytest
from bertscope.experiments.positions.measures import (
    distance_bucket,
    linear_cka,
    pair_features,
    permute_positions,
    sample_pairs,
    table_pairs,
    variance_share,
)


def _planted(n_win: int = 64, n_pos: int = 16, d: int = 24, noise: float = 0.5, seed: int = 0):
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(n_pos, d))
    grid = table[None] + noise * rng.normal(size=(n_win, n_pos, d))
    return grid, table


def _direct_cka(x: np.ndarray, y: np.ndarray) -> float:
    xc, yc = x - x.mean(0), y - y.mean(0)
    return float(np.linalg.norm(xc.T @ yc) ** 2 / (np.linalg.norm(xc.T @ xc) * np.linalg.norm(yc.T @ yc)))


def test_variance_share_recovers_planted_fraction():
    grid, table = _planted(noise=0.7)
    expected = table.var(0).sum() / (table.var(0).sum() + 0.7**2 * table.shape[1])
    out = variance_share(grid, n_boot=300, seed=1)
    assert out["ci_low"] <= expected <= out["ci_high"]
    assert abs(out["value"] - expected) < 0.02
    assert out["raw"] > out["value"]  # the plain statistic carries the sampling noise of the means


def test_variance_share_is_one_without_noise_and_zero_without_position():
    grid, _ = _planted(noise=0.0)
    assert variance_share(grid, n_boot=0)["value"] == pytest.approx(1.0)
    noise = np.random.default_rng(3).normal(size=(64, 16, 24))
    out = variance_share(noise, n_boot=300, seed=2)
    assert out["ci_low"] <= 0.0 <= out["ci_high"]
    assert abs(out["value"]) < 0.01
    # the raw statistic sits near (P - 1) / (N - 1) for independent data
    assert out["raw"] == pytest.approx(15 / (64 * 16 - 1), rel=0.3)


def test_linear_cka_matches_direct_formula_and_is_invariant_to_rotation():
    grid, table = _planted(n_win=20, n_pos=8, d=6, noise=0.3)
    x = grid.reshape(-1, grid.shape[2])
    y = np.tile(table, (grid.shape[0], 1))
    assert linear_cka(grid, table)["value"] == pytest.approx(_direct_cka(x, y), rel=1e-6)
    q, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(6, 6)))
    exact = np.broadcast_to(3.0 * table @ q, grid.shape)
    out = linear_cka(exact, table)
    assert out["value"] == pytest.approx(1.0, abs=1e-6)


def test_linear_cka_drops_to_baseline_when_positions_are_permuted():
    grid, table = _planted(noise=0.5)
    real = linear_cka(grid, table)
    permuted = linear_cka(permute_positions(grid, seed=0), table)
    assert real["ci_low"] > 0.5
    assert permuted["ci_high"] < 0.1
    assert real["ci_low"] <= real["value"] <= real["ci_high"]


def test_measures_reject_bad_shapes():
    with pytest.raises(ValueError, match="window, pos, d"):
        variance_share(np.zeros((4, 5)))
    with pytest.raises(ValueError, match="one row per window position"):
        linear_cka(np.zeros((4, 5, 3)), np.zeros((6, 3)))


def test_sample_pairs_are_valid_and_balanced():
    pairs = sample_pairs(200, 32, 20, seed=0)
    assert len(pairs.i) == 4000
    assert ((pairs.i >= 0) & (pairs.i < 32) & (pairs.j >= 0) & (pairs.j < 32)).all()
    assert (pairs.i != pairs.j).all()
    assert abs(pairs.before.mean() - 0.5) < 0.03
    counts = np.bincount(pairs.bucket)
    assert len(counts) == 5  # distances 1, 2-3, 4-7, 8-15, 16-31
    assert counts.min() > 0.8 * counts.mean()
    assert np.array_equal(distance_bucket(np.array([1, 2, 3, 4, 7, 8, 31])), [0, 1, 1, 2, 2, 3, 4])
    with pytest.raises(ValueError, match="distances >= 1"):
        distance_bucket(np.array([0]))


def test_pair_features_are_concat_and_difference():
    grid = np.arange(2 * 4 * 3, dtype=float).reshape(2, 4, 3)
    pairs = sample_pairs(2, 4, 3, seed=1)
    concat = pair_features(grid, pairs, "concat")
    diff = pair_features(grid, pairs, "diff")
    assert concat.shape == (6, 6) and diff.shape == (6, 3)
    k = 4
    hi, hj = grid[pairs.seq[k], pairs.i[k]], grid[pairs.seq[k], pairs.j[k]]
    assert np.array_equal(concat[k], np.concatenate([hi, hj]))
    assert np.array_equal(diff[k], hi - hj)
    with pytest.raises(ValueError, match="concat' or 'diff"):
        pair_features(grid, pairs, "sum")


def test_table_pairs_never_share_a_position_between_groups():
    pairs, groups = table_pairs(128, 5, 2000, seed=0)
    owner: dict[int, int] = {}
    for i, j, g in zip(pairs.i, pairs.j, groups, strict=True):
        for p in (int(i), int(j)):
            assert owner.setdefault(p, int(g)) == g
    assert len(np.unique(groups)) == 5
    assert len(np.unique(pairs.bucket)) == 7  # distances 1 .. 127
