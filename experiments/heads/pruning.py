"""Pruning curves: the output change when heads are zero-ablated together, cumulatively along an order.

Many orders are evaluated at once: every (order, count) pair is one ``keep`` mask ``[layer, head]``; identical
masks (``k = 0`` and ``k = all`` are shared by every order) run once, and a mask whose first removed head sits in
layer ``L`` restarts from the clean residual stream at ``L`` (earlier blocks are unchanged), so the cost is one
clean pass plus one partial pass per distinct mask, ``copies_per_pass`` masks per forward. Sentences run one at a
time without padding; the masks of one restart layer share that layer's Q/K/V and attention (they fork at its
head outputs, ``importance.forward_with_heads``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch
from bertscope.experiments.heads.importance import (
    OUTPUT_MEASURES,
    TokenBatch,
    _check_eval,
    _clean_run,
    _device,
    forward_with_heads,
    output_change,
    split_sentences,
)
from bertscope.experiments.heads.parallel import map_sentences


def pruning_keeps(
    orders: Sequence[Sequence[tuple[int, int]]], counts: Sequence[int], n_layers: int, n_heads: int
) -> torch.Tensor:
    """``keep [order, count, layer, head]``: 0 for the first ``counts[c]`` heads of ``orders[o]``, else 1."""
    keep = torch.ones(len(orders), len(counts), n_layers, n_heads)
    for o, order in enumerate(orders):
        if any(not 0 <= k <= len(order) for k in counts):
            raise ValueError(f"counts must lie in 0..{len(order)} (the length of order), got {list(counts)}")
        for c, k in enumerate(counts):
            for layer, head in order[:k]:
                keep[o, c, layer, head] = 0.0
    return keep


def pruning_curves(
    model: torch.nn.Module,
    batches: Iterable[Any],
    keep: torch.Tensor,
    *,
    copies_per_pass: int = 128,
    workers: int = 1,
    progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None,
) -> np.ndarray:
    """Output change of every sentence under every zero-ablation mask ``keep [..., layer, head]`` (0 = removed).

    ``workers``: processes for the sentences (``parallel.map_sentences``; 1 = in this process). ``progress``
    optionally wraps the per-sentence results as they arrive (one unit per sentence).
    Returns ``[sentence, ..., measure]`` float64, measures ``OUTPUT_MEASURES``; sentences in batch order.
    """
    _check_eval(model)
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    lead = tuple(keep.shape[:-2])
    flat = keep.reshape(-1, n_layers, n_heads)
    unique, inverse = torch.unique(flat, dim=0, return_inverse=True)  # [mask, layer, head]
    touched = (unique != 1).flatten(2).any(-1)  # [mask, layer]
    first = torch.where(touched.any(-1), touched.float().argmax(-1), torch.full((len(unique),), n_layers))
    sentences = [s for raw in batches for s in split_sentences(TokenBatch.of(raw))]

    def one(sentence: TokenBatch) -> np.ndarray:  # [flat, measure]
        with torch.no_grad():
            return _sentence_changes(model, sentence, unique, first, copies_per_pass)[inverse].numpy()

    out = map_sentences(one, sentences, workers, progress, device=_device(model))
    curves = np.stack(out) if out else np.zeros((0, len(flat), len(OUTPUT_MEASURES)))
    return curves.reshape(curves.shape[0], *lead, len(OUTPUT_MEASURES))


def _sentence_changes(
    model: torch.nn.Module, sentence: TokenBatch, masks: torch.Tensor, first: torch.Tensor, copies_per_pass: int
) -> torch.Tensor:
    """``[mask, measure]`` output change of one sentence (``[1, pos]``) under ``masks [mask, layer, head]``, each
    run from the clean residual at its first touched layer ``first [mask]`` (``n_layers``: nothing removed)."""
    n_layers = model.config.n_layers
    clean, resid = _clean_run(model, sentence)
    change = torch.zeros(len(masks), len(OUTPUT_MEASURES), dtype=torch.float64)
    for layer in first.unique().tolist():
        if layer == n_layers:  # nothing removed: no change
            continue
        for part in torch.nonzero(first == layer).flatten().split(copies_per_pass):
            hidden = forward_with_heads(model, sentence, masks[part], method="zero", start=(layer, resid[layer]))
            diff = output_change(clean, hidden[:, None], sentence.attention_mask)
            change[part] = torch.stack([diff[m][:, 0] for m in OUTPUT_MEASURES], dim=-1).cpu()
    return change


def pruning_curve(
    model: torch.nn.Module,
    batches: Iterable[Any],
    order: Sequence[tuple[int, int]],
    counts: Sequence[int],
) -> np.ndarray:
    """Output change when the first ``k`` heads of ``order`` are zero-ablated together, for each ``k``.

    Args:
        order: ``(layer, head)`` pairs, removed cumulatively in this order.
        counts: numbers of heads removed (``0 <= k <= len(order)``).

    Returns:
        ``[sentence, count, measure]`` float64 with measures ``OUTPUT_MEASURES``.
    """
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    keep = pruning_keeps([order], counts, n_layers, n_heads)[0]
    return pruning_curves(model, batches, keep)
