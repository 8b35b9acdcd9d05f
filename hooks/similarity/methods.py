"""The built-in pairwise attribution methods: one function and one ``register`` each (the table:
``bertscope.hooks.similarity.table``).

Every function takes ``(model, pair, **options)`` and returns ``(matrix [b, p_a, p_b], target [b], reference)``;
``matrix`` is zero on padding. Conventions shared by all: the representation attributed is the input of block
``layer`` (``blocks.{layer}.hook_resid_pre``; 0 = the embedding output, one vector per word piece), the score
vector ``phi`` is the pooled embedding (divided by its norm for cosine), references are xsbert's (see
``pairs.REFERENCE``).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch
from bertscope.hooks.similarity import jacobians
from bertscope.hooks.similarity.pairs import (
    REFERENCE,
    Pair,
    Side,
    embedding_from,
    embeddings,
    reference_ids,
    representation,
)
from bertscope.hooks.similarity.table import PairMethod, register
from einops import einsum, repeat


def xsbert_layer(n_layers: int) -> int:
    """Integrated Jacobians' default block: the one whose input xsbert's published examples attribute to, scaled to
    the model's depth. Both of its demos (``demo_shelf_model.ipynb``, ``demo_exact_model.ipynb``) call
    ``init_attribution_to_layer(idx=10, N_steps=50)`` on 12-layer encoders, so the last 2 of 12 blocks run on the
    path; here ``round(10 n_layers / 12)``, at most ``n_layers - 1`` (5 for the bundled 6-layer model, 10 for
    bert-base). The EACL 2024 follow-up (Moeller et al., Approximate Attributions for Off-the-Shelf Siamese
    Transformers) finds the attributions of off-the-shelf models trustworthy at such deep layers."""
    return max(0, min(n_layers - 1, round(10 * n_layers / 12)))


def _check_layer(model: Any, layer: int) -> int:
    n = int(model.config.n_layers)
    ok = isinstance(layer, numbers.Integral) and not isinstance(layer, bool) and 0 <= int(layer) < n
    if not ok:
        raise ValueError(f"layer must be a block index from 0 to {n - 1}, got {layer!r}")
    return int(layer)


def _sides(model: Any, pair: Pair, layer: int) -> list[tuple[Side, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(side, x, r, ref_ids)`` of a and b: the representation at block ``layer``'s input and the reference's."""
    _check_layer(model, layer)
    out = []
    for s in (pair.a, pair.b):
        ref = reference_ids(model, s)
        out.append((s, representation(model, s.ids, s, layer), representation(model, ref, s, layer), ref))
    return out


def _four_term(model: Any, pair: Pair, refs: list[torch.Tensor]) -> torch.Tensor:
    """``s(a,b) - s(r_a,b) - s(a,r_b) + s(r_a,r_b)`` ``[b]`` = ``(phi(a) - phi(r_a)) . (phi(b) - phi(r_b))``."""
    da = embeddings(model, pair.a.ids, pair.a, pair.pooling, pair.kind) - embeddings(
        model, refs[0], pair.a, pair.pooling, pair.kind)
    db = embeddings(model, pair.b.ids, pair.b, pair.pooling, pair.kind) - embeddings(
        model, refs[1], pair.b, pair.pooling, pair.kind)
    return (da * db).sum(-1)


def pair_score(model: Any, pair: Pair) -> torch.Tensor:
    """The model's score of each pair ``[b]``."""
    ea = embeddings(model, pair.a.ids, pair.a, pair.pooling, pair.kind)
    eb = embeddings(model, pair.b.ids, pair.b, pair.pooling, pair.kind)
    return (ea * eb).sum(-1)


def _outer(pa: torch.Tensor, pb: torch.Tensor) -> torch.Tensor:
    return einsum(pa, pb, "b e i, b e j -> b i j")


