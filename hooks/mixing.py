"""Context mixing: how much each token's representation takes from every other token, by the field's methods.

``contributions(model, inputs, method)`` returns ``[batch, layer, query, key]`` for the per-layer methods and
their rollout/flow over layers, and ``[batch, 1, key]`` for the input attributions. Padding rows and columns
are zero. Every method reads only generic hooks (``blocks.{L}.hook_resid_pre``, ``attn.hook_pattern``,
``attn.hook_v``, ``hook_attn_out``, ``hook_resid_post``) and per-head weights (``attn.W_O``, ``attn.b_O``,
``ln1.weight/bias/eps``), so it runs on any ``Encoder`` with ``norm_placement`` "post" or "pre".

Per-layer methods (definitions, and the reference code each one follows, in ``docs/experiments/mixing.md``):

- ``attention``: the attention pattern averaged over heads.
- ``attention_norm``: ``||sum_h alpha^h_ij f^h(x_j)||_2`` with ``f^h(x) = (x W_V^h + b_V^h) W_O^h`` (Kobayashi
  et al. 2020; their ``summed_weighted_norm``: the norm of the head sum, not a sum of per-head norms).
- ``residual_norm``: ``||T_i(x_j)||_2``, the norm of token j's share of ``LN1(x_i + attn(x)_i)`` (Kobayashi et
  al. 2021, "AttnResLn-N"; the residual x_i is part of the j = i share, the biases of no token's share).
- ``alti``: ``max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1)``, rows normalised to sum 1 (Ferrando et al. 2022).
- ``value_zeroing``: cosine distance between block L's output with and without token j's value vector (all
  heads), rows normalised to sum 1 (Mohebbi et al. 2023).

``rollout:<method>`` and ``flow:<method>`` combine the per-layer matrices over layers (Abnar & Zuidema 2020),
see ``bertscope.hooks.mixing_graph``. ``grad_x_input``, ``integrated_gradients`` and ``loo`` attribute a
scalar target to the input tokens, see ``bertscope.hooks.mixing_inputs``.

Shapes: ``b`` batch, ``h`` head, ``q``/``k`` query/key positions, ``m`` d_model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from einops import rearrange

LayerNormMode = Literal["exact", "reference", "unbiased"]
PER_LAYER = ("attention", "attention_norm", "residual_norm", "alti", "value_zeroing")
INPUT_ATTRIBUTIONS = ("grad_x_input", "integrated_gradients", "loo")
METHODS = (*PER_LAYER, *(f"rollout:{m}" for m in PER_LAYER), *(f"flow:{m}" for m in PER_LAYER), *INPUT_ATTRIBUTIONS)


def contributions(
    model: torch.nn.Module,
    inputs: Mapping[str, torch.Tensor] | torch.Tensor,
    method: str,
    *,
    layers: Sequence[int] | None = None,
    layer_norm: LayerNormMode = "exact",
    target: str | Callable[..., torch.Tensor] = "auto",
    baseline: str = "mask",
    n_steps: int = 32,
    labels: torch.Tensor | None = None,
    chunk_tokens: int = 32768,
    max_flow_tokens: int = 48,
) -> torch.Tensor:
    """Token-to-token contributions by ``method`` (one of ``METHODS``).

    ``inputs``: ``model.tokenize(...)``'s dict (``input_ids`` ``[batch, pos]``, optional ``attention_mask``,
    ``token_type_ids``) or an ``input_ids`` tensor.

    Returns
      - per-layer methods and ``rollout:``/``flow:``: ``[batch, layer, query, key]``; ``layer`` runs over
        ``layers`` (default: every layer, in order). Entry ``[b, L, i, j]`` is how much token j (the input of
        block L for per-layer methods; the embedding output for rollout/flow) contributes to token i at block
        L's output. ``attention``, ``alti``, ``value_zeroing`` and every rollout/flow row sum to 1 over real
        keys; ``attention_norm`` and ``residual_norm`` are norms in the model's units (rows not normalised).
      - input attributions (``grad_x_input``, ``integrated_gradients``, ``loo``): ``[batch, 1, key]``: one
        scalar ``target`` per sentence attributed to each input token (no query axis: the target pools the
        sentence). See ``bertscope.hooks.mixing_inputs`` for ``target``, ``baseline``, ``n_steps``, ``labels``.

    ``layer_norm``: ``"exact"`` (default) decomposes the true LayerNorm, ``sqrt(population var + eps)``; the
    public ALTI code divides by ``torch.std(unbiased=False)`` without eps (``"reference"``); ``"unbiased"`` is
    ``torch.std``'s default (Bessel-corrected, no eps). Used by ``residual_norm`` and ``alti``.
    ``chunk_tokens`` bounds the work held at once (value zeroing's replicated batches, ALTI's key chunks, loo).
    ``max_flow_tokens``: ``flow:`` refuses longer sentences (its cost is layers x n^2 max-flow problems).
    Padding rows and columns are zero. Needs the model in eval mode.
    """
    ids, mask, types = _unpack(model, inputs)
    if method not in METHODS:
        raise ValueError(f"unknown contribution method {method!r}; choose one of {', '.join(METHODS)}")
    if model.training:
        raise RuntimeError("contributions need the model in eval mode (dropout would randomise them): model.eval()")
    if layer_norm not in ("exact", "reference", "unbiased"):
        raise ValueError(f"layer_norm must be 'exact', 'reference' or 'unbiased', got {layer_norm!r}")
    chosen = _layers(model, layers)
    if method in INPUT_ATTRIBUTIONS:
        from bertscope.hooks import mixing_inputs

        return mixing_inputs.attribute(
            model, ids, mask, types, method, target=target, baseline=baseline, n_steps=n_steps, labels=labels,
            chunk_tokens=chunk_tokens,
        )
    kind, _, base = method.partition(":") if ":" in method else ("", "", method)
    if kind:
        from bertscope.hooks import mixing_graph

        per_layer = _per_layer(model, ids, mask, types, base, range(max(chosen) + 1), layer_norm, chunk_tokens)
        if kind == "rollout":
            return mixing_graph.rollout(per_layer, mask, base)[:, chosen]
        return mixing_graph.flow(per_layer, mask, base, layers=chosen, max_tokens=max_flow_tokens)
    return _per_layer(model, ids, mask, types, base, chosen, layer_norm, chunk_tokens)


def mixing_ratio(
    model: torch.nn.Module,
    inputs: Mapping[str, torch.Tensor] | torch.Tensor,
    method: str = "residual_norm",
    *,
    layers: Sequence[int] | None = None,
    layer_norm: LayerNormMode = "exact",
) -> torch.Tensor:
    """How much of each token's block-L output comes from context rather than itself: ``[batch, layer, query]``.

    ``"residual_norm"``: Kobayashi et al. (2021)'s ratio ``||sum_{j!=i} T_i(x_j)|| / (||sum_{j!=i} T_i(x_j)|| +
    ||T_i(x_i)||)`` on the vectors of the residual-and-LayerNorm decomposition (their ``attnresln_n_mixing_ratio``).
    Any other per-layer method: ``1 - C_ii / sum_j C_ij`` on its contribution matrix. Padded queries are 0.
    """
    ids, mask, types = _unpack(model, inputs)
    chosen = _layers(model, layers)
    if method != "residual_norm":
        c = contributions(model, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}, method,
                          layers=chosen, layer_norm=layer_norm)
        total = c.sum(-1)
        own = torch.diagonal(c, dim1=-2, dim2=-1)
        return torch.where(total > 0, 1 - own / total.clamp_min(1e-30), torch.zeros_like(total))
    _require_post_ln(model, "residual_norm")
    out = []
    for parts in _collect(model, ids, mask, types, chosen, layer_norm):
        diag_a = torch.diagonal(parts.pattern, dim1=-2, dim2=-1)  # [b, h, q]
        own = (torch.einsum("bhq,bqhm->bqm", diag_a, parts.head_vectors("u")) + parts.r) / parts.s
        total = (parts.attn_sum + parts.r) / parts.s
        mix, keep = (total - own).norm(dim=-1), own.norm(dim=-1)
        out.append(mix / (mix + keep))
    return torch.stack(out, dim=1) * mask[:, None, :]


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
        out = v.new_empty(*v.shape[:3], w.shape[-1])
        for head in range(w.shape[0]):  # one plain matmul per head, written in place: ~4x einsum's speed on CPU
            torch.matmul(v[:, :, head], w[head], out=out[:, :, head])
        return out


def token_decomposition(
    model: torch.nn.Module,
    inputs: Mapping[str, torch.Tensor] | torch.Tensor,
    layer: int,
    *,
    layer_norm: LayerNormMode = "exact",
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Block ``layer``'s attention-sublayer output split by source token (Kobayashi 2021 / Ferrando 2022).

    Returns ``(parts [b, q, k, m], rest [b, q, m], output [b, q, m])`` with
    ``parts.sum(2) + rest == output`` (``hook_resid_mid``: LN1's output in post-LN blocks, ``resid_pre +
    attn_out`` in pre-LN ones) exactly, up to float rounding, when ``layer_norm="exact"``. ``parts[b, i, j]`` is
    ``T_i(x_j)``: token j's attention write into i (plus the residual ``x_i`` when j = i), through LN1's linear
    part and scale. ``rest`` is the output bias and LN1's beta, owned by no token. ``dtype``: compute the parts
    in another precision than the model's (``output`` is the hooked tensor, cast).

    Exactness measured on the bundled model (8 sentences, all layers): loaded in float64, the parts rebuild
    ``hook_resid_mid`` within 3e-14; in float32 within 1.1e-5, which is the float32 forward pass's own rounding
    (outputs reach ~28, so that is 4e-7 relative), not a gap in the decomposition.
    """
    ids, mask, types = _unpack(model, inputs)
    (parts,) = _collect(model, ids, mask, types, _layers(model, [layer]), layer_norm, dtype)
    return _vectors(parts), parts.rest, parts.output


