"""Distances between heads: the square root of the Jensen-Shannon divergence of their attention rows.

``sqrt(JSD)`` is a metric on distributions (Endres & Schindelin 2003); averaging it over the query tokens of
a sentence, and then over sentences, keeps the triangle inequality, so the head-by-head matrix is a true
(pseudo)metric that MDS and hierarchical clustering can use. Divergences are in bits, so distances are in [0, 1].
"""

from __future__ import annotations

import inspect

import numpy as np
import torch

_LN2 = float(np.log(2.0))


def sqrt_jsd(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``sqrt(JSD(p, q))`` in bits along the last dimension; ``p, q [..., k]`` rows summing to 1 -> ``[...]``."""
    p = p.to(torch.float64)
    q = q.to(torch.float64)
    m = 0.5 * (p + q)
    # JSD = H(m) - (H(p) + H(q)) / 2; identical rows give exactly 0 because m == p then.
    jsd = _entropy(m) - 0.5 * (_entropy(p) + _entropy(q))
    return torch.sqrt(jsd.clamp_min(0.0) / _LN2)


def head_distances(pattern: torch.Tensor, *, chunk: int = 16, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Mean over queries of ``sqrt(JSD)`` between every pair of heads, for ONE sentence.

    Args:
        pattern: ``[head, query, key]`` attention of the real tokens only (no padding), heads of all layers
            stacked (e.g. ``layer * n_heads`` of them).
        chunk: heads per block of the pairwise computation (bounds memory at ``chunk * head * q * k``).
        dtype: precision of the entropies (float32 by default: distances agree with float64 to about 1e-5,
            far inside their bootstrap intervals, at about a quarter of the cost); the query mean is float64.

    Only the pairs ``i <= j`` are computed (the distance is symmetric), block by block.

    Returns:
        ``[head, head]`` float64, symmetric, zero on the diagonal.
    """
    if pattern.ndim != 3 or pattern.shape[-1] != pattern.shape[-2]:
        raise ValueError(f"head_distances needs one sentence's pattern [head, query, key], got {tuple(pattern.shape)}")
    p = pattern.detach().to(dtype)
    n_heads = p.shape[0]
    h = _entropy(p)  # [head, query]
    out = torch.zeros(n_heads, n_heads, dtype=torch.float64)
    for start in range(0, n_heads, chunk):
        stop = min(start + chunk, n_heads)
        m = 0.5 * (p[start:stop, None] + p[None, start:])  # [c, head - start, q, k]
        jsd = _entropy(m) - 0.5 * (h[start:stop, None] + h[None, start:])
        block = torch.sqrt(jsd.clamp_min(0.0) / _LN2).double().mean(-1)  # [c, head - start]
        out[start:stop, start:] = block
        out[start:, start:stop] = block.T
    out = 0.5 * (out + out.T)  # exact symmetry inside the diagonal blocks despite rounding
    out.fill_diagonal_(0.0)
    return out


def within_between_ratio(distances: np.ndarray, layer_of: np.ndarray) -> dict[int | None, float]:
    """Mean distance within a layer divided by mean distance between layers.

    Args:
        distances: ``[head, head]`` (all layers' heads).
        layer_of: ``[head]`` layer index of each head.

    Returns:
        ``{None: overall ratio, L: ratio for layer L}``; for layer ``L`` the between part is the distance
        from ``L``'s heads to every other layer's heads. Below 1: heads of a layer resemble each other.
    """
    d = np.asarray(distances, dtype=np.float64)
    layers = np.asarray(layer_of)
    if d.ndim != 2 or d.shape[0] != d.shape[1] or d.shape[0] != len(layers):
        raise ValueError(f"distances must be [head, head] matching layer_of [head]; got {d.shape} and {layers.shape}")
    same = layers[:, None] == layers[None, :]
    off_diag = ~np.eye(len(layers), dtype=bool)
    out: dict[int | None, float] = {None: _ratio(d, same & off_diag, ~same)}
    for layer in np.unique(layers):
        rows = (layers == layer)[:, None]
        out[int(layer)] = _ratio(d, rows & same & off_diag, rows & ~same)
    return out


def mds_embedding(distances: np.ndarray, *, seed: int = 0, n_components: int = 2) -> np.ndarray:
    """Metric MDS of a precomputed distance matrix (``sklearn.manifold.MDS``, seeded) -> ``[head, n_components]``."""
    from sklearn.manifold import MDS

    params = inspect.signature(MDS).parameters
    kwargs: dict = {"n_components": n_components, "random_state": seed, "n_init": 4}
    if "metric_mds" in params:  # scikit-learn >= 1.8 renamed dissimilarity -> metric
        kwargs.update(metric="precomputed", metric_mds=True, init="random")
    else:
        kwargs.update(dissimilarity="precomputed")
    return MDS(**kwargs).fit_transform(np.asarray(distances, dtype=np.float64))


# ----------------------------------------------------------------------------------------------- helpers


def _entropy(p: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats along the last dimension (``0 log 0 = 0``)."""
    return -torch.special.xlogy(p, p).sum(-1)


def _ratio(d: np.ndarray, within: np.ndarray, between: np.ndarray) -> float:
    if not within.any() or not between.any():
        return float("nan")
    return float(d[within].mean() / d[between].mean())