# ====================================================================== integrated Jacobians
def integrated_jacobians(model: Any, pair: Pair, *, steps: int = 50, layer: int | None = None,
                         rule: str = "simpson", chunk: int = 4096):
    """Integrated Jacobians (Moeller, Nikolaev and Pado, EMNLP 2023; ``lucasmllr/xsbert``
    ``XSTransformer.explain_similarity``): ``A = (J_a dx_a)^T (J_b dx_b)`` with ``J`` the Jacobian of ``phi``
    integrated over ``steps`` points ``alpha = 1, 1 - 1/N, ..., 1/N`` between the reference and the input at
    block ``layer``'s input (default ``xsbert_layer``: the depth of xsbert's examples, block 5 of the bundled
    model; ``layer=0`` attributes to the embedding output). Sums to ``s(a,b) - s(r_a,b) - s(a,r_b) + s(r_a,r_b)``
    as ``steps`` grows.

    One difference from xsbert, stated: for cosine xsbert differentiates the unnormalised embedding and divides
    by the input embeddings' norms, which is exact only for its fine-tuned models; here ``phi`` is the normalised
    embedding, so the four-term identity holds for any model in the limit (for ``score="dot"`` the two agree).
    ``rule="xsbert"`` is the paper code's right Riemann sum over its points (pinned against a copy of its code in
    the tests); ``"trapezoid"`` adds the ``alpha = 0`` point and halves the end weights (error O(1/steps^2));
    the default ``"simpson"`` weights the same ``steps + 1`` points by Simpson's rule (error O(1/steps^4), the
    same cost as the trapezoid; measured in ``docs/similarity.md``)."""
    layer = xsbert_layer(int(model.config.n_layers)) if layer is None else layer
    (sa, xa, ra, refa), (sb, xb, rb, refb) = _sides(model, pair, layer)
    points, weights = jacobians.quadrature(steps, rule, device=xa.device, dtype=xa.dtype)
    kw = {"layer": layer, "pooling": pair.pooling, "kind": pair.kind, "points": points, "weights": weights,
          "chunk": chunk}
    pa = jacobians.projections(model, xa, ra, sa.mask, **kw)
    pb = jacobians.projections(model, xb, rb, sb.mask, **kw)
    return _outer(pa, pb), _four_term(model, pair, [refa, refb]), f"{REFERENCE}; integrated at block {layer}'s input"


# ====================================================================== gradient x input
def grad_x_input(model: Any, pair: Pair, *, layer: int = 0, chunk: int = 4096):
    """Pairwise gradient x input: ``A = (J_a x_a)^T (J_b x_b)``, the Jacobian of ``phi`` at the input itself
    (integrated Jacobians with one point and a zero reference; Eberle et al. 2022's "Hessian x product" for a
    dot-product model). Target: the score (the sum equals it only for a model linear in ``x``)."""
    (sa, xa, _, _), (sb, xb, _, _) = _sides(model, pair, layer)
    one = torch.ones(1, device=xa.device, dtype=xa.dtype)
    kw = {"layer": layer, "pooling": pair.pooling, "kind": pair.kind, "points": one, "chunk": chunk}
    pa = jacobians.projections(model, xa, torch.zeros_like(xa), sa.mask, **kw)
    pb = jacobians.projections(model, xb, torch.zeros_like(xb), sb.mask, **kw)
    return _outer(pa, pb), pair_score(model, pair), f"zero vector at block {layer}'s input (no reference pass)"


# ====================================================================== BiLRP
def lrp_hooks(model: Any) -> list[tuple[str, Callable]]:
    """The forward hooks that turn gradient x input into the LRP rules BiLRP uses (Ali et al. 2022, as adopted by
    Vasileiou and Eberle 2024): every LayerNorm's scale held constant (LN rule), every attention pattern held
    constant (AH rule), the MLP activation as a constant gate (``gelu(a) = a * [gelu(a)/a]`` with the bracket held
    constant, the identity/ratio rule; in gated MLPs, ModernBERT's, ``act(a)`` of ``act(a) * g`` held constant).
    The model is then linear in its input up to the biases, which keep the relevance they receive: the
    conservation error."""
    names = set(model.hook_names())
    stored: dict[str, torch.Tensor] = {}

    def detach(t: torch.Tensor, hook: Any) -> torch.Tensor:
        return t.detach()

    def keep_pre(t: torch.Tensor, hook: Any) -> None:
        stored[hook.name.rsplit(".", 1)[0]] = t

    def ratio(t: torch.Tensor, hook: Any) -> torch.Tensor:
        a = stored.pop(hook.name.rsplit(".", 1)[0])
        safe = torch.where(a.abs() > 1e-12, a, torch.ones_like(a))
        gate = torch.where(a.abs() > 1e-12, t / safe, torch.zeros_like(a)).detach()
        return a * gate

    hooks: list[tuple[str, Callable]] = []
    for name in names:
        if name.endswith("hook_scale") and not name.startswith("embed.") and "mlm_head" not in name:
            hooks.append((name, detach))
        elif name.endswith("attn.hook_pattern"):
            hooks.append((name, detach))
    for L in range(model.config.n_layers):
        mlp = f"blocks.{L}.mlp"
        if f"{mlp}.hook_gate" in names:
            hooks.append((f"{mlp}.hook_pre", detach))
        elif f"{mlp}.hook_pre" in names and f"{mlp}.hook_post" in names:
            hooks += [(f"{mlp}.hook_pre", keep_pre), (f"{mlp}.hook_post", ratio)]
    return hooks


