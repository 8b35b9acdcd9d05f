"""Per-token Jacobian projections, the one mechanic behind integrated Jacobians, BiLRP and pairwise gradient x
input.

Each of the three writes the score as ``phi(a) . phi(b)`` (``phi`` the pooled embedding, divided by its norm for
cosine) and explains it with two ``[e, p]`` matrices, one per side,

    P[:, i] = (1/N) sum_n  J(x(alpha_n))[:, i, :] . dx_i          (J = d phi / d x, x the representation at the
                                                                   input of block ``layer``)

the change of ``phi`` that token i's part of ``dx`` causes, integrated along a path. Then ``matrix = P_a^T P_b``
``[p_a, p_b]``. Integrated Jacobians (Moeller et al. 2023): ``x(alpha) = r + alpha (x - r)``, ``dx = x - r``,
``alpha`` in ``{1, 1 - 1/N, ..., 1/N}`` (xsbert's ``interpolate_reference_embedding``: N points from the input
down, the reference itself excluded), so ``P_a 1 -> phi(a) - phi(r_a)`` and the matrix sums to the four-term
difference as N grows. Gradient x input: one point, ``alpha = 1``, ``r = 0``. BiLRP: gradient x input of the
model with LayerNorm scales, attention patterns and the MLP activation's gate held constant (see
``methods.bilrp``).

Each column of ``P`` is one forward-mode derivative (``torch.autograd.forward_ad``): a batch of ``N x p`` copies of
the sentence, copy ``(n, i)`` carrying the tangent ``dx`` at token i only. That is ``N p`` sequence passes per side
against ``e N`` backward passes for the full Jacobian (``e`` = 384 for the bundled model), batched by ``chunk``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.autograd.forward_ad as fwAD
from bertscope.hooks.similarity.pairs import embedding_from

RULES = ("xsbert", "trapezoid")


def alphas(steps: int, *, device: torch.device | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """xsbert's integration points ``[steps]``: ``1, 1 - 1/steps, ..., 1/steps`` (``torch.arange(1, 0, -1/N)``)."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    return torch.arange(steps, 0, -1, device=device, dtype=dtype or torch.float32) / steps


def quadrature(steps: int, rule: str, *, device: torch.device | None = None,
               dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(points, weights)`` of the path integral over ``alpha`` in [0, 1]. ``"xsbert"``: the paper code's right
    Riemann sum, ``alphas(steps)`` each weighted ``1/steps`` (error O(1/steps)); ``"trapezoid"``: the same points
    and ``alpha = 0``, the two ends weighted ``1/(2 steps)`` (error O(1/steps^2); one pass more)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    pts = alphas(steps, device=device, dtype=dtype)
    w = torch.full_like(pts, 1 / steps)
    if rule == "trapezoid":
        pts = torch.cat([pts, pts.new_zeros(1)])
        w = torch.cat([w, w.new_full((1,), 0.5 / steps)])
        w[0] = 0.5 / steps
    return pts, w


def projections(
    model: Any,
    x: torch.Tensor,
    r: torch.Tensor,
    mask: torch.Tensor,
    *,
    layer: int,
    pooling: str,
    kind: str,
    points: torch.Tensor,
    weights: torch.Tensor | None = None,
    hooks: Sequence[tuple[str, Callable]] = (),
    detach_norm: bool = False,
    chunk: int = 4096,
) -> torch.Tensor:
    """``P`` ``[b, e, p]`` (see the module docstring) for representations ``x`` and references ``r`` ``[b, p, m]``
    at the input of block ``layer``, averaged over ``points`` (the alphas). ``hooks``: forward hooks active during
    the passes (BiLRP's rules). ``chunk``: most token positions run at once (sequences x length). Zero on padding.
    """
    b, p, m = x.shape
    # an observed attention pattern makes every family take its explicit path (fused kernels have no forward AD)
    hooks = [("blocks.*.attn.hook_pattern", _observe), *hooks]
    dx = (x - r) * mask[..., None].to(x.dtype)
    out = []
    for row in range(b):
        n = int(mask[row].sum())
        pos = torch.nonzero(mask[row]).flatten()
        if int(pos[-1]) != n - 1:
            raise ValueError("pairwise attribution needs right padding (real tokens first in every row)")
        lin = mask[row, :n]
        xr, rr, dr = x[row, :n], r[row, :n], dx[row, :n]
        # copies (alpha, token): primal r + alpha dx, tangent dx at that token only
        w = weights if weights is not None else torch.full_like(points, 1 / len(points))
        grid = [(a, wt, i) for a, wt in zip(points.tolist(), w.tolist(), strict=True) for i in range(n)]
        acc = None
        per = max(1, chunk // max(n, 1))
        for start in range(0, len(grid), per):
            part = grid[start:start + per]
            a = torch.tensor([g[0] for g in part], device=x.device, dtype=x.dtype)[:, None, None]
            idx = torch.tensor([g[2] for g in part], device=x.device)
            wt = torch.tensor([g[1] for g in part], device=x.device, dtype=x.dtype)
            primal = rr[None] + a * (xr - rr)[None]
            tangent = torch.zeros_like(primal)
            tangent[torch.arange(len(part)), idx] = dr[idx]
            with torch.enable_grad(), fwAD.dual_level(), model.hooks(list(hooks)):
                dual = fwAD.make_dual(primal.requires_grad_(len(hooks) > 1), tangent)
                e = embedding_from(model, dual, lin[None].expand(len(part), n), layer, pooling, kind,
                                   detach_norm=detach_norm)
                d = fwAD.unpack_dual(e).tangent.detach()  # [copies, e]
            if acc is None:
                acc = x.new_zeros(n, d.shape[-1])
            acc.index_add_(0, idx, d * wt[:, None])
        cols = acc  # [n, e]
        full = x.new_zeros(p, cols.shape[-1])
        full[pos] = cols
        out.append(full.T)
    return torch.stack(out)


def _observe(t: torch.Tensor, hook: Any) -> None:
    """A hook that changes nothing (its presence selects the explicit attention path)."""
