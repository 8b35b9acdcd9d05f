"""Head-level interventions, written as lists of ``(hook name, fn)`` for ``model.hooks`` / ``run_with_hooks``.

Every intervention takes the model first, then what to change, then where the values come from:

- ``ablate_heads(model, heads, method="zero" | "mean" | "uniform", *, reference=None, attention_mask=None)``
- ``patch_heads(model, heads, source, *, site="hook_z")``
- ``patch_activation(model, names, source, *, positions=None)``
- ``mean_z(model, inputs, attention_mask=None, token_type_ids=None)``

>>> with model.hooks(ablate_heads(model, {3: [5]}, method="zero")):
...     ablated = model(ids, mask)
>>> out = model.run_with_hooks(ids, attention_mask=mask, fwd_hooks=patch_heads(model, {2: [0, 7]}, clean_cache))

The model is used to check layers, heads and hook names when the hooks are built (a typo fails at once, not
in the middle of a run) and, for uniform ablation, to read the padding of the run the hooks fire in. Before
this order was fixed, ``patch_heads(heads, source)`` and ``patch_activation(names, source)`` took no model;
that form still works for now and warns (``FutureWarning``).

transformers 5 accepts ``head_mask`` and silently ignores it; these hooks are the working alternative.
"""

from __future__ import annotations

import operator
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import torch
from bertscope.hooks.cache import ActivationCache
from bertscope.hooks.hook_points import HookFn, HookPoint, NamesFilter
from bertscope.hooks.sites import is_attention_site
from bertscope.models.text import as_batch

HeadSpec = Mapping[int, Sequence[int] | int] | Iterable[tuple[int, int] | str] | tuple[int, int] | str
FwdHooks = list[tuple[NamesFilter, HookFn]]
AblationMethod = Literal["zero", "mean", "uniform"]

_PER_HEAD_SITES = ("hook_q", "hook_k", "hook_v", "hook_z", "hook_result", "hook_scores", "hook_pattern")


def ablate_heads(
    model: torch.nn.Module,
    heads: HeadSpec,
    method: AblationMethod = "zero",
    *,
    reference: Mapping[int, torch.Tensor] | None = None,
    attention_mask: torch.Tensor | None = None,
) -> FwdHooks:
    """Hooks that knock out the given heads (``heads``: ``{layer: [head, ...]}``, ``{layer: head}``,
    ``[(layer, head), ...]``, ``(layer, head)`` or names ``"L3H5"``; see :func:`parse_heads`).

    - ``"zero"``: the head's output ``z`` is set to 0, so it writes nothing (equal to zeroing its slice of
      ``W_O``; the output bias stays).
    - ``"mean"``: ``z`` is replaced by its mean over real tokens of a reference batch: ``reference`` maps
      layer to ``[head, d_head]``, as made by ``mean_z``.
    - ``"uniform"``: the head's attention pattern is replaced by a uniform distribution over the real keys of
      the run the hooks fire in. The padding is read from that run (``model.current_attention_mask``), so a
      padded batch is handled without passing anything; an ``attention_mask`` ``[batch, key]`` given here must
      equal the run's, else the hook raises (it would otherwise average over the wrong keys).
    """
    spec = _normalise(heads, model.config.n_layers, model.config.n_heads)
    hooks: FwdHooks = []
    for layer, idx in spec.items():
        if method == "zero":
            hooks.append((f"blocks.{layer}.attn.hook_z", _set_heads(idx, dim=2, value=0.0)))
        elif method == "mean":
            if reference is None or layer not in reference:
                raise ValueError(
                    f"mean ablation needs reference[{layer}] = mean z [head, d_head]; compute it with "
                    "hooks.mean_z(model, input_ids, attention_mask) on a reference batch"
                )
            hooks.append((f"blocks.{layer}.attn.hook_z", _set_heads(idx, dim=2, value=reference[layer][idx])))
        elif method == "uniform":
            hooks.append((f"blocks.{layer}.attn.hook_pattern", _uniform_heads(idx, attention_mask, model)))
        else:
            raise ValueError(f"unknown ablation method {method!r}; use 'zero', 'mean' or 'uniform'")
    return hooks


