"""Per-token Jacobian projections, the one mechanic behind integrated Jacobians, BiLRP and pairwise gradient x
input.

Each of the three writes the score as ``phi(a) . phi(b)`` (``phi`` the pooled embedding, divided by its norm for
cosine) and explains it with two ``[e, p]`` matrices, one per side,

    P[:, i] = (1/N) sum_n  J(x(alpha_n))[:, i, :] . dx_i          (J = d phi / d x, x the representation at the
                                                                   input of block ``layer``)

the change of ``phi`` that token i's part of ``dx`` causes, integrated along a path. Then ``matrix = P_a^T P_b``
``[p_a, p_b]``. Integrated Jacobians (Moeller et al. 2023): ``x(alpha) = r + alpha (x - r)``, ``dx = x - r``,
``alpha`` in ``{1, 1 - 1/N, ..., 1/N}`` (xsbert's ``interpolate_reference_embedding``: N points from the input
down, the reference itself excluded; the Simpson and trapezoid rules add ``alpha = 0``), so
``P_a 1 -> phi(a) - phi(r_a)`` and the matrix sums to the four-term difference as N grows. Gradient x input: one
point, ``alpha = 1``, ``r = 0``. BiLRP: gradient x input of the model with LayerNorm scales, attention patterns and
the MLP activation's gate held constant (see ``methods.bilrp``).

Each column of ``P`` is one forward-mode derivative along the tangent ``dx`` at token i only: per point, one
primal pass carries a batch of such tangents (``torch.func.vmap`` over ``torch.func.jvp``), so the primal
activations are computed once for all tokens: about ``N (1 + k)`` sequence passes per side for ``k`` moving tokens,
against ``e N`` backward passes for the full Jacobian (``e`` = 384 for the bundled model), in chunks of ``chunk``
token positions. Tokens whose path does not move (``dx_i = 0``) get a zero column without a pass. Runs whose hooks
replace a LayerNorm's scale (BiLRP) take ``torch.autograd.forward_ad`` on one copy of the sentence per tangent
instead (``_jvp_copies``: see ``projections``). The weights are the quadrature's (``quadrature``): ``1/N`` each for
xsbert's rule, Simpson's for the default.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.autograd.forward_ad as fwAD
from bertscope.hooks.similarity.pairs import embedding_from
from einops import einsum, rearrange, repeat

RULES = ("xsbert", "trapezoid", "simpson")


def alphas(steps: int, *, device: torch.device | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """xsbert's integration points ``[steps]``: ``1, 1 - 1/steps, ..., 1/steps`` (``torch.arange(1, 0, -1/N)``)."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    return torch.arange(steps, 0, -1, device=device, dtype=dtype or torch.float32) / steps


