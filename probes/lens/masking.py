"""Masked positions for the lenses' training and evaluation: each real, non-special token is replaced by the mask
token with probability ``rate`` (at least one per sentence), and every residual stream is read there.

Shapes: ``s`` stream, ``n`` masked positions, ``m`` d_model, ``b`` batch, ``p`` position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .logit import hidden_states, require_mlm_head


@dataclass(frozen=True)
class MaskedStreams:
    """Every stream at the masked positions of a set of sentences: ``hidden`` ``[stream, n, d_model]`` (on the CPU),
    ``target`` ``[n]`` (the token that was masked), ``sentence`` ``[n]`` (its sentence's index, for intervals)."""

    hidden: torch.Tensor
    target: torch.Tensor
    sentence: torch.Tensor

    def __len__(self) -> int:
        return int(self.target.shape[0])


def choose_masked(
    ids: torch.Tensor, attention_mask: torch.Tensor, specials: set[int], rate: float, generator: torch.Generator
) -> torch.Tensor:
    """Positions to mask ``[batch, pos]`` (bool): each real token whose id is not in ``specials`` with probability
    ``rate``, and the first such token of a row where the draw picked none."""
    if not 0 < rate <= 1:
        raise ValueError(f"the masking rate must be in (0, 1], got {rate}")
    eligible = attention_mask.bool() & ~torch.isin(ids, torch.tensor(sorted(specials), dtype=ids.dtype))
    chosen = eligible & (torch.rand(ids.shape, generator=generator) < rate)
    empty = eligible.any(1) & ~chosen.any(1)
    first = torch.zeros_like(chosen)
    first[torch.arange(ids.shape[0]), eligible.int().argmax(1)] = True
    return chosen | (first & eligible & empty[:, None])


@torch.no_grad()
def masked_streams(
    model: Any,
    inputs: Sequence[str] | tuple[torch.Tensor, torch.Tensor],
    *,
    rate: float = 0.15,
    seed: int = 0,
    batch_size: int = 32,
    mask_id: int | None = None,
) -> MaskedStreams:
    """Mask ``inputs`` (sentences, tokenised with the model's tokenizer, or ``(ids [batch, pos], attention_mask)``)
    and collect every residual stream at the masked positions. ``mask_id`` defaults to the tokenizer's."""
    require_mlm_head(model, "the lenses")
    tok = model.tokenizer
    if mask_id is None:
        if tok is None or tok.mask_token_id is None:
            raise ValueError("the lenses need a mask token: give mask_id or a model with a tokenizer that has one")
        mask_id = int(tok.mask_token_id)
    specials = set() if tok is None else {int(i) for i in tok.all_special_ids}
    generator = torch.Generator().manual_seed(seed)
    n_rows = len(inputs[0]) if isinstance(inputs, tuple) else len(inputs)
    hidden, target, sentence = [], [], []
    for start in range(0, n_rows, batch_size):
        if isinstance(inputs, tuple):
            ids, attn = (t[start : start + batch_size].cpu() for t in inputs)
        else:
            batch = model.tokenize(list(inputs[start : start + batch_size]))
            ids, attn = batch["input_ids"].cpu(), batch["attention_mask"].cpu()
        where = choose_masked(ids, attn, specials, rate, generator)
        masked = ids.masked_fill(where, mask_id)
        streams = hidden_states(model, masked.to(model.device), attn.to(model.device))
        hidden.append(streams[:, where.to(streams.device)].cpu())
        target.append(ids[where])
        sentence.append((torch.arange(ids.shape[0])[:, None] + start).expand_as(ids)[where])
    return MaskedStreams(torch.cat(hidden, 1), torch.cat(target), torch.cat(sentence))