def bilrp(model: Any, pair: Pair, *, layer: int = 0, chunk: int = 4096):
    """BiLRP (Eberle et al. 2022; for transformers' similarity Vasileiou and Eberle, NAACL 2024): second-order
    relevance ``R[i, j] = sum_e R_a^e[i] R_b^e[j]`` with ``R^e`` the LRP relevance of embedding dimension ``e``,
    computed as gradient x input under the rules of ``lrp_hooks`` (LN and AH rules of Ali et al. 2022), the cosine's
    norms held constant. Target: the score; the error is the relevance the biases absorb."""
    (sa, xa, _, _), (sb, xb, _, _) = _sides(model, pair, layer)
    one = torch.ones(1, device=xa.device, dtype=xa.dtype)
    kw = {"layer": layer, "pooling": pair.pooling, "kind": pair.kind, "points": one, "chunk": chunk,
          "hooks": lrp_hooks(model), "detach_norm": True}  # fmt: skip
    pa = jacobians.projections(model, xa, torch.zeros_like(xa), sa.mask, **kw)
    pb = jacobians.projections(model, xb, torch.zeros_like(xb), sb.mask, **kw)
    return _outer(pa, pb), pair_score(model, pair), f"zero vector at block {layer}'s input (LRP: no reference)"


# ====================================================================== integrated gradients on each side
def _side_ig(model: Any, pair: Pair, s: Side, x: torch.Tensor, r: torch.Tensor, other: torch.Tensor,
             layer: int, steps: int, rule: str = "simpson") -> torch.Tensor:
    """Integrated gradients ``[b, p]`` of ``phi(side) . other`` over side ``s``'s tokens (``other`` ``[b, e]``
    fixed), on xsbert's points weighted by ``rule`` (``jacobians.quadrature``)."""
    points, weights = jacobians.quadrature(steps, rule, device=x.device, dtype=x.dtype)
    n = len(points)
    dx = (x - r) * s.mask[..., None].to(x.dtype)
    path = (repeat(r, "b p m -> (b n) p m", n=n) + points.repeat(x.shape[0])[:, None, None]
            * repeat(dx, "b p m -> (b n) p m", n=n)).requires_grad_()  # fmt: skip
    with torch.enable_grad():
        e = embedding_from(model, path, repeat(s.mask, "b p -> (b n) p", n=n), layer, pair.pooling, pair.kind)
        total = (e * repeat(other, "b e -> (b n) e", n=n)).sum()
        (grad,) = torch.autograd.grad(total, path)
    mean = einsum(grad.reshape(x.shape[0], n, *x.shape[1:]), weights, "b n p m, n -> b p m")
    return (mean * dx).sum(-1)


def ig_sides(model: Any, pair: Pair, *, steps: int = 50, layer: int = 0, rule: str = "simpson"):
    """Integrated gradients on each side (Sundararajan et al. 2017, xsbert's reference and points): ``ig_a`` of
    ``s(., b)`` over a's tokens with b fixed, ``ig_b`` likewise; ``matrix[i, j] = (ig_a[i] / n_b + ig_b[j] / n_a)
    / 2``. Target: ``(s(a,b) - s(r_a,b) + s(a,b) - s(a,r_b)) / 2``, reached as ``steps`` grows. ``rule``: the
    path quadrature (``jacobians.quadrature``; default Simpson's, as integrated Jacobians'; ``"xsbert"`` is the
    right Riemann sum of Sundararajan et al.'s paper and Captum's ``riemann_right``)."""
    (sa, xa, ra, refa), (sb, xb, rb, refb) = _sides(model, pair, layer)
    ea = embeddings(model, sa.ids, sa, pair.pooling, pair.kind)
    eb = embeddings(model, sb.ids, sb, pair.pooling, pair.kind)
    ig_a = _side_ig(model, pair, sa, xa, ra, eb, layer, steps, rule)
    ig_b = _side_ig(model, pair, sb, xb, rb, ea, layer, steps, rule)
    na, nb = sa.mask.sum(-1, keepdim=True).to(xa.dtype), sb.mask.sum(-1, keepdim=True).to(xa.dtype)
    ma, mb = sa.mask.to(xa.dtype), sb.mask.to(xa.dtype)
    matrix = ((ig_a / nb)[:, :, None] * mb[:, None, :] + ma[:, :, None] * (ig_b / na)[:, None, :]) / 2
    score = (ea * eb).sum(-1)
    rab = (embeddings(model, refa, sa, pair.pooling, pair.kind) * eb).sum(-1)
    arb = (ea * embeddings(model, refb, sb, pair.pooling, pair.kind)).sum(-1)
    return matrix, (2 * score - rab - arb) / 2, f"{REFERENCE}; one side at a time, the other fixed"


