"""Attention measures shared by the experiments (plain tensors in, tensors out; no model, no run context).

One set of names for what ``heads`` and ``same-token`` both measure on a pattern ``A [batch, head, query, key]``
(rows sum to 1 over real keys). Every mass is per query, ``[batch, head, query]``; each experiment chooses
which queries it averages over (``heads``: every real token; ``same-token``: content tokens) and how it
aggregates (per-sentence means or sums for the bootstrap in ``probes.bootstrap``).

- ``self_mass``: ``A[i, i]``;
- ``previous_mass`` / ``next_mass``: ``A[i, i-1]`` / ``A[i, i+1]`` (0 where the neighbour is outside the
  sequence); ``has_previous`` / ``has_next`` give the queries whose neighbour is in a token mask;
- ``key_mass``: mass on a set of keys, e.g. [CLS], [SEP], punctuation (``[batch, key]`` masks) or duplicates,
  the other positions holding the query's token (``[batch, query, key]`` masks, see ``copies``);
- value-norm weighting (Kobayashi et al. 2020, "Attention is Not Only a Weight"): the contribution of key ``j``
  to query ``i`` in head ``h`` is ``||A[i, j] f_h(x_j)||`` with ``f_h(x) = (x W_V[h] + b_V[h]) W_O[h]``, i.e.
  ``hook_v`` times ``W_O[h]`` (the head's value bias included; the shared output bias ``b_O`` is not, as in the
  paper's code, where it is added once after the heads are summed). ``value_norms`` gives ``||f_h(x_j)||``
  and ``norm_weighted`` the pattern ``A[i, j] ||f_h(x_j)||`` renormalised over keys, on which every mass
  above can be read again.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def self_mass(pattern: Tensor) -> Tensor:
    """``A[i, i]``: pattern ``[batch, head, query, key]`` -> ``[batch, head, query]``."""
    return pattern.diagonal(dim1=-2, dim2=-1)


def previous_mass(pattern: Tensor) -> Tensor:
    """``A[i, i-1]`` -> ``[batch, head, query]`` (0 for the first position)."""
    return F.pad(pattern.diagonal(offset=-1, dim1=-2, dim2=-1), (1, 0))


def next_mass(pattern: Tensor) -> Tensor:
    """``A[i, i+1]`` -> ``[batch, head, query]`` (0 for the last position)."""
    return F.pad(pattern.diagonal(offset=1, dim1=-2, dim2=-1), (0, 1))


def has_previous(tokens: Tensor) -> Tensor:
    """Queries in ``tokens [batch, pos]`` (bool) whose previous position is in ``tokens`` too -> ``[batch, pos]``."""
    return tokens & F.pad(tokens[:, :-1], (1, 0), value=False)


def has_next(tokens: Tensor) -> Tensor:
    """Queries in ``tokens [batch, pos]`` (bool) whose next position is in ``tokens`` too -> ``[batch, pos]``."""
    return tokens & F.pad(tokens[:, 1:], (0, 1), value=False)


def key_mass(pattern: Tensor, keys: Tensor) -> Tensor:
    """Mass each query puts on a set of keys -> ``[batch, head, query]``.

    keys: ``[batch, key]`` bool (the same keys for every query: [CLS], [SEP], punctuation, padding) or
    ``[batch, query, key]`` bool (per-query keys: the query's duplicates).
    """
    if keys.dim() == 2:
        return (pattern @ keys.to(pattern.dtype)[:, None, :, None]).squeeze(-1)
    return (pattern * keys[:, None]).sum(-1)  # faster on CPU than an einsum, which permutes into a batched matmul


def copies(input_ids: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """Duplicates among ``tokens [batch, pos]`` (bool): ``(duplicate, earlier)``, each ``[batch, query, key]``
    bool: key ``j != i`` holds the query's token id (``earlier``: and ``j < i``); both ends in ``tokens``."""
    pos = input_ids.shape[1]
    same = input_ids[:, :, None] == input_ids[:, None, :]
    pair = tokens[:, :, None] & tokens[:, None, :]
    other = ~torch.eye(pos, dtype=torch.bool, device=input_ids.device)
    duplicate = same & pair & other
    earlier = duplicate & torch.ones(pos, pos, dtype=torch.bool, device=input_ids.device).tril(-1)
    return duplicate, earlier


def value_norms(v: Tensor, W_O: Tensor) -> Tensor:
    """Kobayashi norms ``||f_h(x_j)|| = ||v_j W_O[h]||``.

    Args:
        v: ``[batch, pos, head, d_head]`` (``blocks.L.attn.hook_v``: ``x W_V + b_V``, bias included).
        W_O: ``[head, d_head, d_model]``.

    Returns:
        ``[batch, head, pos]``, in float64 when either input is float64, else float32.
    """
    if v.ndim != 4 or W_O.ndim != 3 or v.shape[2:] != W_O.shape[:2]:
        raise ValueError(
            f"value_norms needs v [batch, pos, head, d_head] and W_O [head, d_head, d_model] with matching "
            f"head and d_head; got v {tuple(v.shape)} and W_O {tuple(W_O.shape)}"
        )
    dtype = torch.float64 if torch.float64 in (v.dtype, W_O.dtype) else torch.float32
    f = torch.einsum("bphd,hdm->bhpm", v.detach().to(dtype), W_O.detach().to(device=v.device, dtype=dtype))
    return torch.linalg.vector_norm(f, dim=-1)


def norm_weighted(pattern: Tensor, norms: Tensor) -> Tensor:
    """Norm-weighted pattern ``A[i, j] ||f_h(x_j)||`` renormalised over keys.

    pattern ``[batch, head, query, key]``; norms ``[batch, head, key]`` (``value_norms``) -> ``[batch, head,
    query, key]``, each row summing to 1 (rows whose weighted mass is 0 stay 0).
    """
    if norms.shape != (pattern.shape[0], pattern.shape[1], pattern.shape[3]):
        raise ValueError(
            f"value_norms must be [batch, head, key] = {(pattern.shape[0], pattern.shape[1], pattern.shape[3])}"
            f" to match pattern {tuple(pattern.shape)}; got {tuple(norms.shape)}"
        )
    weighted = pattern * norms.to(pattern.dtype)[:, :, None, :]
    total = weighted.sum(-1, keepdim=True)
    return torch.where(total > 0, weighted / total.clamp(min=torch.finfo(total.dtype).tiny), 0.0)