# ====================================================================== per-layer methods
@torch.no_grad()
def _per_layer(model, ids, mask, types, method, layers, layer_norm, chunk_tokens) -> torch.Tensor:
    layers = list(layers)
    if method == "value_zeroing":
        out = _value_zeroing(model, ids, mask, types, layers, chunk_tokens)
    elif method == "attention":
        names = [f"blocks.{L}.attn.hook_pattern" for L in layers]
        _, cache = model.run_with_cache(ids, mask, types, names_filter=names, stop_at_layer=max(layers))
        out = torch.stack([cache[f"blocks.{L}.attn.hook_pattern"].mean(1) for L in layers], dim=1)
    else:
        if method == "residual_norm":
            _require_post_ln(model, method)
        fn = {"attention_norm": _attention_norm, "residual_norm": _residual_norm, "alti": _alti}[method]
        parts = _collect(model, ids, mask, types, layers, layer_norm)
        out = torch.stack([fn(p, chunk_tokens) for p in parts], dim=1)
    real = mask.to(out.dtype)
    return out * real[:, None, :, None] * real[:, None, None, :]


def _attention_norm(p: LayerParts, chunk_tokens: int) -> torch.Tensor:
    """``||sum_h a^h_qk f^h_k||`` ``[b, q, k]`` without building ``[b, q, k, m]``: a Gram matrix over heads."""
    out = [_head_sum_norm2(p.pattern[rows], p.head_vectors("f", rows)) for rows in _sentence_chunks(p)]
    return torch.cat(out).clamp_min(0).sqrt()


