"""The per-layer decompositions behind ``bertscope.hooks.mixing``: ``LayerParts``, its ``Chunk`` and the method
kernels computed on a chunk.

``layer_methods(parts, kernels)`` computes several kernels of one layer in one pass over sentence chunks; a
``Chunk`` builds the head vectors ``u``/``f`` (``[b, k, h, m]``, the costly intermediate) at most once, so
``residual_norm``, ``alti`` and the residual-norm mixing ratio share them. Definitions: ``bertscope.hooks.mixing``;
the table naming each kernel: ``bertscope.hooks.mixing.methods``.

Shapes: ``b`` batch, ``h`` head, ``q``/``k`` query/key positions, ``m`` d_model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import torch
from einops import rearrange


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
    it costs a trip through main memory, built per sentence it stays in cache). Parts of a method that reads
    the pattern alone (``attention``) hold only ``pattern``.
    """

    pattern: torch.Tensor
    f: torch.Tensor | None
    u: torch.Tensor | None
    r: torch.Tensor | None
    s: torch.Tensor | None
    rest: torch.Tensor | None
    output: torch.Tensor | None
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


class Chunk:
    """Sentences ``rows`` of one layer's ``LayerParts``: what a ``"layer"`` method's function reads.

    ``pattern`` ``[b', h, q, k]``, ``r`` ``[b', q, m]``, ``s`` ``[b', q, 1]``, ``rest`` ``[b', q, m]``; built on first
    use and then shared by every method of the chunk: ``u``/``f`` key-major ``[b', k, h, m]``
    (``LayerParts.head_vectors``) and ``y`` ``[b', q, m]``, the block's attention-sublayer output rebuilt from the
    parts (ALTI's resultant). ``chunk_tokens`` bounds a method's own working set.
    """

    def __init__(self, parts: LayerParts, rows: slice, chunk_tokens: int = 32768) -> None:
        self.parts, self.rows, self.chunk_tokens = parts, rows, chunk_tokens
        self.pattern = parts.pattern[rows]
        self.r = None if parts.r is None else parts.r[rows]
        self.s = None if parts.s is None else parts.s[rows]
        self.rest = None if parts.rest is None else parts.rest[rows]

    @cached_property
    def u(self) -> torch.Tensor:
        """Each head's value through ``W_O`` (and LN1's linear part, post-LN): ``[b', k, h, m]``."""
        return self.parts.head_vectors("u", self.rows)

    @cached_property
    def f(self) -> torch.Tensor:
        """Each head's value through ``W_O`` only: ``[b', k, h, m]``."""
        return self.parts.head_vectors("f", self.rows)

    @cached_property
    def attn_sum(self) -> torch.Tensor:
        """``sum_h sum_k alpha^h_qk u^h_k`` ``[b', q, m]`` (read off ``hook_attn_out`` when the parts hold it)."""
        if self.parts.attn_sum is not None:
            return self.parts.attn_sum[self.rows]
        return torch.einsum("bhqk,bkhm->bqm", self.pattern, self.u)

    @cached_property
    def y(self) -> torch.Tensor:
        """The resultant ``sum_k T_q(x_k) + rest`` ``[b', q, m]``: the block's attention-sublayer output."""
        return (self.attn_sum + self.r) / self.s + self.rest


@torch.no_grad()
def layer_methods(
    p: LayerParts, kernels: Mapping[str, Callable[[Chunk], torch.Tensor]], chunk_tokens: int = 32768
) -> dict[str, torch.Tensor]:
    """``{name: [b, q, k]}`` (a ratio: ``[b, q]``) for each ``kernel(chunk)``, one pass over chunks of sentences,
    each chunk's head vectors built at most once."""
    pieces: dict[str, list[torch.Tensor]] = {m: [] for m in kernels}
    for rows in _sentence_chunks(p):
        chunk = Chunk(p, rows, chunk_tokens)
        for m, kernel in kernels.items():
            pieces[m].append(kernel(chunk))
    return {m: torch.cat(v) for m, v in pieces.items()}


# ---------------------------------------------------------------------------------------------- the kernels
def attention(c: Chunk) -> torch.Tensor:
    """The attention pattern averaged over heads ``[b', q, k]``."""
    return c.pattern.mean(1)


def attention_norm(c: Chunk) -> torch.Tensor:
    """Kobayashi et al. (2020): ``||sum_h alpha^h_qk f^h(x_k)||_2`` ``[b', q, k]``."""
    return _head_sum_norm2(c.pattern, c.f).clamp_min(0).sqrt()


def residual_norm(c: Chunk) -> torch.Tensor:
    """Kobayashi et al. (2021): ``||T_q(x_k)||_2`` ``[b', q, k]``."""
    return _residual_norm(c.pattern, c.u, c.r, c.s)


def residual_norm_ratio(c: Chunk) -> torch.Tensor:
    """Kobayashi et al. (2021)'s vector mixing ratio ``[b', q]``."""
    return _residual_ratio(c.pattern, c.u, c.r, c.s, c.attn_sum)


def alti(c: Chunk) -> torch.Tensor:
    """Ferrando et al. (2022): ALTI ``[b', q, k]``, rows normalised."""
    return _alti(c.pattern, c.u, c.r, c.s, c.y, c.chunk_tokens)


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
    if p.r is None:  # the pattern alone (no head vectors to bound)
        return [slice(0, b)]
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
