"""Head-level interventions, written as lists of ``(hook name, fn)`` for ``model.hooks`` / ``run_with_hooks``.

>>> with model.hooks(ablate_heads(model, {3: [5]}, method="zero")):
...     ablated = model(ids, mask)
>>> out = model.run_with_hooks(ids, attention_mask=mask, fwd_hooks=patch_heads({2: [0, 7]}, clean_cache))

transformers 5 accepts ``head_mask`` and silently ignores it; these hooks are the working alternative.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import torch
from bertscope.hooks.cache import ActivationCache
from bertscope.hooks.hook_points import HookFn, HookPoint, NamesFilter

HeadSpec = Mapping[int, Sequence[int]] | Iterable[tuple[int, int]]
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
    """Hooks that knock out the given heads.

    - ``"zero"``: the head's output ``z`` is set to 0, so it writes nothing (equal to zeroing its slice of
      ``W_O``; the output bias stays).
    - ``"mean"``: ``z`` is replaced by its mean over real tokens of a reference batch: ``reference`` maps
      layer to ``[head, d_head]``, as made by ``mean_z``.
    - ``"uniform"``: the head's attention pattern is replaced by a uniform distribution over the real keys
      (``attention_mask`` ``[batch, key]`` of the run the hooks will be used in; None = no padding).
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
            hooks.append((f"blocks.{layer}.attn.hook_pattern", _uniform_heads(idx, attention_mask)))
        else:
            raise ValueError(f"unknown ablation method {method!r}; use 'zero', 'mean' or 'uniform'")
    return hooks


@torch.no_grad()
def mean_z(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
) -> dict[int, torch.Tensor]:
    """Mean of every head's ``z`` over the real tokens of a reference batch: ``{layer: [head, d_head]}``."""
    _, cache = model.run_with_cache(
        input_ids, attention_mask, token_type_ids, names_filter="blocks.*.attn.hook_z"
    )
    real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    real = real.to(next(iter(cache.values())).device)
    return {layer: cache[f"blocks.{layer}.attn.hook_z"][real].mean(dim=0) for layer in cache.layers("attn.hook_z")}


def patch_activation(
    names: NamesFilter, source: ActivationCache, *, positions: torch.Tensor | Sequence[int] | None = None
) -> FwdHooks:
    """Hooks that overwrite the named activations with ``source``'s (e.g. a clean run's cache).

    ``positions`` restricts the patch to those sequence positions (dim 1 of ``[batch, pos, ...]`` tensors,
    the query dim of ``[batch, head, query, key]`` ones).
    """

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
        dim = 2 if hook.name.endswith(("hook_scores", "hook_pattern")) else 1
        out.index_copy_(dim, pos, src.index_select(dim, pos))
        return out

    return [(names, patch)]


def patch_heads(heads: HeadSpec, source: ActivationCache, *, site: str = "hook_z") -> FwdHooks:
    """Hooks that overwrite only the given heads' ``site`` (``hook_z``, ``hook_pattern``, ``hook_q``, ...)
    with ``source``'s values; the other heads keep this run's values."""
    if site not in _PER_HEAD_SITES:
        raise ValueError(f"site must be one of {_PER_HEAD_SITES}, got {site!r}")
    spec = _normalise(heads, None, None)
    dim = 1 if site in ("hook_scores", "hook_pattern") else 2
    hooks: FwdHooks = []
    for layer, idx in spec.items():
        name = f"blocks.{layer}.attn.{site}"
        if name not in source:
            raise KeyError(f"patch source has no {name}; cache it in the source run")
        hooks.append((name, _copy_heads(idx, dim, source[name])))
    return hooks


# ====================================================================== helpers
def _normalise(heads: HeadSpec, n_layers: int | None, n_heads: int | None) -> dict[int, list[int]]:
    pairs = (
        [(layer, h) for layer, hs in heads.items() for h in hs] if isinstance(heads, Mapping) else list(heads)
    )
    spec: dict[int, list[int]] = {}
    for layer, h in pairs:
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


def _uniform_heads(
    idx: list[int], attention_mask: torch.Tensor | None
) -> HookFn:
    def fn(pattern: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        b, _, q, k = pattern.shape
        if attention_mask is None:
            keep = torch.ones(b, k, dtype=pattern.dtype, device=pattern.device)
        else:
            if attention_mask.shape != (b, k):
                raise ValueError(f"attention_mask {tuple(attention_mask.shape)} does not fit the run ({b}, {k})")
            keep = attention_mask.to(device=pattern.device, dtype=pattern.dtype)
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