def _residual_norm(p: LayerParts, chunk_tokens: int) -> torch.Tensor:
    """``||T_q(x_k)||_2`` ``[b, q, k]``: ``||sum_h a^h_qk u^h_k + [q=k] r_q|| / s_q``, by Gram matrices."""
    out = []
    for rows in _sentence_chunks(p):
        pattern, u, r = p.pattern[rows], p.head_vectors("u", rows), p.r[rows]
        sq = _head_sum_norm2(pattern, u)
        diag_a = torch.diagonal(pattern, dim1=-2, dim2=-1)  # [b, h, q]
        cross = 2 * torch.einsum("bhq,bqhm,bqm->bq", diag_a, u, r) + (r * r).sum(-1)  # [b, q]
        out.append(sq + torch.diag_embed(cross))
    return torch.cat(out).clamp_min(0).sqrt() / p.s


def _head_sum_norm2(pattern: torch.Tensor, vec: torch.Tensor) -> torch.Tensor:
    """``||sum_h a^h_qk v^h_k||^2`` ``[b, q, k]`` = ``a_qk^T G_k a_qk`` with ``G_k[h, g] = <v^h_k, v^g_k>``.

    ``pattern`` ``[b, h, q, k]``; ``vec`` key-major ``[b, k, h, m]``."""
    b, k, h, _ = vec.shape
    flat = rearrange(vec, "b k h m -> (b k) h m")
    gram = torch.bmm(flat, flat.transpose(1, 2))  # [(b k), h, h]
    # contiguous once: matmul on the strided view would copy per (sentence, key)
    a = rearrange(pattern, "b h q k -> (b k) q h").contiguous()
    return rearrange((torch.bmm(a, gram) * a).sum(-1), "(b k) q -> b q k", b=b)


