"""The per-layer decompositions behind ``bertscope.hooks.mixing``: ``LayerParts`` and the methods computed on it.

``layer_methods(parts, methods)`` computes several methods of one layer in one pass over sentence chunks, so
the head vectors ``u``/``f`` (``[b, k, h, m]``, the costly intermediate) are built once per chunk and shared by
``residual_norm``, ``alti`` and the residual-norm mixing ratio. Definitions: ``bertscope.hooks.mixing``.

Shapes: ``b`` batch, ``h`` head, ``q``/``k`` query/key positions, ``m`` d_model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from einops import rearrange

#: What ``layer_methods`` computes: the per-layer methods it knows and the residual-norm mixing ratio.
KERNELS = ("attention", "attention_norm", "residual_norm", "alti", "ratio:residual_norm")


@dataclass
class LayerParts:
    """What one block's attention sublayer decomposes into (all detached, in the model's dtype).

    ``pattern`` ``[b, h, q, k]``; ``u`` ``[b, h, k, m]``: each head's transformed value ``f^h(x_k)``, and in a
    post-LN block already through the linear part of LN1 (``gamma * centre(.)``); ``r`` ``[b, q, m]``: the
    residual ``x_q`` (post-LN: ``gamma * centre(x_q)``); ``s`` ``[b, q, 1]``: the LN1 scale (1 in pre-LN);
    ``rest`` ``[b, q, m]``: what no token owns (post-LN: ``gamma * centre(b_O) / s + beta``; pre-LN: ``b_O``);
    ``output`` ``[b, q, m]``: the hooked output the parts rebuild (post-LN ``hook_resid_mid`` = LN1 output;
    pre-LN ``hook_resid_mid`` = ``resid_pre + attn_out``); ``f`` ``[b, h, k, m]``: ``f^h(x_k)`` before LN1;
    ``attn_sum`` ``[b, q, m]``: ``sum_h sum_k alpha^h_qk u^h_k``, read off ``hook_attn_out``.

    ``_collect`` leaves ``u`` and ``f`` None and stores their factors instead: the hooked values ``v``
    ``[b, k, h, d]`` and the per-head maps ``w_u``/``w_f`` ``[h, d, m]``; ``head_vectors`` then builds either for
    a few sentences at a time (``[b, k, h, m]`` is 38 MB per layer at 16 x 128 on the bundled model: built whole
    it costs a trip through main memory, built per sentence it stays in cache).
    """

    pattern: torch.Tensor
    f: torch.Tensor | None
    u: torch.Tensor | None
    r: torch.Tensor
    s: torch.Tensor
    rest: torch.Tensor
    output: torch.Tensor
    attn_sum: torch.Tensor | None = None
    v: torch.Tensor | None = None
    w_u: torch.Tensor | None = None
    w_f: torch.Tensor | None = None

    def head_vectors(self, kind: Literal["u", "f"], rows: slice = slice(None)) -> torch.Tensor:
        """``u`` or ``f`` of sentences ``rows``, key-major: ``[b', k, h, m]`` (contiguous)."""
        given = self.u if kind == "u" else self.f
        if given is not None:
            return rearrange(given[rows], "b h k m -> b k h m").contiguous()
        w = self.w_u if kind == "u" else self.w_f
        if self.v is None or w is None:
            raise ValueError(f"these LayerParts hold neither {kind} nor its factors")
        v = self.v[rows]  # [b', k, h, d]
        heads = rearrange(v, "b k h d -> h (b k) d").contiguous()
        # one bmm over heads (few large calls: many small ones stall on a busy multi-threaded CPU)
        return rearrange(torch.bmm(heads, w), "h (b k) m -> b k h m", b=v.shape[0]).contiguous()


@torch.no_grad()
def layer_methods(p: LayerParts, methods: Sequence[str], chunk_tokens: int = 32768) -> dict[str, torch.Tensor]:
    """``{method: [b, q, k]}`` (``"ratio:residual_norm"``: ``[b, q]``) for ``methods`` (from ``KERNELS``), one
    pass over chunks of sentences, each chunk's head vectors built once."""
    unknown = set(methods) - set(KERNELS)
    if unknown:
        raise ValueError(f"layer_methods knows {KERNELS}, not {sorted(unknown)}")
    pieces: dict[str, list[torch.Tensor]] = {m: [] for m in methods}
    y = None
    if "alti" in methods:
        attn_sum = p.attn_sum if p.attn_sum is not None else torch.einsum(
            "bhqk,bkhm->bqm", p.pattern, p.head_vectors("u"))
        y = (attn_sum + p.r) / p.s + p.rest  # ALTI's resultant: the block's output
    needs_u = {"residual_norm", "alti", "ratio:residual_norm"} & set(methods)
    for rows in _sentence_chunks(p):
        pattern = p.pattern[rows]
        if "attention" in methods:
            pieces["attention"].append(pattern.mean(1))
        if "attention_norm" in methods:
            pieces["attention_norm"].append(_head_sum_norm2(pattern, p.head_vectors("f", rows)).clamp_min(0).sqrt())
        if not needs_u:
            continue
        u = p.head_vectors("u", rows)
        r, s = p.r[rows], p.s[rows]
        if "residual_norm" in methods:
            pieces["residual_norm"].append(_residual_norm(pattern, u, r, s))
        if "ratio:residual_norm" in methods:
            pieces["ratio:residual_norm"].append(_residual_ratio(pattern, u, r, s, p.attn_sum[rows]))
        if "alti" in methods:
            pieces["alti"].append(_alti(pattern, u, r, s, y[rows], chunk_tokens))
    return {m: torch.cat(v) for m, v in pieces.items()}


def _residual_norm(pattern, u, r, s) -> torch.Tensor:
    """``||T_q(x_k)||_2`` ``[b, q, k]``: ``||sum_h a^h_qk u^h_k + [q=k] r_q|| / s_q``, by Gram matrices."""
    sq = _head_sum_norm2(pattern, u)
    diag_a = torch.diagonal(pattern, dim1=-2, dim2=-1)  # [b, h, q]
    cross = 2 * torch.einsum("bhq,bqhm,bqm->bq", diag_a, u, r) + (r * r).sum(-1)  # [b, q]
    return (sq + torch.diag_embed(cross)).clamp_min(0).sqrt() / s


def _residual_ratio(pattern, u, r, s, attn_sum) -> torch.Tensor:
    """Kobayashi et al. (2021)'s ``||sum_{k!=q} T_q(x_k)|| / (||sum_{k!=q} T_q(x_k)|| + ||T_q(x_q)||)`` ``[b, q]``."""
    diag_a = torch.diagonal(pattern, dim1=-2, dim2=-1)  # [b, h, q]
    own = (torch.einsum("bhq,bqhm->bqm", diag_a, u) + r) / s
    total = (attn_sum + r) / s
    mix, keep = (total - own).norm(dim=-1), own.norm(dim=-1)
    return mix / (mix + keep)


def _head_sum_norm2(pattern: torch.Tensor, vec: torch.Tensor) -> torch.Tensor:
    """``||sum_h a^h_qk v^h_k||^2`` ``[b, q, k]`` = ``a_qk^T G_k a_qk`` with ``G_k[h, g] = <v^h_k, v^g_k>``.

    ``pattern`` ``[b, h, q, k]``; ``vec`` key-major ``[b, k, h, m]``."""
    b = vec.shape[0]
    flat = rearrange(vec, "b k h m -> (b k) h m")
    gram = torch.bmm(flat, flat.transpose(1, 2))  # [(b k), h, h]
    # contiguous once: matmul on the strided view would copy per (sentence, key)
    a = rearrange(pattern, "b h q k -> (b k) q h").contiguous()
    return rearrange((torch.bmm(a, gram) * a).sum(-1), "(b k) q -> b q k", b=b)


def _sentence_chunks(p: LayerParts, budget: int = 1 << 21) -> list[slice]:
    """Slices of sentences whose ``[b', k, h, m]`` head vectors hold at most ``budget`` numbers (~8 MB)."""
    b, h, _, k = p.pattern.shape
    m = p.r.shape[-1]
    per = max(1, budget // (k * h * m))
    return [slice(i, min(b, i + per)) for i in range(0, b, per)]


def _alti(pattern, u, r, s, y, chunk_tokens: int) -> torch.Tensor:
    """ALTI ``[b, q, k]``: ``max(0, ||y_q||_1 - ||y_q - T_q(x_k)||_1)`` normalised over k, ``y_q = sum_k T_q(x_k) +
    rest`` (Ferrando et al.'s ``resultant``). ``u`` key-major ``[b, k, h, m]``.

    Per sentence, for a few keys at a time ``T_q(x_k) - y_q`` (``[keys, q, m]``, at most ~1 MB, so it stays in
    cache) is one ``bmm`` (``(alpha / s) @ u``) into a reused buffer, reduced in place; the diagonal (where
    ``T_q(x_q)`` also holds the residual) is redone once per sentence.
    """
    b, h, q, k = pattern.shape
    m = r.shape[-1]
    step = max(1, min(chunk_tokens // q, (1 << 18) // (q * m)))
    d = y.new_empty(b, k, q)
    buffer = y.new_empty(step, q, m)
    keys = torch.arange(k, device=y.device)
    for i in range(b):
        a = rearrange(pattern[i] / s[i], "h q k -> k q h").contiguous()
        for start in range(0, k, step):
            stop = min(k, start + step)
            diff = torch.bmm(a[start:stop], u[i, start:stop], out=buffer[: stop - start])  # [keys, q, m]
            # sub_/abs_/sum: 3x faster here than baddbmm(beta=-1) and linalg.vector_norm(ord=1)
            d[i, start:stop] = diff.sub_(y[i]).abs_().sum(-1)  # ||T_q(x_k) - y_q||_1 for k != q
        own = torch.einsum("qh,qhm->qm", a[keys, keys], u[i]) + r[i] / s[i]
        d[i, keys, keys] = (own - y[i]).abs().sum(-1)
    c = (y.abs().sum(-1, keepdim=True) - rearrange(d, "b k q -> b q k")).clamp_min(0)
    return c / c.sum(-1, keepdim=True).clamp_min(1e-30)
