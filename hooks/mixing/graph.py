"""Attention rollout and attention flow over layers (Abnar & Zuidema 2020), for any per-layer mixing method.

Each layer's matrix ``C_L`` ``[batch, query, key]`` is first made row-stochastic over real keys:

- methods that leave the residual out (``attention``, ``attention_norm``): ``0.5 * C + 0.5 * I`` after
  normalising the rows of ``C`` (Abnar & Zuidema's ``A = 0.5 W_att + 0.5 I``; their code and
  mt-upc/transformer-contributions' ``compute_rollout`` write it as ``(C + I) / rowsum``, the same thing for
  row-stochastic C);
- methods that already contain the residual (``residual_norm``, ``alti``, ``value_zeroing``; ``with_residual``
  in the method table): rows normalised, no identity added (mt-upc's ``compute_joint_attention``;
  ValueZeroing's ``res=False``).

Rollout: ``R_0 = C_0``, ``R_L = C_L @ R_{L-1}``.

Flow: the layered graph of samiraabnar/attention_flow (``get_adjmat``): node ``(L, i)`` for ``L = 0..n_layers``,
an edge ``(L+1, i) -> (L, j)`` of capacity ``C_L[i, j]``; ``flow[L, i, j]`` is the maximum flow from
``(L+1, i)`` to input node ``(0, j)``, normalised over j (their ``compute_flows``). Solved by
``scipy.sparse.csgraph.maximum_flow`` (Dinic), which needs integer capacities: they are scaled by ``2**20``
and rounded (each capacity within ``2**-21``; the test against networkx on float capacities agrees to 1e-5).
Cost: ``n_layers * n^2`` max-flow problems per sentence on a graph of ``(L+2) n`` nodes and ``(L+1) n^2``
edges; about a second for n = 16 and 6 layers, growing like n^4: hence ``max_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from bertscope.hooks.mixing import table

FLOW_SCALE = 2**20


def layer_matrices(per_layer: torch.Tensor, mask: torch.Tensor, method: str) -> torch.Tensor:
    """Row-stochastic per-layer matrices ``[batch, layer, query, key]`` (see the module docstring)."""
    real = mask.to(per_layer.dtype)
    c = per_layer * real[:, None, :, None] * real[:, None, None, :]
    c = c / c.sum(-1, keepdim=True).clamp_min(1e-30)
    if not table.with_residual(method):
        eye = torch.diag_embed(real)[:, None]  # identity on real tokens only
        c = 0.5 * c + 0.5 * eye
    return c


def rollout(per_layer: torch.Tensor, mask: torch.Tensor, method: str) -> torch.Tensor:
    """``R_L = C_L @ ... @ C_0`` ``[batch, layer, query, key]`` for every layer from 0."""
    c = layer_matrices(per_layer, mask, method)
    out = [c[:, 0]]
    for L in range(1, c.shape[1]):
        out.append(torch.matmul(c[:, L], out[-1]))
    return torch.stack(out, dim=1)


def flow(
    per_layer: torch.Tensor, mask: torch.Tensor, method: str, *, layers: Sequence[int], max_tokens: int = 48
) -> torch.Tensor:
    """Attention flow ``[batch, len(layers), query, key]`` for the chosen output ``layers``."""
    n_real = int(mask.sum(-1).max())
    if n_real > max_tokens:
        raise ValueError(
            f"flow over {n_real} tokens would solve {len(layers)} x {n_real}^2 max-flow problems per sentence on a "
            f"graph with ~{n_real**2} edges per layer; raise max_flow_tokens (now {max_tokens}) if you mean it, "
            "or use rollout"
        )
    c = layer_matrices(per_layer, mask, method).double().cpu().numpy()
    out = np.zeros((c.shape[0], len(layers), c.shape[2], c.shape[3]))
    for b in range(c.shape[0]):
        real = np.flatnonzero(mask[b].cpu().numpy())
        for slot, L in enumerate(layers):
            out[b, slot][np.ix_(real, real)] = flow_matrix(c[b, : L + 1][:, real][:, :, real])
    return torch.from_numpy(out).to(per_layer.dtype).to(per_layer.device)


def flow_matrix(caps: np.ndarray) -> np.ndarray:
    """``[query, key]`` max-flow from each top node to each input node through the layered graph.

    ``caps`` ``[layer, n, n]``: ``caps[L, i, j]`` is the capacity of edge ``(L+1, i) -> (L, j)``. Rows normalised.
    """
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_flow

    n_layers, n, _ = caps.shape
    rows, cols, vals = [], [], []
    for L in range(n_layers):
        i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        rows.append(((L + 1) * n + i).ravel())
        cols.append((L * n + j).ravel())
        vals.append(np.rint(caps[L] * FLOW_SCALE).astype(np.int32).ravel())
    size = (n_layers + 1) * n
    graph = csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(size, size))
    graph.eliminate_zeros()
    top = n_layers * n
    result = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            result[i, j] = maximum_flow(graph, top + i, j).flow_value / FLOW_SCALE
    total = result.sum(-1, keepdims=True)
    return np.divide(result, total, out=np.zeros_like(result), where=total > 0)