# ====================================================================== pair occlusion
def _left_out(model: Any, s: Side, pair: Pair) -> tuple[torch.Tensor, list[int]]:
    """``[sum of lengths, e]``: each row's score vector with one real token left out (its attention-mask entry
    zeroed: no token attends to it and the pooling skips it), rows in order, tokens in order."""
    rows, masks = [], []
    for row, n in enumerate(s.lengths):
        m = s.mask[row].repeat(n, 1)
        m[torch.arange(n), torch.arange(n)] = 0
        rows += [row] * n
        masks.append(m)
    idx = torch.tensor(rows, device=s.ids.device)
    sub = Side(s.ids[idx], s.mask[idx], None if s.types is None else s.types[idx], [])
    return embeddings(model, sub.ids, sub, pair.pooling, pair.kind, mask=torch.cat(masks)), s.lengths


def occlusion(model: Any, pair: Pair):
    """Pair occlusion: ``matrix[i, j] = s(a, b) - s(a without token i, b without token j)``, a token left out by
    zeroing its attention-mask entry (nothing attends to it, the pooling skips it). ``p_a + p_b`` forward passes
    per pair. Target: the score (occlusion has no completeness; the error only says how far the sum is from it)."""
    score = pair_score(model, pair)
    ea, la = _left_out(model, pair.a, pair)
    eb, lb = _left_out(model, pair.b, pair)
    out = score.new_zeros(len(la), pair.a.ids.shape[1], pair.b.ids.shape[1])
    oa = ob = 0
    for row, (na, nb) in enumerate(zip(la, lb, strict=True)):
        out[row, :na, :nb] = score[row] - ea[oa:oa + na] @ eb[ob:ob + nb].T
        oa, ob = oa + na, ob + nb
    return out, score, "each token left out (attention-mask entry zeroed), one on each side"


register(PairMethod("integrated-jacobians", integrated_jacobians,
                    "Moeller, Nikolaev and Pado, An Attribution Method for Siamese Encoders, EMNLP 2023 "
                    "(code: lucasmllr/xsbert)", {"steps": 50, "layer": None, "rule": "simpson", "chunk": 4096},
                    "costly", "limit",
                    "integrated Jacobians: token-pair matrix summing to the four-term difference"))
register(PairMethod("bilrp", bilrp, "Vasileiou and Eberle, Explaining Text Similarity in Transformer Models, NAACL "
                    "2024; Eberle et al., TPAMI 2022 (BiLRP); LN/AH rules of Ali et al., ICML 2022",
                    {"layer": 0, "chunk": 4096}, "costly", "no",
                    "second-order LRP relevance of token pairs (LN and AH rules)"))
register(PairMethod("grad-x-input", grad_x_input, "Eberle et al., Building and Interpreting Deep Similarity Models, "
                    "TPAMI 2022 (Hessian x product)", {"layer": 0, "chunk": 4096}, "costly", "no",
                    "pairwise gradient x input: (J_a x_a)^T (J_b x_b)"))
register(PairMethod("integrated-gradients", ig_sides, "Sundararajan, Taly and Yan, Axiomatic Attribution for Deep "
                    "Networks, ICML 2017 (each side, the other fixed)", {"steps": 50, "layer": 0, "rule": "simpson"},
                    "cheap", "limit", "integrated gradients on each side, combined additively"))
register(PairMethod("occlusion", occlusion, "leave one token out on each side (Zeiler and Fergus 2014, pairwise)",
                    {}, "costly", "no", "score drop when one token of each side is left out"))
