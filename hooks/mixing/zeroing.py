"""Value zeroing (Mohebbi et al. 2023): the ``"rerun"`` method of the mixing table.

For every key j, block L is re-run from its true input ``blocks.{L}.hook_resid_pre`` with ``v_j = 0`` in every head;
the score ``[b, L, q, j]`` is the cosine distance of token q's block output to the original one; rows normalised
over real keys. The original output is block L re-run from the same input without the intervention (bitwise
``blocks.{L}.hook_resid_post`` of a forward caching only the residual stream, and computed the same way as the
zeroed runs, so nothing but the zeroing separates them). The input comes from ``cache`` (a forward's or a
capture's): the method needs nothing else.

Shapes: ``b`` batch, ``q``/``k`` query/key positions, ``m`` d_model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from einops import rearrange

SITES = ("hook_resid_pre",)


def chunks(b: int, n: int, chunk_tokens: int) -> list[torch.Tensor]:
    """The groups of zeroed positions: the batch is replicated once per position of a group, ``chunk_tokens``
    tokens at most per group."""
    per = max(1, chunk_tokens // (b * n))
    return [torch.arange(start, min(n, start + per)) for start in range(0, n, per)]


@torch.no_grad()
def value_zeroing(
    model: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    types: torch.Tensor | None,
    layers: Sequence[int],
    chunk_tokens: int,
    cache: Mapping[str, torch.Tensor],
    progress: Callable[[str, int], Any],
) -> torch.Tensor:
    """``[b, L, q, k]`` value-zeroing scores of ``layers`` (see the module docstring). ``progress(desc, total)``
    gives the bar advanced after each (layer, group of zeroed positions)."""
    b, n = ids.shape
    groups = chunks(b, n, chunk_tokens)
    bar = progress("value zeroing (layers x groups of zeroed tokens)", len(layers) * len(groups))
    out = []
    for L in layers:
        x = cache[f"blocks.{L}.hook_resid_pre"].to(model.device)
        y = model.forward_from(L, x, mask, stop_at_layer=L)
        scores = x.new_zeros(b, n, n)
        for zero in groups:
            zero = zero.to(x.device)  # positions zeroed in this group
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
            bar.update(1)
        scores = scores * mask[:, None, :]
        out.append(scores / scores.sum(-1, keepdim=True).clamp_min(1e-30))
    bar.close()
    return torch.stack(out, dim=1)