def quadrature(steps: int, rule: str, *, device: torch.device | None = None,
               dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(points, weights)`` of the path integral over ``alpha`` in [0, 1], the points in xsbert's order (from 1
    down). ``"xsbert"``: the paper code's right Riemann sum, ``alphas(steps)`` each weighted ``1/steps`` (error
    O(1/steps)); ``"trapezoid"``: the same points and ``alpha = 0``, the two ends weighted ``1/(2 steps)`` (error
    O(1/steps^2); one pass more); ``"simpson"``: the same ``steps + 1`` points with composite Simpson weights
    ``(1, 4, 2, ..., 4, 1) / (3 steps)`` (error O(1/steps^4); for odd ``steps`` the last three intervals take
    Simpson's 3/8 rule, and ``steps = 1`` is the trapezoid). The weights sum to 1 and integrate cubics exactly
    (Simpson)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    pts = alphas(steps, device=device, dtype=dtype)
    w = torch.full_like(pts, 1 / steps)
    if rule == "xsbert":
        return pts, w
    pts = torch.cat([pts, pts.new_zeros(1)])
    if rule == "trapezoid" or steps == 1:
        w = torch.cat([w, w.new_full((1,), 0.5 / steps)])
        w[0] = 0.5 / steps
        return pts, w
    return pts, _simpson_weights(steps).flip(0).to(pts)


def _simpson_weights(steps: int) -> torch.Tensor:
    """``[steps + 1]`` composite Simpson weights of the points ``alpha = k / steps``, k = 0 .. steps (float64):
    ``(1, 4, 2, 4, ..., 4, 1) h / 3`` on an even number of intervals, the last three intervals by the 3/8 rule
    ``(1, 3, 3, 1) 3 h / 8`` when ``steps`` is odd (``steps >= 2``)."""
    h = 1.0 / steps
    w = torch.zeros(steps + 1, dtype=torch.float64)
    even = steps if steps % 2 == 0 else steps - 3
    for k in range(0, even, 2):
        w[k:k + 3] += torch.tensor([1.0, 4.0, 1.0], dtype=torch.float64) * h / 3
    if even < steps:
        w[even:] += torch.tensor([1.0, 3.0, 3.0, 1.0], dtype=torch.float64) * 3 * h / 8
    return w


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
    at the input of block ``layer``, summed over ``points`` (the alphas) with ``weights`` (default ``1 / points``).
    ``hooks``: forward hooks active during the passes (BiLRP's rules). ``chunk``: most token positions run at once
    (primal and tangent copies x length; memory grows with it). Zero on padding and at tokens whose path does not
    move (``x_i = r_i``: the special tokens at block 0, which the reference keeps).
    """
    b, p, m = x.shape
    # an observed attention pattern makes every family take its explicit path (fused kernels have no forward AD)
    hooks = [("blocks.*.attn.hook_pattern", _observe), *hooks]
    # Rules that replace a LayerNorm's internals (BiLRP's) need its explicit path, which the model takes only for
    # inputs that require grad (the fused kernel's mean and scale carry no forward-mode derivative); inside
    # torch.func.jvp no input does, so those runs take forward_ad on copies of the primal (``_jvp_copies``).
    derivative = _jvp_copies if len(hooks) > 1 else _jvp_shared
    if len(hooks) == 1 and _FirstBlock.applies(model, layer):
        first = _FirstBlock(model, layer)
        hooks, derivative = hooks + first.hooks(), first.derivative
    w = weights if weights is not None else torch.full_like(points, 1 / len(points))
    dx = (x - r) * mask[..., None].to(x.dtype)
    out = x.new_zeros(b, m, p)
    with torch.no_grad(), model.hooks(list(hooks)):
        for row in range(b):
            n = int(mask[row].sum())
            if n == 0:
                continue
            if not bool(mask[row, :n].all()):
                raise ValueError("pairwise attribution needs right padding (real tokens first in every row)")
            moving = torch.nonzero(dx[row, :n].abs().amax(-1) > 0).flatten()
            if len(moving) == 0:
                continue

            def phi(z: torch.Tensor, lin: torch.Tensor = mask[row, :n]) -> torch.Tensor:
                m_ = lin.expand(z.shape[0], -1)
                return embedding_from(model, z, m_, layer, pooling, kind, detach_norm=detach_norm)

            out[row, :, moving] = _columns(phi, derivative, x[row, :n], r[row, :n], moving, points, w, chunk).T
    return out


class _FirstBlock:
    """``_jvp_shared``'s derivative for ``_columns``, with the Q/K/V projections of the first block on the path
    done once per token instead of once per position and point.

    Token i's tangent is non-zero at row i only, and so is its attention input's tangent (the attention input is
    the block input, or its row-wise LayerNorm in pre-LN blocks); the generic pass still projects every row at every
    point. Here the primal runs with no tangent, and the tangent enters through hooks of block ``layer``: the
    residual's (``dx`` added to ``hook_attn_out``, which the block adds to its input) and Q/K/V's (the projected
    row added to ``hook_q/k/v`` at row i), each an input of zero value carrying its tangent. Exactly
    ``_jvp_shared``'s derivative (a test checks them equal in float64); for the plain ``Block`` with projections
    (BERT, RoBERTa, XLM-R, DistilBERT, ALBERT, ELECTRA); the others take ``_jvp_shared``.
    """

    def __init__(self, model: Any, layer: int) -> None:
        self.layer, self.block = layer, model.blocks[layer]
        self.carry: dict[str, torch.Tensor] | None = None

    @staticmethod
    def applies(model: Any, layer: int) -> bool:
        """Whether block ``layer`` is the plain ``Block`` with Q/K/V projections (the hooks' meaning is known)."""
        from bertscope.models.encoder import Block

        blocks = getattr(model, "blocks", None)
        return blocks is not None and type(blocks[layer]) is Block and bool(blocks[layer].attn.projected)

    def hooks(self) -> list[tuple[str, Callable]]:
        """The injection hooks of block ``layer`` (inactive while ``carry`` is None)."""
        def add(key: str) -> Callable:
            def hook(t: torch.Tensor, _: Any) -> torch.Tensor:
                return t if self.carry is None else t + self.carry[key]
            return hook

        name = f"blocks.{self.layer}"
        return [(f"{name}.hook_attn_out", add("res")), (f"{name}.attn.hook_q", add("q")),
                (f"{name}.attn.hook_k", add("k")), (f"{name}.attn.hook_v", add("v"))]

    def _projected(self, primal: torch.Tensor, dx: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        """``[k, s, 3 m]``: the Q/K/V tangent of each token's row at each point (``primal`` ``[s, n, m]``)."""
        blk, s = self.block, primal.shape[0]
        if blk.post_ln:  # the attention reads the block input: the projected row is the same at every point
            return (dx[tok] @ blk.attn.qkv.weight.T)[:, None].expand(-1, s, -1)
        # pre-LN: the attention reads LN1(x), whose derivative depends on the point
        at = rearrange(primal[:, tok], "s k m -> k s m")
        rows = torch.func.jvp(blk.ln1, (at,), (dx[tok][:, None].expand(-1, s, -1).contiguous(),))[1]
        return rows @ blk.attn.qkv.weight.T

    def derivative(self, phi: Callable, primal: torch.Tensor, tangent: torch.Tensor, dx: torch.Tensor,
                   tok: torch.Tensor) -> torch.Tensor:
        """``[k, s, e]``: ``_jvp_shared(phi, primal, tangent)`` for the tangents ``_columns`` makes (``dx`` ``[n,
        m]`` at row ``tok[k]`` only), the Q/K/V rows projected once."""
        k, s, n, m = tangent.shape
        h = self.block.attn.n_heads
        idx = torch.arange(k)
        qkv = []
        for part in self._projected(primal, dx, tok).chunk(3, dim=-1):
            t = tangent.new_zeros(k, s, n, m)
            t[idx, :, tok] = part  # [k, s, m] at each token's own row
            qkv.append(rearrange(t, "k s n (h d) -> k s n h d", h=h))

        def carried(res: torch.Tensor, q: torch.Tensor, k_: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.carry = {"res": res, "q": q, "k": k_, "v": v}
            try:
                return phi(primal)
            finally:
                self.carry = None

        zeros = (primal.new_zeros(s, n, m), *(primal.new_zeros(s, n, h, m // h) for _ in range(3)))
        return torch.func.vmap(lambda *t: torch.func.jvp(carried, zeros, t)[1])(tangent, *qkv)


def _columns(phi: Callable, derivative: Callable, x: torch.Tensor, r: torch.Tensor, tokens: torch.Tensor,
             points: torch.Tensor, weights: torch.Tensor, chunk: int) -> torch.Tensor:
    """``[len(tokens), e]``: column ``P[:, i]`` of one text (``x``, ``r`` ``[n, m]``, no padding; ``phi``: its
    score vector ``[s, n, m] -> [s, e]``) for each token ``i`` in ``tokens``: the derivative of ``phi`` at the
    points ``r + alpha (x - r)`` along tangent k, ``x_i - r_i`` at token ``i = tokens[k]`` only, summed over the
    points with ``weights``. Points and tangents run in chunks of at most about ``chunk`` token positions.
    ``derivative(phi, primal [s, n, m], tangent [k, s, n, m], dx [n, m], tok [k]) -> [k, s, e]``."""
    n, m = x.shape
    dx = x - r
    per_tangent = max(1, min(len(tokens), chunk // n - 1))
    per_point = max(1, chunk // (n * (1 + per_tangent)))
    cols = x.new_zeros(len(tokens), m)
    for s0 in range(0, len(points), per_point):
        a, wt = points[s0:s0 + per_point].to(x), weights[s0:s0 + per_point].to(x)
        primal = r + a[:, None, None] * dx  # [s, n, m]
        for k0 in range(0, len(tokens), per_tangent):
            tok = tokens[k0:k0 + per_tangent]
            tangent = x.new_zeros(len(tok), len(a), n, m)
            tangent[torch.arange(len(tok)), :, tok] = dx[tok][:, None]
            cols[k0:k0 + len(tok)] += einsum(derivative(phi, primal, tangent, dx, tok), wt, "k s e, s -> k e")
    return cols


def _jvp_shared(phi: Callable, primal: torch.Tensor, tangent: torch.Tensor, *_: Any) -> torch.Tensor:
    """``[k, s, e]``: the derivative of ``phi`` at ``primal`` ``[s, n, m]`` along each of ``tangent``
    ``[k, s, n, m]``: ``torch.func.vmap`` over ``torch.func.jvp``, so the primal activations are computed once for
    all k tangents (the cost of a pass is about ``1 + k`` forward passes instead of ``2 k``)."""
    return torch.func.vmap(lambda t: torch.func.jvp(phi, (primal,), (t,))[1])(tangent)


def _jvp_copies(phi: Callable, primal: torch.Tensor, tangent: torch.Tensor, *_: Any) -> torch.Tensor:
    """``_jvp_shared`` with ``torch.autograd.forward_ad`` on k copies of the primal, each carrying one tangent, the
    copies requiring grad so that hooks may replace a LayerNorm's scale (BiLRP's LN rule)."""
    k, s = tangent.shape[:2]
    with torch.enable_grad(), fwAD.dual_level():
        copies = repeat(primal, "s n m -> (k s) n m", k=k).contiguous().requires_grad_()
        e = phi(fwAD.make_dual(copies, rearrange(tangent, "k s n m -> (k s) n m")))
        d = fwAD.unpack_dual(e).tangent.detach()
    return rearrange(d, "(k s) e -> k s e", k=k)


def _observe(t: torch.Tensor, hook: Any) -> None:
    """A hook that changes nothing (its presence selects the explicit attention path)."""
