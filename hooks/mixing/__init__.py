"""Context mixing: how much each token's representation takes from every other token, by the field's methods.

A subpackage of ``bertscope.hooks`` built purely on hooked tensors: this module is the API; the method table
(``table.TABLE``, entries in ``methods``) is the one list of methods; ``kernels`` holds the per-layer
decomposition, ``zeroing`` value zeroing, ``graph`` rollout and flow, ``inputs`` the input attributions.

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
see ``bertscope.hooks.mixing.graph``. ``grad_x_input``, ``integrated_gradients`` and ``loo`` attribute a
scalar target to the input tokens, see ``bertscope.hooks.mixing.inputs``. ``METHODS``, ``PER_LAYER`` and
``INPUT_ATTRIBUTIONS`` are read from the table on each access (a registered method appears in them).

Shapes: ``b`` batch, ``h`` head, ``q``/``k`` query/key positions, ``m`` d_model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
from bertscope.hooks.mixing import graph, kernels, table
from bertscope.hooks.mixing import inputs as input_methods
from bertscope.hooks.mixing import methods as _builtin  # noqa: F401 (registers the built-in methods)
from bertscope.hooks.mixing.kernels import LayerParts, layer_methods
from bertscope.hooks.mixing.table import TABLE, Method, register
from bertscope.models.text import is_text

LayerNormMode = Literal["exact", "reference", "unbiased"]
#: ``progress(desc, total)`` -> a bar with ``update(n)`` and ``close()`` (tqdm's, or ``ctx.progress``'s)
ProgressFactory = Callable[[str, int], Any]

__all__ = [
    "INPUT_ATTRIBUTIONS", "METHODS", "PER_LAYER", "TABLE", "LayerParts", "Method", "contributions", "mixing_ratio",
    "needed_sites", "per_layer_contributions", "register", "token_decomposition", "undefined_reason",
]  # fmt: skip


def __getattr__(name: str) -> tuple[str, ...]:
    """``METHODS``, ``PER_LAYER`` and ``INPUT_ATTRIBUTIONS``, read from the method table when asked for."""
    lists = {"METHODS": table.all_names, "PER_LAYER": table.per_layer, "INPUT_ATTRIBUTIONS": table.input_attributions}
    if name in lists:
        return lists[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Silent:
    """The bar of ``progress=None``: counts nothing, prints nothing."""

    def update(self, n: int = 1) -> None:
        """Nothing."""

    def close(self) -> None:
        """Nothing."""


def _silent(desc: str, total: int) -> _Silent:
    return _Silent()


def contributions(
    model: torch.nn.Module,
    inputs: str | Sequence[str] | Mapping[str, torch.Tensor] | torch.Tensor,
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
    progress: ProgressFactory | None = None,
) -> torch.Tensor:
    """Token-to-token contributions by ``method`` (one of ``METHODS``).

    ``inputs``: text (a string or a list of strings, tokenised with ``model.tokenize`` as ``model()`` and
    ``run_with_cache`` do), ``model.tokenize(...)``'s dict (``input_ids`` ``[batch, pos]``, optional
    ``attention_mask``, ``token_type_ids``) or an ``input_ids`` tensor.

    Returns
      - per-layer methods and ``rollout:``/``flow:``: ``[batch, layer, query, key]``; ``layer`` runs over
        ``layers`` (default: every layer, in order). Entry ``[b, L, i, j]`` is how much token j (the input of
        block L for per-layer methods; the embedding output for rollout/flow) contributes to token i at block
        L's output. ``attention``, ``alti``, ``value_zeroing`` and every rollout/flow row sum to 1 over real
        keys; ``attention_norm`` and ``residual_norm`` are norms in the model's units (rows not normalised).
      - input attributions (``grad_x_input``, ``integrated_gradients``, ``loo``): ``[batch, 1, key]``: one
        scalar ``target`` per sentence attributed to each input token (no query axis: the target pools the
        sentence). See ``bertscope.hooks.mixing.inputs`` for ``target``, ``baseline``, ``n_steps``, ``labels``.

    ``layer_norm``: ``"exact"`` (default) decomposes the true LayerNorm, ``sqrt(population var + eps)``; the
    public ALTI code divides by ``torch.std(unbiased=False)`` without eps (``"reference"``); ``"unbiased"`` is
    ``torch.std``'s default (Bessel-corrected, no eps). Used by ``residual_norm`` and ``alti``.
    ``chunk_tokens`` bounds the work held at once (value zeroing's replicated batches, ALTI's key chunks, loo).
    ``max_flow_tokens``: ``flow:`` refuses longer sentences (its cost is layers x n^2 max-flow problems).
    ``progress(desc, total)``: a bar factory (tqdm-like bars with ``update``/``close``, e.g. an experiment's
    ``ctx.progress``) for the long loops: per layer of the decompositions, per layer and group of zeroed tokens
    in value zeroing, per group of left-out tokens in ``loo``.
    Padding rows and columns are zero. Needs the model in eval mode.
    """
    if is_text(inputs):  # text, as model() and run_with_cache take it
        inputs = model.tokenize(list(inputs) if isinstance(inputs, tuple) else inputs)
    ids, mask, types = _unpack(model, inputs)
    kind, spec = table.parse(method)
    if model.training:
        raise RuntimeError("contributions need the model in eval mode (dropout would randomise them): model.eval()")
    if layer_norm not in ("exact", "reference", "unbiased"):
        raise ValueError(f"layer_norm must be 'exact', 'reference' or 'unbiased', got {layer_norm!r}")
    chosen = _layers(model, layers)
    if spec.kind == "input":
        return input_methods.attribute(
            model, ids, mask, types, spec.name, target=target, baseline=baseline, n_steps=n_steps, labels=labels,
            chunk_tokens=chunk_tokens, progress=progress or _silent,
        )
    base = spec.name
    if kind:
        per_layer = _per_layer(model, ids, mask, types, base, range(max(chosen) + 1), layer_norm, chunk_tokens,
                               progress)
        if kind == "rollout":
            return graph.rollout(per_layer, mask, base)[:, chosen]
        return graph.flow(per_layer, mask, base, layers=chosen, max_tokens=max_flow_tokens)
    return _per_layer(model, ids, mask, types, base, chosen, layer_norm, chunk_tokens, progress)


def per_layer_contributions(
    model: torch.nn.Module,
    inputs: Mapping[str, torch.Tensor] | torch.Tensor,
    methods: Sequence[str],
    *,
    layers: Sequence[int] | None = None,
    layer_norm: LayerNormMode = "exact",
    chunk_tokens: int = 32768,
    cache: Mapping[str, torch.Tensor] | None = None,
    progress: ProgressFactory | None = None,
) -> dict[str, torch.Tensor]:
    """Several per-layer methods at once: ``{method: [batch, layer, query, key]}``, the same numbers as
    ``contributions`` for each, from one cached forward pass with the head vectors built once (what an experiment
    computing them all on a corpus wants). ``methods`` from ``PER_LAYER``, plus ``"ratio:<method>"`` for a method
    with its own ratio (``"ratio:residual_norm"``: ``mixing_ratio(..., "residual_norm")``, ``[batch, layer,
    query]``).

    ``cache``: the hooked tensors ``blocks.{L}.<site>`` the methods read (``needed_sites``), e.g. read from a
    capture; given, no forward pass is run (value zeroing re-runs each block from the cached
    ``hook_resid_pre``). ``progress(desc, total)``: a bar factory (``ctx.progress``-like) for the long loops
    (one step per layer of the decomposition methods; per layer and group of zeroed tokens in value zeroing).
    """
    ids, mask, types = _unpack(model, inputs)
    known = table.per_layer()
    ratios = tuple(f"ratio:{m}" for m in known if TABLE[m].ratio is not None)
    bad = [m for m in methods if m not in (*known, *ratios)]
    if bad:
        raise ValueError(f"per_layer_contributions takes {known} and {ratios}, not {bad}")
    if model.training:
        raise RuntimeError("contributions need the model in eval mode (dropout would randomise them): model.eval()")
    return _per_layer_many(model, ids, mask, types, list(methods), _layers(model, layers), layer_norm, chunk_tokens,
                           cache=cache, progress=progress)  # fmt: skip


def needed_sites(methods: Sequence[str], layers: Sequence[int]) -> list[str]:
    """The hook names ``per_layer_contributions(..., methods, layers=layers, cache=...)`` reads from ``cache``."""
    sites: list[str] = []
    for m in methods:
        for s in TABLE[m.removeprefix("ratio:")].sites:
            sites += [s] if s not in sites else []
    return [f"blocks.{L}.{s}" for L in layers for s in sites]


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
    _, spec = table.parse(method)
    if spec.ratio is None:
        c = contributions(model, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}, method,
                          layers=chosen, layer_norm=layer_norm)
        total = c.sum(-1)
        own = torch.diagonal(c, dim1=-2, dim2=-1)
        return torch.where(total > 0, 1 - own / total.clamp_min(1e-30), torch.zeros_like(total))
    return _per_layer_many(model, ids, mask, types, [f"ratio:{method}"], chosen, layer_norm, 32768)[f"ratio:{method}"]


def undefined_reason(model: torch.nn.Module, method: str) -> str | None:
    """Why ``method`` is undefined for ``model`` (the sentence its error would give), or None where it is defined.

    Read from the table entry's ``undefined``. Only ``residual_norm`` (and its rollout/flow) depends on the
    architecture: Kobayashi et al. (2021) decompose the LayerNorm *after* the residual sum, which a pre-LN block
    (ModernBERT) does not have. Every other method reads only the attention pattern and the values, which stay a
    per-key function of the key's own input under DeBERTa's disentangled scores and ModernBERT's rotary positions
    alike.
    """
    spec = TABLE.get(method.rpartition(":")[2])
    if spec is None or spec.undefined is None:
        return None
    return spec.undefined(model, method)


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
    (parts,) = _collect(model, (ids, mask, types), _layers(model, [layer]), layer_norm, dtype)
    return _vectors(parts), parts.rest, parts.output


# ====================================================================== per-layer methods
@torch.no_grad()
def _per_layer(model, ids, mask, types, method, layers, layer_norm, chunk_tokens, progress=None) -> torch.Tensor:
    (out,) = _per_layer_many(model, ids, mask, types, [method], layers, layer_norm, chunk_tokens,
                             progress=progress).values()
    return out


@torch.no_grad()
def _per_layer_many(model, ids, mask, types, methods, layers, layer_norm, chunk_tokens, *, cache=None,
                    progress=None) -> dict[str, torch.Tensor]:  # fmt: skip
    """``{method: [b, L, q, k]}`` (``ratio:<m>``: ``[b, L, q]``) from one cached forward pass (or ``cache``)."""
    layers = list(layers)
    if not methods:
        return {}
    for m in methods:
        _require_defined(model, m)
    progress = progress or _silent

    def hooked(ms: list[str]) -> Mapping[str, torch.Tensor]:
        """``cache``, or one forward caching just the sites ``ms`` read (a forward caching more sites may take
        another code path, equal only up to float rounding)."""
        names = needed_sites(ms, layers)
        if cache is not None:
            missing = [n for n in names if n not in cache]
            if missing:
                raise ValueError(f"cache lacks {missing[:3]}{' ...' if len(missing) > 3 else ''}, which {ms} read")
            return cache
        return model.run_with_cache(ids, mask, types, names_filter=names, stop_at_layer=max(layers))[1]

    out = {}
    for m in methods:
        spec = TABLE[m.removeprefix("ratio:")]
        if spec.kind == "rerun":
            out[m] = spec.compute(model, ids, mask, types, layers, chunk_tokens, hooked([m]), progress)
    fns = {m: TABLE[m].compute if m in TABLE else TABLE[m.removeprefix("ratio:")].ratio
           for m in methods if m not in out}  # fmt: skip
    if fns:
        sites = set(needed_sites(list(fns), [0]))
        decompose = sites != {"blocks.0.attn.hook_pattern"}  # the pattern alone needs no decomposition
        tensors = hooked(list(fns))
        per_layer = []
        bar = progress("context-mixing decompositions (layers)", len(layers))
        for L in layers:
            (parts,) = _collect(model, tensors, [L], layer_norm, decompose=decompose)
            per_layer.append(layer_methods(parts, fns, chunk_tokens))
            bar.update(1)
        bar.close()
        out.update({m: torch.stack([d[m] for d in per_layer], dim=1) for m in fns})
    real = mask.to(next(iter(out.values())).dtype)
    for m, c in out.items():
        out[m] = c * real[:, None, :] if c.dim() == 3 else c * real[:, None, :, None] * real[:, None, None, :]
    return {m: out[m] for m in methods}


def _alti(p: LayerParts, chunk_tokens: int) -> torch.Tensor:
    """ALTI ``[b, q, k]`` of one layer's parts (see ``kernels``)."""
    return layer_methods(p, {"alti": kernels.alti}, chunk_tokens)["alti"]


