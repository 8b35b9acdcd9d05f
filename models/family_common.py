"""Pieces shared by the families with their own module (DeBERTa-v2/v3, ModernBERT): hook ordering and the
attention sublayer's write. (Filling a model from a checkpoint is ``loading.from_state_dict``, for every family.)"""

from __future__ import annotations

import torch
from bertscope.hooks.sites import forward_order
from bertscope.models.encoder import head_results
from torch import nn


def hook_order(names: list[str], order: dict[str, tuple[str, ...]]) -> list[str]:
    """Sort hook names in forward order. ``order`` maps a top-level module name (``"embed"``, ``"blocks"``, ...)
    to the suffixes in the order its forward reaches them; modules rank in ``order``'s own order."""
    return forward_order(names, order)


def attention_output(attn: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """The attention sublayer's write from ``z`` ``[batch, pos, head, d_head]`` (after ``hook_z``): through
    ``hook_result`` when it is hooked (per-head writes ``[batch, pos, head, d_model]``), else the output projection.
    ``attn`` is an ``encoder.Attention`` (or subclass) with ``out``, ``W_O``, ``b_O`` and ``hook_result``."""
    from einops import rearrange

    if attn.hook_result.is_hooked:
        result = head_results(z, attn.W_O)
        hooked = attn.hook_result(result)
        if hooked is not result:
            return hooked.sum(dim=2) + attn.b_O
    return attn.out(rearrange(z, "b p h d -> b p (h d)"))
