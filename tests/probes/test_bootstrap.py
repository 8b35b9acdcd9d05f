"""Known answers for the one group bootstrap (probes/bootstrap.py)."""

from __future__ import annotations

import numpy as np
import pytest
from bertscope.probes import bootstrap as bs


def test_percentile_interval_covers_a_known_mean_about_95_percent():
    """200 simulated datasets of 40 groups (unequal sizes) with mean 2: the 95% interval holds 2 about 95% of
    the time (loose bounds: a broken interval, e.g. a 50% one or one around the wrong value, fails)."""
    rng = np.random.default_rng(12345)
    hits = 0
    for _ in range(200):
        sizes = rng.integers(1, 8, size=40)
        sums = np.array([rng.normal(2.0, 1.0, size=k).sum() for k in sizes])
        out = bs.ratio_of_sums(sums, sizes, n_boot=400, seed=int(rng.integers(1 << 30)))
        hits += bool(out.low <= 2.0 <= out.high)
    assert 0.88 <= hits / 200 <= 0.99


def test_deterministic_for_a_seed_and_chunking_does_not_change_the_draws():
    a = bs.resample_counts(17, 300, seed=[3, 1])
    b = np.concatenate(list(bs.iter_resample_counts(17, 300, [3, 1], max_cells=17 * 7)))
    np.testing.assert_array_equal(a, b)
    assert (a.sum(1) == 17).all()
    assert not np.array_equal(a, bs.resample_counts(17, 300, seed=4))
    x = np.random.default_rng(0).normal(size=(17, 3))
    first, second = (bs.ratio_of_sums(x, 1.0, n_boot=100, seed=9) for _ in range(2))
    np.testing.assert_array_equal(first.low, second.low)
    np.testing.assert_array_equal(first.high, second.high)


def test_ratio_of_sums_is_the_full_sample_value_at_the_identity_resample():
    rng = np.random.default_rng(1)
    numer, denom = rng.random((9, 4, 2)), rng.integers(1, 5, (9, 4, 2)).astype(float)
    out = bs.ratio_of_sums(numer, denom, n_boot=50, seed=0)
    np.testing.assert_allclose(out.value, numer.sum(0) / denom.sum(0), rtol=1e-12)
    assert out.value.shape == out.low.shape == (4, 2)
    assert (out.low <= out.high).all()
    # the interval of each metric is the one the bootstrap of that metric alone gives (vectorised = looped)
    alone = bs.ratio_of_sums(numer[:, 1, 0], denom[:, 1, 0], n_boot=50, seed=0)
    assert float(alone.low) == pytest.approx(out.low[1, 0], rel=1e-12)


def test_mean_of_groups_weights_groups_equally_and_skips_undefined():
    values = np.array([[1.0, np.nan], [3.0, 2.0], [5.0, 4.0]])
    out, n = bs.mean_of_groups(values, n_boot=500, seed=0)
    np.testing.assert_allclose(out.value, [3.0, 3.0])
    np.testing.assert_array_equal(n, [3, 2])
    assert 1.0 <= out.low[0] < 3.0 < out.high[0] <= 5.0
    constant, _ = bs.mean_of_groups(np.full((10, 2), 0.25), n_boot=200)
    np.testing.assert_allclose([constant.low, constant.high], 0.25)  # no spread, no interval
    all_nan, n = bs.mean_of_groups(np.full((4, 1), np.nan), n_boot=20)
    assert np.isnan(all_nan.low).all() and (n == 0).all()


def test_group_bootstrap_quantiles_match_numpy_on_the_same_draws():
    x = np.random.default_rng(2).exponential(size=25)
    out = bs.group_bootstrap(lambda c: c @ x / c.sum(1), 25, n_boot=300, level=0.9, seed=5)
    reps = bs.resample_counts(25, 300, seed=5) @ x / 25
    np.testing.assert_allclose([out.low, out.high], np.quantile(reps, [0.05, 0.95]), rtol=1e-12)
    nan_bounds = bs.group_bootstrap(lambda c: c @ x, 25, n_boot=0)
    assert np.isnan(nan_bounds.low) and np.isfinite(nan_bounds.value)


@pytest.mark.parametrize("level", [0.0, 1.0, 1.5])
def test_bad_level_is_a_clear_error(level):
    with pytest.raises(ValueError, match="level"):
        bs.percentile_interval(np.zeros((3, 1)), level)