def _vectors(p: LayerParts) -> torch.Tensor:
    """``T_q(x_k)`` ``[b, q, k, m]`` materialised (tests, small inputs)."""
    t = torch.einsum("bhqk,bkhm->bqkm", p.pattern, p.head_vectors("u"))
    idx = torch.arange(t.shape[1], device=t.device)
    t[:, idx, idx] += p.r
    return t / p.s[:, :, None]


# ====================================================================== shared plumbing
@torch.no_grad()
def _collect(
    model, cache, layers, layer_norm, dtype: torch.dtype | None = None, *, decompose: bool = True
) -> list[LayerParts]:
    """Each layer's ``LayerParts`` from ``cache`` (``(ids, mask, types)``: one cached forward pass first), computed
    in ``dtype`` (default the model's; ``u`` and ``f`` as their factors, see ``LayerParts``). ``decompose=False``:
    the pattern alone."""
    if isinstance(cache, tuple):
        ids, mask, types = cache
        names = [f"blocks.{L}.{s}" for L in layers for s in table.DECOMPOSITION_SITES]
        _, cache = model.run_with_cache(ids, mask, types, names_filter=names, stop_at_layer=max(layers))
    if not decompose:
        return [LayerParts(cache[f"blocks.{L}.attn.hook_pattern"].to(model.device), None, None, None, None, None,
                           None) for L in layers]  # fmt: skip
    _check_architecture(model)
    post = model.config.norm_placement == "post"
    parts = []
    for L in layers:
        block = model.blocks[L]

        def get(name: str, L: int = L) -> torch.Tensor:
            return cache[f"blocks.{L}.{name}"].to(model.device).to(dtype)

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


def _require_defined(model: torch.nn.Module, method: str) -> None:
    reason = undefined_reason(model, method.replace("ratio:", ""))
    if reason is not None:
        raise NotImplementedError(reason)


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
            f"inputs must be text, model.tokenize(...)'s dict or an input_ids tensor, got {type(inputs).__name__}"
        )
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise ValueError("input_ids must be a [batch, pos] tensor")
    device = model.device
    ids = ids.to(device)
    mask = torch.ones_like(ids) if mask is None else mask.to(device)
    if mask.shape != ids.shape:
        raise ValueError(f"attention_mask shape {tuple(mask.shape)} != input_ids shape {tuple(ids.shape)}")
    return ids, mask, None if types is None else types.to(device)
