"""`ActivationCache`: the mapping of hook name to tensor that ``run_with_cache`` returns.

Keys are full hook names (``"blocks.3.attn.hook_pattern"``); TransformerLens' short names work too
(``cache["pattern", 3]``, ``cache["resid_post", -1]``, ``cache["scale", 2, "ln1"]``, ``cache["embed"]``, see
``act_name``). With ``run_with_cache(..., incl_bwd=True)`` the gradient of each cached activation is under
``<name>_grad`` (``cache["resid_mid_grad", 2]``).

Residual stream in a post-LayerNorm model (BERT). Each sublayer's output is added to the stream and the sum is
renormalised at once: ``resid_mid = LN1(resid_pre + attn_out)``, ``resid_post = LN2(resid_mid + mlp_out)``. So
``hook_resid_*`` are LayerNorm outputs (transformers' ``hidden_states``), not running sums of earlier writes:
``accumulated_resid`` stacks those states, and the exact additive decomposition is ``decompose_resid``'s (each
write carried through the later LayerNorms as the per-position linear maps they were on this input). In a
pre-LN model the stream is a plain sum and both behave as in TransformerLens.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from bertscope.hooks.sites import is_glob, matches, parse_site
from einops import rearrange

# TransformerLens' utils.get_act_name conventions, mapped onto bertscope's hook names.
_ALIASES = {"attn": "pattern", "attn_logits": "scores", "attn_scores": "scores", "key": "k", "query": "q",
            "value": "v", "mlp_pre": "pre", "mlp_post": "post"}  # fmt: skip
_ATTN = ("q", "k", "v", "z", "result", "pattern", "scores")
_MLP = ("pre", "post")
_BLOCK = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
_LN = ("scale", "normalized")
_EMBED = {"embed": "embed.hook_word", "pos_embed": "embed.hook_pos", "token_type_embed": "embed.hook_type",
          "token_type": "embed.hook_type", "full_embed": "embed.hook_out"}  # fmt: skip
_LAYER_TYPES = {"ln1": "ln1", "ln2": "ln2", "a": "ln1", "m": "ln2", "attn": "ln1", "mlp": "ln2"}


def act_name(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
    """Full hook name of a TransformerLens-style short name (``utils.get_act_name``'s conventions).

    ``act_name("pattern", 3)`` -> ``"blocks.3.attn.hook_pattern"``; ``q k v z result pattern scores``
    (aliases ``attn attn_scores attn_logits query key value``) are ``blocks.L.attn.hook_*``; ``pre post``
    (``mlp_pre mlp_post``) are ``blocks.L.mlp.hook_*``; ``resid_pre resid_mid resid_post attn_out mlp_out`` are
    ``blocks.L.hook_*``; ``scale normalized`` need ``layer_type`` ``"ln1"`` or ``"ln2"`` (or no layer: the
    pre-LN ``ln_final``); without a layer, ``embed pos_embed token_type_embed full_embed`` are
    ``embed.hook_word / hook_pos / hook_type / hook_out``. A trailing ``_grad`` carries over. Names that already
    contain a dot are returned unchanged. Meanings are bertscope's (``docs/hooks.md``): in a post-LN model
    ``resid_mid``/``resid_post`` are after the LayerNorm, where TransformerLens' HookedEncoder has the sum before.
    """
    if "." in name and layer is None:
        return name
    grad = name.endswith("_grad")
    base = _ALIASES.get(name[:-5] if grad else name, name[:-5] if grad else name)
    suffix = "_grad" if grad else ""
    if layer is None:
        if base in _EMBED:
            return _EMBED[base] + suffix
        if base in _LN:
            return f"ln_final.hook_{base}{suffix}"
        if base in _ATTN + _MLP + _BLOCK:
            raise KeyError(f"{name!r} is a per-layer name: give a layer, e.g. cache[{name!r}, 0]")
        raise KeyError(f"unknown activation name {name!r}; see bertscope.hooks.cache.act_name")
    prefix = f"blocks.{layer}."
    if base in _ATTN:
        return f"{prefix}attn.hook_{base}{suffix}"
    if base in _MLP:
        return f"{prefix}mlp.hook_{base}{suffix}"
    if base in _BLOCK:
        return f"{prefix}hook_{base}{suffix}"
    if base in _LN:
        if layer_type not in _LAYER_TYPES:
            raise KeyError(f"{name!r} at a layer needs layer_type 'ln1' or 'ln2', e.g. cache[{name!r}, {layer}, 'ln1']")
        return f"{prefix}{_LAYER_TYPES[layer_type]}.hook_{base}{suffix}"
    raise KeyError(f"unknown activation name {name!r} for a layer; see bertscope.hooks.cache.act_name")


class ActivationCache(Mapping[str, torch.Tensor]):
    """Read-only mapping ``name -> tensor`` with helpers for the common views.

    >>> cache["blocks.3.attn.hook_pattern"]          # [batch, head, query, key]
    >>> cache["pattern", 3]                           # the same (TransformerLens short name)
    >>> cache.stack("attn.hook_pattern")              # [layer, batch, head, query, key]
    >>> cache.stack("blocks.*.hook_resid_post")       # a glob works too
    >>> cache.heads("blocks.3.attn.hook_z", [0, 5])   # [batch, pos, 2, d_head]

    ``model`` (set by ``run_with_cache``) gives the weights that ``stack_head_results`` and ``decompose_resid``
    need and the layer count for negative layer indices; a cache built from a plain dict has none.
    """

    def __init__(self, tensors: Mapping[str, torch.Tensor], model: Any = None) -> None:
        self._tensors = dict(tensors)
        self.model = model

    # ------------------------------------------------------------------ mapping
    def resolve(self, key: str | tuple[Any, ...]) -> str:
        """Full hook name for a full name, a short name (``"embed"``) or a tuple (``("pattern", 3)``,
        ``("scale", 2, "ln1")``); negative layers count from the end (needs ``model``)."""
        if isinstance(key, str):
            return key if key in self._tensors or "." in key else act_name(key)
        if not isinstance(key, tuple) or not 1 <= len(key) <= 3 or not isinstance(key[0], str):
            raise KeyError(f"cache keys are names or (name, layer[, layer_type]) tuples, got {key!r}")
        name, layer, layer_type = (*key, None, None)[:3]
        if layer is not None and layer < 0:
            layer += self._n_layers("a negative layer index")
        return act_name(name, layer, layer_type)

    def __getitem__(self, key: str | tuple[Any, ...]) -> torch.Tensor:
        name = self.resolve(key)
        try:
            return self._tensors[name]
        except KeyError:
            via = "" if name == key else f" (from {key!r})"
            raise KeyError(
                f"{name!r}{via} is not in this cache; it holds {len(self._tensors)} names "
                f"(e.g. {list(self._tensors)[:3]}). Check names_filter."
            ) from None

    def __contains__(self, key: object) -> bool:
        try:
            return self.resolve(key) in self._tensors  # type: ignore[arg-type]
        except KeyError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} tensors: {list(self._tensors)[:4]}{'...' if len(self) > 4 else ''})"

    # ------------------------------------------------------------------ per-layer views
    def layers(self, suffix: str) -> list[int]:
        """Layer indices present for a per-block name suffix such as ``"attn.hook_pattern"``."""
        sites = [parse_site(name) for name in self._tensors]
        return sorted(s.layer for s in sites if s.layer is not None and s.suffix == suffix)

    def stack(self, pattern: str) -> torch.Tensor:
        """Stack cached tensors over layers: ``[layer, ...]``, in layer order.

        ``pattern``: a per-block suffix (``"attn.hook_pattern"``), a glob (``"blocks.*.hook_resid_post"``,
        the syntax ``names_filter`` takes) or a short name (``"pattern"``, ``"resid_post_grad"``).
        """
        names = self.names(pattern)
        if not names:
            raise KeyError(
                f"no cached name matches {pattern!r}; cached names look like {list(self._tensors)[:3]}. "
                "Check names_filter."
            )
        return torch.stack([self._tensors[n] for n in names])

    def names(self, pattern: str) -> list[str]:
        """Cached names matching a suffix, glob or short name (see ``stack``), sorted by layer."""
        if is_glob(pattern):
            found = [n for n in self._tensors if matches(pattern, n)]
        elif pattern.startswith("blocks."):
            found = [pattern] if pattern in self._tensors else []
        else:  # a per-block suffix, matched exactly ("hook_scale" is neither ln1's nor ln2's)
            short = not ("." in pattern or pattern.startswith("hook_"))
            suffix = act_name(pattern, 0)[len("blocks.0.") :] if short else pattern
            found = [n for n in self._tensors if (s := parse_site(n)).layer is not None and s.suffix == suffix]
        return sorted(found, key=lambda n: -1 if (layer := parse_site(n).layer) is None else layer)

    def heads(self, name: str, heads: int | Sequence[int]) -> torch.Tensor:
        """Select heads of a per-head tensor: ``[batch, pos, head, ...]`` (q/k/v/z/result) or
        ``[batch, head, query, key]`` (scores/pattern)."""
        t = self[name]
        name = self.resolve(name)
        idx = [heads] if isinstance(heads, int) else list(heads)
        dim = 1 if name.endswith(("hook_scores", "hook_pattern", "hook_scores_grad", "hook_pattern_grad")) else 2
        return t.index_select(dim, torch.tensor(idx, device=t.device))

    # ------------------------------------------------------------------ residual stream
    def accumulated_resid(
        self, layer: int | None = None, incl_mid: bool = False, return_labels: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[str]]:
        """The residual stream at each layer boundary up to ``layer``: ``[component, batch, pos, d_model]``.

        Components: ``resid_pre`` of layers ``0..layer`` (and ``resid_mid`` of layers ``0..layer-1`` with
        ``incl_mid``); ``layer=None`` (or ``-1``, or ``n_layers``) adds the last block's ``resid_post``
        (``"final_post"``). Labels as in TransformerLens: ``"0_pre"``, ``"0_mid"``, ..., ``"final_post"``.

        Post-LN (BERT): each entry is a LayerNorm output (``resid_pre`` of layer ``l`` is transformers'
        ``hidden_states[l]``); the stream is renormalised after every sublayer, so consecutive entries do not
        differ by the sublayer's write and nothing here sums to anything: use ``decompose_resid`` for that.
        Pre-LN: the running sums, as in TransformerLens (``final_post`` is before ``ln_final``).
        """
        n = self._n_layers("accumulated_resid") if layer is None or layer < 0 else None
        last = n if n is not None else layer
        labels, parts = [], []
        for lyr in range(last + 1):
            if n is not None and lyr == n:
                parts.append(self["resid_post", n - 1])
                labels.append("final_post")
                continue
            parts.append(self["resid_pre", lyr])
            labels.append(f"{lyr}_pre")
            if incl_mid and lyr < last:
                parts.append(self["resid_mid", lyr])
                labels.append(f"{lyr}_mid")
        out = torch.stack(parts)
        return (out, labels) if return_labels else out

    def decompose_resid(
        self, layer: int | None = None, mlp_input: bool = False, return_labels: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[str]]:
        """Exact additive decomposition of the residual stream: ``[component, batch, pos, d_model]``.

        Target: ``resid_pre`` of ``layer`` (with ``mlp_input``: its ``resid_mid``, the MLP's input side);
        ``layer=None`` (or ``-1``/``n_layers``): the last block's ``resid_post``. The components sum to the
        target (to float rounding). Labels: ``"embed"`` (word piece), ``"pos_embed"``, ``"token_type_embed"``
        (models with segments), ``"{l}_attn_out"``, ``"{l}_mlp_out"`` for each earlier sublayer, and
        ``"ln_bias"``.

        Every LayerNorm is applied as the linear map it was on this input: ``LN(x) = w * (x - mean x) / s + b``
        with its scale ``s = sqrt(var(x) + eps)`` frozen at the value of the run (per token), which maps a sum
        of components to the sum of their images plus ``b``. So each component is that sublayer's write, centred
        and rescaled by every LayerNorm after it; ``"ln_bias"`` collects the LayerNorm biases (also carried
        through later LayerNorms). Post-LN (BERT): the embedding LayerNorm and both LayerNorms of each block
        act. Pre-LN: only the embedding LayerNorm, so the blocks' writes appear unchanged, as in
        TransformerLens (which has no ``"ln_bias"``; here it is the embedding LayerNorm's bias).

        Needs the model (caches from ``run_with_cache`` carry it) and the cached ``embed.hook_word``,
        ``embed.hook_pos`` (``embed.hook_type`` when the model has segments), ``hook_attn_out`` and
        ``hook_mlp_out`` of the layers before the target. Exact in eval mode (dropout off).
        """
        model = self._need_model("decompose_resid")
        n = model.config.n_layers
        stop = n if layer is None or layer < 0 or layer >= n else layer
        if mlp_input and stop == n:
            raise ValueError("mlp_input=True needs a layer in 0..n_layers-1")
        post = model.config.norm_placement == "post"
        parts = [self["embed"], self["pos_embed"]]
        labels = ["embed", "pos_embed"]
        if model.embed.token_type is not None:
            parts.append(self["token_type_embed"])
            labels.append("token_type_embed")
        comps = torch.stack([*parts, torch.zeros_like(parts[0])])  # last row: the LayerNorm biases
        comps = _through_layernorm(comps, model.embed.ln)
        for lyr in range(stop + (1 if mlp_input else 0)):
            block = model.blocks[lyr]
            comps = _insert(comps, self["attn_out", lyr])
            labels.append(f"{lyr}_attn_out")
            if post:
                comps = _through_layernorm(comps, block.ln1)
            if mlp_input and lyr == stop:
                break
            comps = _insert(comps, self["mlp_out", lyr])
            labels.append(f"{lyr}_mlp_out")
            if post:
                comps = _through_layernorm(comps, block.ln2)
        labels.append("ln_bias")
        return (comps, labels) if return_labels else comps

    def stack_head_results(
        self, layer: int | None = None, *, incl_bias: bool = False, return_labels: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[str]]:
        """Each head's write into the residual stream: ``[component, batch, pos, d_model]``.

        ``layer``: one layer (its ``n_heads`` heads, labels ``"L3H0"``...), or None / ``-1`` for all layers in
        order. Unlike TransformerLens, an integer means that layer only, not every layer before it.
        Head ``h`` writes ``z_h @ W_O[h]``; ``sum_h result_h + b_O == hook_attn_out`` of the layer exactly (to
        float rounding). ``incl_bias=True`` appends ``b_O`` (broadcast, label ``"L3bias"``) after each
        layer's heads so that the components of a layer sum to its ``hook_attn_out``. In a post-LN model
        ``hook_attn_out`` is added to ``resid_pre`` before ``LN1``: these are writes into that pre-LN sum.

        Source: ``blocks.L.attn.hook_result`` when cached, else ``blocks.L.attn.hook_z`` with the model's
        ``W_O`` (caches from ``run_with_cache`` carry the model). ``incl_bias`` needs the model.
        """
        if layer is None or layer < 0:
            layers = list(range(self._n_layers("stack_head_results(None)")))
        else:
            layers = [layer]
        parts, labels = [], []
        for lyr in layers:
            result = self._head_results(lyr)  # [batch, pos, head, d_model]
            parts.append(rearrange(result, "b p h m -> h b p m"))
            labels += [f"L{lyr}H{h}" for h in range(result.shape[2])]
            if incl_bias:
                b_O = self._need_model("incl_bias").blocks[lyr].attn.b_O.detach()
                parts.append(b_O.to(result)[None, None, None].expand(1, *result.shape[:2], -1))
                labels.append(f"L{lyr}bias")
        out = torch.cat(parts)
        return (out, labels) if return_labels else out

    # ------------------------------------------------------------------ misc
    def to(self, device: str | torch.device) -> ActivationCache:
        """A cache with every tensor on ``device``."""
        return ActivationCache({k: v.to(device) for k, v in self._tensors.items()}, model=self.model)

    def nbytes(self) -> int:
        """Total bytes held."""
        return sum(t.numel() * t.element_size() for t in self._tensors.values())

    def _n_layers(self, what: str) -> int:
        return self._need_model(what).config.n_layers

    def _need_model(self, what: str) -> Any:
        if self.model is None:
            raise ValueError(
                f"{what} needs the model's configuration and weights; this cache has none. Use the cache "
                "returned by model.run_with_cache, or ActivationCache(tensors, model=model)"
            )
        return self.model

    def _head_results(self, layer: int) -> torch.Tensor:
        name = f"blocks.{layer}.attn.hook_result"
        if name in self._tensors:
            return self._tensors[name]
        z_name = f"blocks.{layer}.attn.hook_z"
        if z_name in self._tensors and self.model is not None:
            z = self._tensors[z_name]
            W_O = self.model.blocks[layer].attn.W_O.detach().to(z)
            return torch.einsum("bphd,hdm->bphm", z, W_O)
        raise KeyError(
            f"per-head results of layer {layer} need {name!r}, or {z_name!r} and the model (a cache from "
            f"run_with_cache); cache them with names_filter=[{z_name!r}] or 'blocks.*.attn.hook_z'"
        )


def _insert(comps: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
    """Add a component before the last row (the running LayerNorm bias)."""
    return torch.cat([comps[:-1], part.to(comps)[None], comps[-1:]])


def _through_layernorm(comps: torch.Tensor, ln: torch.nn.Module) -> torch.Tensor:
    """Apply a LayerNorm to ``comps`` ``[component, batch, pos, d_model]`` as the linear map it is on their sum:
    each component is centred, divided by the sum's scale and multiplied by the weight; the bias goes to the
    last row."""
    total = comps.sum(dim=0)
    scale = (total.var(dim=-1, unbiased=False, keepdim=True) + ln.eps).sqrt()
    w, b = ln.weight.detach().to(comps), ln.bias.detach().to(comps)
    out = (comps - comps.mean(dim=-1, keepdim=True)) / scale * w
    out[-1] = out[-1] + b
    return out
