"""Probe-free measures of positional signal and the pair designs for relative order.

- :func:`variance_share`: share of hidden-state variance explained by position (between-position sum of
  squares of the per-position means, after removing the global mean, over the total sum of squares).
- :func:`linear_cka`: linear CKA between hidden states and the position embeddings of their positions.
- :func:`sample_pairs` / :func:`pair_features`: ordered token pairs within a sequence for the relative-order
  probes (is j before i; ``|i - j|`` bucket), on ``[h_i; h_j]`` or ``h_i - h_j``.
- :func:`table_pairs`: the same pairs over the rows of a position-embedding table, grouped so that no
  position is shared between folds.

Intervals resample windows (the grouping unit), never tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from bertscope.probes.bootstrap import group_bootstrap
from einops import rearrange

# ----------------------------------------------------------------------------------- probe-free measures


def variance_share(
    grid: np.ndarray, *, n_boot: int = 200, ci: float = 0.95, seed: int = 0
) -> dict[str, float]:
    """Share of hidden-state variance explained by position, with a window-bootstrap interval.

    ``grid`` is ``[window, pos, d]`` (every window has every position once). The plain statistic
    (``raw``) is ``sum_p n_p ||mean_p - mean||^2 / sum_t ||h_t - mean||^2``; it is biased upwards by the
    sampling noise of the per-position means (about ``(P - 1) / (N - 1)`` when position and activation are
    independent). ``value`` is the variance-components estimate that removes that noise:
    ``s_b / (s_b + s_w)``, with ``s_w`` the within-position variance (unbiased, weighted) and ``s_b`` the
    between-position variance minus the noise the means carry; it is 0 in expectation without positional
    signal and ``var_table / (var_table + var_noise)`` for ``h = table[p] + noise``. The bootstrap
    resamples windows. Returns ``{"value", "ci_low", "ci_high", "raw"}`` (NaN interval when ``n_boot == 0``).
    """
    grid = _check_grid(grid)
    n_win, n_pos, _ = grid.shape
    flat = rearrange(grid, "w p d -> w (p d)")
    sq = np.einsum("wpd,wpd->w", grid, grid)  # per-window sum of squared norms

    def shares(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # counts [B, W] -> raw, corrected [B]
        c_tot = counts.sum(1)
        k = (counts**2).sum(1) / c_tot  # effective-size term of weighted means (1 without duplicates)
        means = rearrange(counts @ flat / c_tot[:, None], "b (p d) -> b p d", p=n_pos)
        grand = means.mean(1)  # [B, d]; positions are balanced, so this is the global mean
        ss_between = c_tot * ((means - grand[:, None]) ** 2).sum((1, 2))
        ss_total = counts @ sq - c_tot * n_pos * (grand**2).sum(1)
        within = (ss_total - ss_between) / (n_pos * (c_tot - k))  # unbiased noise variance per token
        between = (ss_between - (n_pos - 1) * k * within) / (c_tot * n_pos)
        return ss_between / ss_total, between / (between + within)

    raw, value = (float(v[0]) for v in shares(np.ones((1, n_win))))
    out = group_bootstrap(lambda c: shares(c)[1], n_win, n_boot=n_boot, level=ci, seed=seed, max_cells=50 * n_win)
    low, high = float(out.low), float(out.high)
    return {"value": value, "ci_low": low, "ci_high": high, "raw": raw}


def linear_cka(
    grid: np.ndarray, table: np.ndarray, *, n_groups: int = 32, ci: float = 0.95
) -> dict[str, float]:
    """Linear CKA between hidden states and the position embeddings of their positions.

    ``grid`` is ``[window, pos, d]``; ``table`` is ``[pos, d_table]``, the embedding row of each content
    position (the same for every window). CKA = ``||Xc^T Yc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)`` with
    column-centred X (hidden states) and Y (their positions' rows): 1 when X is a rotation/scaling of Y,
    small (not 0: linear CKA is biased upwards in finite samples) when unrelated, so read it against the
    permuted-position baseline. The interval is a normal delete-a-group jackknife over ``n_groups`` groups of
    windows (a bootstrap would duplicate windows, which inflates CKA). Returns ``{"value", "ci_low",
    "ci_high"}``.
    """
    grid = _check_grid(grid)
    table = np.asarray(table, dtype=np.float64)
    if table.ndim != 2 or table.shape[0] != grid.shape[1]:
        raise ValueError(f"table must be [{grid.shape[1]}, d] (one row per window position), got {table.shape}")
    n_win, n_pos, d = grid.shape
    yc = table - table.mean(0)
    yty = np.linalg.norm(yc.T @ yc)  # for one window; the count scales it and cancels in the ratio
    # sufficient statistics per jackknife group of windows (the unit the jackknife deletes): window counts,
    # per-position sums [G, p*d] and Gram matrices [G, d*d] (float32 products, summed in float64)
    n_units = min(n_groups, n_win)
    group = np.arange(n_win) * n_units // n_win  # contiguous groups, as `_jackknife` deletes them
    windows = np.bincount(group, minlength=n_units).astype(np.float64)
    flat = rearrange(grid, "w p d -> w (p d)")
    sums_g = np.stack([flat[group == g].sum(0) for g in range(n_units)])
    g32 = rearrange(grid.astype(np.float32), "w p d -> w (p d)")
    gram = np.stack([_gram(rearrange(g32[group == g], "w (p d) -> (w p) d", p=n_pos)) for g in range(n_units)])

    def cka(counts: np.ndarray) -> np.ndarray:  # counts [B, G] weights of the groups -> [B]
        c_tot = counts @ windows
        sums = rearrange(counts @ sums_g, "b (p d) -> b d p", p=n_pos)  # per-position sums over windows
        mean = sums.sum(2) / (c_tot * n_pos)[:, None]  # [B, d]
        xtx = rearrange(counts @ gram, "b (d e) -> b d e", d=d)
        xtx -= (c_tot * n_pos)[:, None, None] * mean[:, :, None] * mean[:, None, :]
        # sum_t (x_t - mean)^T yc_t = sum_t x_t^T yc_t, because yc sums to zero over every window
        xty = np.matmul(sums, yc)  # [B, d, d_table]
        return (xty**2).sum((1, 2)) / (np.linalg.norm(xtx, axis=(1, 2)) * c_tot * yty)

    value = float(cka(np.ones((1, n_units)))[0])
    low, high = _jackknife(cka, value, n_units, n_units, ci)
    return {"value": value, "ci_low": low, "ci_high": high}


def _gram(x: np.ndarray) -> np.ndarray:
    """``x^T x`` of ``x [n, d]`` (float32 product) as a flat float64 ``[d * d]``."""
    return (x.T @ x).astype(np.float64).reshape(-1)


def permute_positions(grid: np.ndarray, seed: int = 0) -> np.ndarray:
    """The grid with positions permuted independently inside each window: the no-position baseline for
    the probe-free measures (same vectors, same windows, position labels broken)."""
    rng = np.random.default_rng(seed)
    return np.stack([w[rng.permutation(len(w))] for w in grid])


# ----------------------------------------------------------------------------------------------- pairs


@dataclass(frozen=True)
class Pairs:
    """Ordered position pairs ``(i, j)`` inside sequence ``seq`` (all ``[n_pairs]`` int arrays).

    ``before`` is 1 when j comes before i; ``bucket`` is ``floor(log2 |i - j|)``.
    """

    seq: np.ndarray
    i: np.ndarray
    j: np.ndarray

    @property
    def before(self) -> np.ndarray:
        return (self.j < self.i).astype(np.int64)

    @property
    def bucket(self) -> np.ndarray:
        return distance_bucket(np.abs(self.i - self.j))


def distance_bucket(distance: np.ndarray) -> np.ndarray:
    """``floor(log2 d)`` for distances ``d >= 1``: 1 -> 0, 2-3 -> 1, 4-7 -> 2, ..."""
    distance = np.asarray(distance)
    if (distance < 1).any():
        raise ValueError("distance buckets need distances >= 1 (pairs of distinct positions)")
    return np.floor(np.log2(distance)).astype(np.int64)


def sample_pairs(n_seq: int, n_pos: int, per_seq: int, *, seed: int = 0) -> Pairs:
    """``per_seq`` ordered pairs in each of ``n_seq`` sequences of ``n_pos`` positions.

    Buckets are balanced (bucket uniform, then a distance uniform inside it, then a start uniform where the
    pair fits) and the order is a fair coin, so "j before i" and the bucket both have flat class priors.
    """
    if n_pos < 2:
        raise ValueError(f"pairs need at least 2 positions, got {n_pos}")
    rng = np.random.default_rng(seed)
    n = n_seq * per_seq
    n_buckets = int(distance_bucket(np.array([n_pos - 1]))[0]) + 1
    bucket = rng.integers(0, n_buckets, size=n)
    lo = 2**bucket
    hi = np.minimum(2 ** (bucket + 1) - 1, n_pos - 1)
    dist = lo + np.floor(rng.random(n) * (hi - lo + 1)).astype(np.int64)
    start = np.floor(rng.random(n) * (n_pos - dist)).astype(np.int64)
    flip = rng.random(n) < 0.5
    i = np.where(flip, start + dist, start)
    j = np.where(flip, start, start + dist)
    return Pairs(seq=np.repeat(np.arange(n_seq), per_seq), i=i, j=j)


def pair_features(grid: np.ndarray, pairs: Pairs, kind: str) -> np.ndarray:
    """Pair features from ``grid [seq, pos, d]``: ``"concat"`` -> ``[n_pairs, 2d]`` (``[h_i; h_j]``),
    ``"diff"`` -> ``[n_pairs, d]`` (``h_i - h_j``)."""
    hi, hj = grid[pairs.seq, pairs.i], grid[pairs.seq, pairs.j]
    if kind == "concat":
        return np.concatenate([hi, hj], axis=1)
    if kind == "diff":
        return hi - hj
    raise ValueError(f"pair feature kind must be 'concat' or 'diff', got {kind!r}")


def table_pairs(n_positions: int, n_groups: int, n_pairs: int, *, seed: int = 0) -> tuple[Pairs, np.ndarray]:
    """Ordered pairs of rows of a position table, with a group per pair so that grouped folds never share a
    position: positions are dealt at random into ``n_groups`` groups and both ends of a pair come from one
    group. Buckets are balanced as far as each group allows. Returns ``(pairs, groups [n_pairs])`` (the
    pairs' ``seq`` is 0)."""
    if n_positions < 2 * n_groups:
        raise ValueError(f"{n_positions} positions cannot be split into {n_groups} groups of at least 2")
    rng = np.random.default_rng(seed)
    group_of = rng.permutation(n_positions) % n_groups
    i_all, j_all, g_all = [], [], []
    for g in range(n_groups):
        members = np.flatnonzero(group_of == g)
        ii, jj = np.meshgrid(members, members, indexing="ij")
        keep = ii != jj
        ii, jj = ii[keep], jj[keep]
        buckets = distance_bucket(np.abs(ii - jj))
        per_bucket = max(1, n_pairs // (n_groups * (buckets.max() + 1)))
        for b in np.unique(buckets):
            idx = np.flatnonzero(buckets == b)
            take = rng.choice(idx, size=min(per_bucket, len(idx)), replace=False)
            i_all.append(ii[take])
            j_all.append(jj[take])
            g_all.append(np.full(len(take), g))
    i, j, groups = (np.concatenate(a).astype(np.int64) for a in (i_all, j_all, g_all))
    return Pairs(seq=np.zeros(len(i), dtype=np.int64), i=i, j=j), groups


# ------------------------------------------------------------------------------------------------- helpers


def _check_grid(grid: np.ndarray) -> np.ndarray:
    grid = np.asarray(grid, dtype=np.float64)
    if grid.ndim != 3:
        raise ValueError(f"grid must be [window, pos, d], got shape {grid.shape}")
    if grid.shape[0] < 2 or grid.shape[1] < 2:
        raise ValueError(f"grid needs at least 2 windows and 2 positions, got shape {grid.shape}")
    return grid


def _jackknife(stat, value: float, n_units: int, n_groups: int, ci: float) -> tuple[float, float]:
    """Normal interval ``value -/+ z * se`` from a delete-a-group jackknife of ``stat(counts [B, n_units])``
    over ``min(n_groups, n_units)`` contiguous groups of units."""
    from statistics import NormalDist

    n_groups = min(n_groups, n_units)
    if n_groups < 2:
        return float("nan"), float("nan")
    group = np.arange(n_units) * n_groups // n_units
    counts = (group[None, :] != np.arange(n_groups)[:, None]).astype(np.float64)
    values = stat(counts)
    se = float(np.sqrt((n_groups - 1) / n_groups * ((values - values.mean()) ** 2).sum()))
    z = NormalDist().inv_cdf(0.5 + ci / 2)
    return value - z * se, value + z * se