def _sentence_chunks(p: LayerParts, budget: int = 1 << 20) -> list[slice]:
    """Slices of sentences whose ``[b', k, h, m]`` head vectors hold at most ``budget`` numbers (~4 MB)."""
    b, h, _, k = p.pattern.shape
    m = p.r.shape[-1]
    per = max(1, budget // (k * h * m))
    return [slice(i, min(b, i + per)) for i in range(0, b, per)]


@torch.no_grad()
def _alti(p: LayerParts, chunk_tokens: int) -> torch.Tensor:
    """ALTI ``[b, q, k]``: ``max(0, ||y_q||_1 - ||y_q - T_q(x_k)||_1)`` normalised over k, ``y_q = sum_k T_q(x_k) +
    rest`` (Ferrando et al.'s ``resultant``).

    Per sentence, the head vectors ``u`` ``[k, h, m]`` are built once; then for a few keys at a time
    ``T_q(x_k) - y_q`` (``[keys, q, m]``, at most ~1 MB, so it stays in cache) is one ``bmm``
    (``(alpha / s) @ u``) into a reused buffer, reduced in place.
    """
    b, h, q, k = p.pattern.shape
    m = p.r.shape[-1]
    attn_sum = p.attn_sum if p.attn_sum is not None else torch.einsum("bhqk,bkhm->bqm", p.pattern, p.head_vectors("u"))
    y = (attn_sum + p.r) / p.s + p.rest
    step = max(1, min(chunk_tokens // q, (1 << 18) // (q * m)))
    d = y.new_empty(b, k, q)
    buffer = y.new_empty(step, q, m)
    keys = torch.arange(k, device=y.device)
    for i in range(b):
        u = p.head_vectors("u", slice(i, i + 1))[0]  # [k, h, m]
        a = rearrange(p.pattern[i] / p.s[i], "h q k -> k q h").contiguous()
        for start in range(0, k, step):
            stop = min(k, start + step)
            diff = torch.bmm(a[start:stop], u[start:stop], out=buffer[: stop - start])  # [keys, q, m]
            # sub_/abs_/sum: 3x faster here than baddbmm(beta=-1) and linalg.vector_norm(ord=1)
            d[i, start:stop] = diff.sub_(y[i]).abs_().sum(-1)  # ||T_q(x_k) - y_q||_1 for k != q
        # k = q: T_q(x_q) also holds the residual x_q; redone for the diagonal alone
        own = torch.einsum("qh,qhm->qm", a[keys, keys], u) + p.r[i] / p.s[i]
        d[i, keys, keys] = (own - y[i]).abs().sum(-1)
    c = (y.abs().sum(-1, keepdim=True) - rearrange(d, "b k q -> b q k")).clamp_min(0)
    return c / c.sum(-1, keepdim=True).clamp_min(1e-30)


def _vectors(p: LayerParts) -> torch.Tensor:
    """``T_q(x_k)`` ``[b, q, k, m]`` materialised (tests, small inputs)."""
    t = torch.einsum("bhqk,bkhm->bqkm", p.pattern, p.head_vectors("u"))
    idx = torch.arange(t.shape[1], device=t.device)
    t[:, idx, idx] += p.r
    return t / p.s[:, :, None]


@torch.no_grad()
def _value_zeroing(model, ids, mask, types, layers, chunk_tokens) -> torch.Tensor:
    """Mohebbi et al. (2023): for every key j, block L re-run from its true input with ``v_j = 0`` in every head;
    score ``[b, L, q, j]`` = cosine distance of token q's block output to the original one; rows normalised.

    The batch is replicated once per zeroed position (chunked to ``chunk_tokens`` tokens), one block at a time.
    """
    names = [f"blocks.{L}.{s}" for L in layers for s in ("hook_resid_pre", "hook_resid_post")]
    _, cache = model.run_with_cache(ids, mask, types, names_filter=names, stop_at_layer=max(layers))
    b, n = ids.shape
    per = max(1, chunk_tokens // (b * n))
    out = []
    for L in layers:
        x, y = cache[f"blocks.{L}.hook_resid_pre"], cache[f"blocks.{L}.hook_resid_post"]
        scores = x.new_zeros(b, n, n)
        for start in range(0, n, per):
            zero = torch.arange(start, min(n, start + per), device=x.device)  # positions zeroed in this chunk
            reps = len(zero)
            which = zero.repeat_interleave(b)  # replica r (= zero index * b + sentence) zeroes position which[r]

            def zero_value(v: torch.Tensor, hook: Any, which: torch.Tensor = which) -> torch.Tensor:
                v = v.clone()
                v[torch.arange(v.shape[0], device=v.device), which] = 0
                return v

            with model.hooks([(f"blocks.{L}.attn.hook_v", zero_value)]):
                new = model.forward_from(L, x.repeat(reps, 1, 1), mask.repeat(reps, 1), stop_at_layer=L)
            dist = 1 - torch.nn.functional.cosine_similarity(new, y.repeat(reps, 1, 1), dim=-1)  # [reps * b, q]
            scores[:, :, zero] = rearrange(dist, "(z b) q -> b q z", z=reps)
        scores = scores * mask[:, None, :]
        out.append(scores / scores.sum(-1, keepdim=True).clamp_min(1e-30))
    return torch.stack(out, dim=1)


# ====================================================================== shared plumbing
@torch.no_grad()
def _collect(
    model, ids, mask, types, layers, layer_norm, dtype: torch.dtype | None = None
) -> list[LayerParts]:
    """One cached forward pass, then each layer's ``LayerParts`` (computed in ``dtype``, default the model's;
    ``u`` and ``f`` as their factors, see ``LayerParts``)."""
    _check_architecture(model)
    sites = ("hook_resid_pre", "attn.hook_pattern", "attn.hook_v", "hook_attn_out", "hook_resid_mid")
    names = [f"blocks.{L}.{s}" for L in layers for s in sites]
    _, cache = model.run_with_cache(ids, mask, types, names_filter=names, stop_at_layer=max(layers))
    post = model.config.norm_placement == "post"
    parts = []
    for L in layers:
        block = model.blocks[L]

        def get(name: str, L: int = L) -> torch.Tensor:
            return cache[f"blocks.{L}.{name}"].to(dtype)

        x, v, w_o = get("hook_resid_pre"), get("attn.hook_v"), block.attn.W_O.detach().to(dtype)
        b_o = block.attn.b_O.to(dtype)
        attn_out = get("hook_attn_out")
        if post:
            pre_ln = x + attn_out
            s = _ln_scale(pre_ln, block.ln1.eps, layer_norm)
            gamma = block.ln1.weight.detach().to(dtype)
            # centring and gamma are linear: fold them into W_O instead of a pass over [b, h, k, m]
            w_u = _centre(w_o) * gamma
            r = _centre(x) * gamma
            attn_sum = _centre(attn_out - b_o) * gamma
            rest = (_centre(b_o) * gamma) / s + block.ln1.bias.to(dtype)
        else:
            s = x.new_ones(*x.shape[:2], 1)
            w_u, r, rest = w_o, x, b_o.expand_as(x)
            attn_sum = attn_out - b_o
        parts.append(LayerParts(
            get("attn.hook_pattern"), None, None, r, s, rest, get("hook_resid_mid"), attn_sum, v=v, w_u=w_u, w_f=w_o,
        ))  # fmt: skip
    return parts


def _centre(t: torch.Tensor) -> torch.Tensor:
    return t - t.mean(-1, keepdim=True)


def _ln_scale(pre_ln: torch.Tensor, eps: float, mode: LayerNormMode) -> torch.Tensor:
    """LN1's divisor ``[b, q, 1]``: exact ``sqrt(var_pop + eps)``, or the public codes' ``torch.std`` variants."""
    if mode == "exact":
        return (pre_ln.var(-1, unbiased=False, keepdim=True) + eps).sqrt()
    return pre_ln.std(-1, unbiased=(mode == "unbiased"), keepdim=True)


def _check_architecture(model: torch.nn.Module) -> None:
    placement = getattr(model.config, "norm_placement", None)
    if placement not in ("post", "pre"):
        raise NotImplementedError(
            f"context-mixing decompositions know post-LN and pre-LN blocks; this model has norm_placement="
            f"{placement!r}"
        )
    for name in ("blocks.0.attn.hook_pattern", "blocks.0.attn.hook_v", "blocks.0.hook_attn_out"):
        if name not in model.hook_dict:
            raise NotImplementedError(f"this model has no hook {name!r}, which the decompositions read")


def _require_post_ln(model: torch.nn.Module, method: str) -> None:
    if getattr(model.config, "norm_placement", None) != "post":
        raise NotImplementedError(
            f"{method} (Kobayashi et al. 2021) decomposes LN(x + attn(x)) of a post-LN block; this model is "
            f"{getattr(model.config, 'norm_placement', None)!r}-LN, with no LayerNorm after the residual sum. "
            "Use 'alti' (which has a pre-LN form) or 'attention_norm'."
        )


def _layers(model: torch.nn.Module, layers: Sequence[int] | None) -> list[int]:
    n = model.config.n_layers
    if layers is None:
        return list(range(n))
    chosen = [int(L) + n if int(L) < 0 else int(L) for L in layers]
    bad = [L for L in chosen if not 0 <= L < n]
    if bad or not chosen:
        raise ValueError(f"layers must be non-empty indices in 0..{n - 1} (negatives count from the end), got {layers}")
    return chosen


def _unpack(model, inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(input_ids, attention_mask, token_type_ids)`` on the model's device; the mask is filled with ones."""
    if isinstance(inputs, torch.Tensor):
        ids, mask, types = inputs, None, None
    elif isinstance(inputs, Mapping):
        if "input_ids" not in inputs:
            raise ValueError("inputs must hold 'input_ids' (use model.tokenize(texts))")
        ids, mask, types = inputs["input_ids"], inputs.get("attention_mask"), inputs.get("token_type_ids")
    else:
        raise TypeError(
            f"inputs must be model.tokenize(...)'s dict or an input_ids tensor, got {type(inputs).__name__}"
        )
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise ValueError("input_ids must be a [batch, pos] tensor")
    device = model.device
    ids = ids.to(device)
    mask = torch.ones_like(ids) if mask is None else mask.to(device)
    if mask.shape != ids.shape:
        raise ValueError(f"attention_mask shape {tuple(mask.shape)} != input_ids shape {tuple(ids.shape)}")
    return ids, mask, None if types is None else types.to(device)