@torch.no_grad()
def mean_z(
    model: torch.nn.Module,
    input_ids: torch.Tensor | str | list[str],
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
) -> dict[int, torch.Tensor]:
    """Mean of every head's ``z`` over the real tokens of a reference batch: ``{layer: [head, d_head]}``.

    ``input_ids``: token ids ``[batch, pos]`` (with their mask), or text."""
    if isinstance(input_ids, (str, list, tuple, Mapping)):
        input_ids, attention_mask, token_type_ids = as_batch(model, input_ids, attention_mask, token_type_ids)
    _, cache = model.run_with_cache(
        input_ids, attention_mask, token_type_ids, names_filter="blocks.*.attn.hook_z"
    )
    real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    real = real.to(next(iter(cache.values())).device)
    return {layer: cache[f"blocks.{layer}.attn.hook_z"][real].mean(dim=0) for layer in cache.layers("attn.hook_z")}


def patch_activation(model: torch.nn.Module, names: NamesFilter, source: ActivationCache | None = None, *,
                     positions: torch.Tensor | Sequence[int] | None = None) -> FwdHooks:
    """Hooks that overwrite the named activations (a name, glob, list or predicate; None = every hook
    point) with ``source``'s (e.g. a clean run's cache).

    ``positions`` restricts the patch to those sequence positions (dim 1 of ``[batch, pos, ...]`` tensors,
    the query dim of ``[batch, head, query, key]`` ones). Names ``source`` lacks raise ``KeyError`` here.
    """
    if not isinstance(model, torch.nn.Module):  # the old order: patch_activation(names, source)
        _old_order("patch_activation", "patch_activation(model, names, source)")
        if source is None:
            model, names, source = None, model, names
        else:
            raise TypeError("patch_activation takes (model, names, source); got no model first")
    if model is not None:
        missing = [n for n in model.select_hooks(names) if n not in source]
        if names is not None and missing:
            raise KeyError(f"patch source has no {missing[:3]}; cache them in the source run")

    def patch(tensor: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        if hook.name not in source:
            raise KeyError(f"patch source has no {hook.name}; cache it in the source run")
        src = source[hook.name].to(device=tensor.device, dtype=tensor.dtype)
        if src.shape != tensor.shape:
            raise ValueError(f"cannot patch {hook.name}: source {tuple(src.shape)} vs run {tuple(tensor.shape)}")
        if positions is None:
            return src
        out = tensor.clone()
        pos = torch.as_tensor(positions, device=tensor.device)
        dim = 2 if is_attention_site(hook.name) else 1
        out.index_copy_(dim, pos, src.index_select(dim, pos))
        return out

    return [(names, patch)]


def patch_heads(model: torch.nn.Module, heads: HeadSpec, source: ActivationCache | None = None, *,
                site: str = "hook_z") -> FwdHooks:
    """Hooks that overwrite only the given heads' ``site`` (``hook_z``, ``hook_pattern``, ``hook_q``, ...)
    with ``source``'s values; the other heads keep this run's values. ``heads`` as in ``ablate_heads``."""
    if not isinstance(model, torch.nn.Module):  # the old order: patch_heads(heads, source)
        _old_order("patch_heads", "patch_heads(model, heads, source)")
        if source is not None:
            raise TypeError("patch_heads takes (model, heads, source); got no model first")
        model, heads, source = None, model, heads
    if site not in _PER_HEAD_SITES:
        raise ValueError(f"site must be one of {_PER_HEAD_SITES}, got {site!r}")
    if model is None:
        spec = _normalise(heads, None, None)
    else:
        spec = _normalise(heads, model.config.n_layers, model.config.n_heads)
    dim = 1 if is_attention_site(site) else 2
    hooks: FwdHooks = []
    for layer, idx in spec.items():
        name = f"blocks.{layer}.attn.{site}"
        if name not in source:
            raise KeyError(f"patch source has no {name}; cache it in the source run")
        hooks.append((name, _copy_heads(idx, dim, source[name])))
    return hooks


def _old_order(fn: str, new: str) -> None:
    warnings.warn(f"{fn} now takes the model first: {new}. The old order will stop working.", FutureWarning,
                  stacklevel=3)


# ====================================================================== helpers
#: How ``heads`` may be written (the error for anything else lists these).
HEAD_SPELLINGS = ("{layer: [head, ...]}", "{layer: head}", "[(layer, head), ...]", "(layer, head)",
                  "'L3H5' (or 'L3H5,L4H0', a list of such names)")  # fmt: skip
_HEAD_NAME = re.compile(r"\s*L(\d+)\s*H(\d+)\s*", re.IGNORECASE)


def parse_heads(heads: object) -> list[tuple[int, int]]:
    """``(layer, head)`` pairs from any of :data:`HEAD_SPELLINGS`: ``{3: [5, 7]}``, ``{3: 5}``, ``[(3, 5)]``,
    ``(3, 5)``, ``"L3H5"``, ``"L3H5,L4H0"``, ``["L3H5", (4, 0)]``; anything else is a ``TypeError`` that lists
    the accepted spellings."""
    def bad(why: str) -> TypeError:
        return TypeError(f"heads: {why}; write them as one of {', '.join(HEAD_SPELLINGS)}")

    def index(value: object, what: str) -> int:
        try:
            if isinstance(value, bool):
                raise TypeError
            return operator.index(value)  # int, numpy and 0-d torch integers
        except TypeError:
            raise bad(f"{what} {value!r} is not an integer") from None

    if isinstance(heads, str):
        parts = [p for p in heads.replace(";", ",").split(",") if p.strip()]
        matches = [_HEAD_NAME.fullmatch(p) for p in parts]
        if not parts or not all(matches):
            raise bad(f"cannot read {heads!r} as head names like 'L3H5'")
        return [(int(m.group(1)), int(m.group(2))) for m in matches if m]
    if isinstance(heads, Mapping):
        pairs = []
        for layer, hs in heads.items():
            hs = hs.tolist() if hasattr(hs, "tolist") else hs  # numpy / torch index arrays
            hs = hs if isinstance(hs, Iterable) and not isinstance(hs, str) else [hs]
            pairs += [(index(layer, "layer"), index(h, "head")) for h in hs]
        return pairs
    if isinstance(heads, tuple) and len(heads) == 2 and not any(isinstance(x, (tuple, list, str)) for x in heads):
        return [(index(heads[0], "layer"), index(heads[1], "head"))]
    if not isinstance(heads, Iterable):
        raise bad(f"got {type(heads).__name__}")
    pairs = []
    for item in heads:
        if isinstance(item, str):
            pairs += parse_heads(item)
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            pairs.append((index(item[0], "layer"), index(item[1], "head")))
        else:
            raise bad(f"cannot read {item!r} as one head")
    return pairs


def _normalise(heads: HeadSpec, n_layers: int | None, n_heads: int | None) -> dict[int, list[int]]:
    spec: dict[int, list[int]] = {}
    for layer, h in parse_heads(heads):
        if n_layers is not None and not 0 <= layer < n_layers:
            raise ValueError(f"layer {layer} out of range 0..{n_layers - 1}")
        if n_heads is not None and not 0 <= h < n_heads:
            raise ValueError(f"head {h} out of range 0..{n_heads - 1}")
        spec.setdefault(int(layer), []).append(int(h))
    return spec


def _set_heads(idx: list[int], dim: int, value: float | torch.Tensor) -> HookFn:
    def fn(tensor: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        out = tensor.clone()
        sel = [slice(None)] * tensor.dim()
        sel[dim] = idx
        out[tuple(sel)] = value.to(tensor) if isinstance(value, torch.Tensor) else value
        return out

    return fn


def _uniform_heads(idx: list[int], attention_mask: torch.Tensor | None, model: torch.nn.Module) -> HookFn:
    def fn(pattern: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        b, _, q, k = pattern.shape
        ones = torch.ones(b, k, dtype=pattern.dtype, device=pattern.device)
        records = hasattr(model, "current_attention_mask")  # the Encoder records the mask of the run
        run = getattr(model, "current_attention_mask", None)
        run = ones if run is None else run.to(ones)  # no mask: the model attends to every key
        if attention_mask is None:
            keep = run if records else ones
        else:
            if attention_mask.shape != (b, k):
                raise ValueError(f"attention_mask {tuple(attention_mask.shape)} does not fit the run ({b}, {k})")
            keep = attention_mask.to(ones)
            if records and not torch.equal(keep, run):
                raise ValueError(
                    "the attention_mask given to ablate_heads differs from the one the model ran with; leave it "
                    "out (the run's mask is used) or pass the same one"
                )
        uniform = (keep / keep.sum(dim=-1, keepdim=True))[:, None, :].expand(b, q, k)
        out = pattern.clone()
        out[:, idx] = uniform[:, None]
        return out

    return fn


def _copy_heads(idx: list[int], dim: int, src: torch.Tensor) -> HookFn:
    def fn(tensor: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        if src.shape != tensor.shape:
            raise ValueError(f"cannot patch {hook.name}: source {tuple(src.shape)} vs run {tuple(tensor.shape)}")
        out = tensor.clone()
        sel = [slice(None)] * tensor.dim()
        sel[dim] = idx
        out[tuple(sel)] = src.to(tensor)[tuple(sel)]
        return out

    return fn
