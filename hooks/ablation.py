"""Head gates: many partial or full head ablations in one forward pass, as ``(hook name, fn)`` lists.

The batch is replicated ``C`` times (copy-major, ``[(copy batch), pos]``) and copy ``c`` keeps head ``(L, h)``
to degree ``keep[c, L, h]``: ``z' = keep * z + (1 - keep) * replacement`` at ``blocks.L.attn.hook_z``
(``[batch, pos, head, d_head]``), with the replacement of :data:`interventions.AblationMethod`:

- ``zero``: 0 (the head writes nothing; same as zeroing its slice of ``W_O``);
- ``mean``: its mean ``z`` over real tokens (``mean_z_over`` ``[layer, head, d_head]``);
- ``uniform``: ``mean_k v[k]`` over the real keys (the output of a uniform pattern, without materialising it).

``ablate_heads`` (interventions) is the one-configuration form; these gates are what ablation sweeps and
gradient importance need (a gate can be fractional, or a tensor that requires grad).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import einops
import torch
from bertscope.hooks.interventions import AblationMethod, FwdHooks

METHODS: tuple[AblationMethod, ...] = ("zero", "mean", "uniform")


def single_head_keep(n_layers: int, n_heads: int, layer: int) -> torch.Tensor:
    """``keep [head, layer, head]`` for `head_gates`: copy ``h`` of a batch ablates head ``h`` of ``layer`` only."""
    keep = torch.ones(n_heads, n_layers, n_heads)
    keep[torch.arange(n_heads), layer, torch.arange(n_heads)] = 0.0
    return keep


def head_gates(
    keep: torch.Tensor,
    *,
    n_batch: int,
    method: AblationMethod = "zero",
    mean_z: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    first_layer: int = 0,
) -> FwdHooks:
    """Hooks gating every head of a replicated batch.

    Args:
        keep: ``[copy, layer, head]`` in [0, 1] (1 = untouched); layers whose gates are all 1 get no hook.
        n_batch: sentences per copy (the replicated batch is ``[(copy n_batch), pos]``).
        mean_z: ``[layer, head, d_head]`` for ``method="mean"`` (see :func:`mean_z_over`).
        attention_mask: ``[(copy n_batch), pos]`` of the replicated batch, for ``method="uniform"``.
        first_layer: layers before it are not hooked (a run that starts at ``blocks.{first_layer}``).
    """
    if method not in METHODS:
        raise ValueError(f"unknown ablation method {method!r}; use one of {METHODS}")
    if method == "mean" and mean_z is None:
        raise ValueError("method='mean' needs mean_z [layer, head, d_head]; compute it with mean_z_over")
    if method == "uniform" and attention_mask is None:
        raise ValueError("method='uniform' needs the replicated batch's attention_mask")
    real = attention_mask.to(torch.bool) if attention_mask is not None else None
    hooks: FwdHooks = []
    values: dict[int, torch.Tensor] = {}
    for layer in range(first_layer, keep.shape[1]):
        if bool((keep[:, layer] == 1).all()):
            continue
        g = einops.repeat(keep[:, layer], "c h -> (c b) 1 h 1", b=n_batch)

        def replace(z: torch.Tensor, hook: Any, g: torch.Tensor = g, layer: int = layer) -> torch.Tensor:
            g = g.to(device=z.device, dtype=z.dtype)
            if method == "zero":
                return g * z
            if method == "mean":
                replacement = mean_z[layer].to(device=z.device, dtype=z.dtype)[None, None]
            else:
                w = real.to(device=z.device, dtype=z.dtype)[:, :, None, None]
                replacement = (values[layer] * w).sum(1, keepdim=True) / w.sum(1, keepdim=True)
            return g * z + (1 - g) * replacement

        if method == "uniform":
            hooks.append((f"blocks.{layer}.attn.hook_v", lambda v, hook, layer=layer: values.__setitem__(layer, v)))
        hooks.append((f"blocks.{layer}.attn.hook_z", replace))
    return hooks


@torch.no_grad()
def mean_z_over(model: torch.nn.Module, batches: Iterable[Any]) -> torch.Tensor:
    """Mean of every head's ``z`` over all real tokens of several batches -> ``[layer, head, d_head]`` (in the
    model's dtype; accumulated in float64). Each batch has ``input_ids``, ``attention_mask`` and
    ``token_type_ids`` (``[batch, pos]``); ``interventions.mean_z`` is the one-batch, per-layer-dict form."""
    total, count = None, 0
    for batch in batches:
        _, cache = model.run_with_cache(
            batch.input_ids, batch.attention_mask, batch.token_type_ids, names_filter="blocks.*.attn.hook_z"
        )
        z = cache.stack("attn.hook_z").double()  # [layer, batch, pos, head, d_head]
        real = batch.attention_mask.to(device=z.device, dtype=z.dtype)
        s = torch.einsum("lbphd,bp->lhd", z, real)
        total = s if total is None else total + s
        count += int(real.sum())
    if total is None or count == 0:
        raise ValueError("mean_z_over needs at least one batch with a real token")
    return (total / count).to(next(model.parameters()).dtype)
