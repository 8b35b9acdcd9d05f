"""Pieces shared by the families with their own module (DeBERTa-v2/v3, ModernBERT): filling a model from a
mapped state dict with every tensor checked, hook ordering, the attention sublayer's write."""

from __future__ import annotations

import torch
from torch import nn


def fill_checked(model: nn.Module, mapped: dict[str, torch.Tensor], *, source: str, family: str) -> None:
    """Load ``mapped`` (already in this package's names) into ``model``; raise ``CheckpointError`` listing every
    missing, unexpected or mis-shaped tensor."""
    from bertscope.models.loading import CheckpointError

    expected = model.state_dict()
    missing = sorted(set(expected) - set(mapped))
    unexpected = sorted(set(mapped) - set(expected))
    wrong = [
        f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(expected[k].shape)}"
        for k, v in mapped.items()
        if k in expected and tuple(v.shape) != tuple(expected[k].shape)
    ]
    problems = []
    if missing:
        problems.append(f"missing from the checkpoint: {missing}")
    if unexpected:
        problems.append(f"unexpected in the checkpoint: {unexpected}")
    if wrong:
        problems.append(f"wrong shapes: {wrong}")
    if problems:
        raise CheckpointError(f"checkpoint {source} does not fit a {family} encoder:\n  " + "\n  ".join(problems))
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in mapped.items()}, strict=True)


def hook_order(names: list[str], order: dict[str, tuple[str, ...]]) -> list[str]:
    """Sort hook names in forward order. ``order`` maps a top-level module name (``"embed"``, ``"blocks"``, ...)
    to the suffixes in the order its forward reaches them; modules rank in ``order``'s own order."""
    tops = list(order)

    def rank(name: str) -> tuple[int, int, int]:
        parts = name.split(".")
        if parts[0] == "blocks":
            return (tops.index("blocks"), int(parts[1]), order["blocks"].index(".".join(parts[2:])))
        return (tops.index(parts[0]), 0, order[parts[0]].index(".".join(parts[1:])))

    return sorted(names, key=rank)


def attention_output(attn: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """The attention sublayer's write from ``z`` ``[batch, pos, head, d_head]`` (after ``hook_z``): through
    ``hook_result`` when it is hooked (per-head writes ``[batch, pos, head, d_model]``), else the output projection.
    ``attn`` is an ``encoder.Attention`` (or subclass) with ``out``, ``W_O``, ``b_O`` and ``hook_result``."""
    from einops import rearrange

    if attn.hook_result.is_hooked:
        result = torch.einsum("bphd,hdm->bphm", z, attn.W_O)
        hooked = attn.hook_result(result)
        if hooked is not result:
            return hooked.sum(dim=2) + attn.b_O
    return attn.out(rearrange(z, "b p h d -> b p (h d)"))
