"""The model passes of the heads experiment, on plain arguments (a model, encoded batches, ``Settings``).

``attention_pass`` reads patterns and values once over a corpus and returns per-sentence statistics, head
distances and arc hits; ``importance_pass`` runs ablations, gradient importance and pruning curves. Both
return dicts of arrays (what the step cache stores); only ``experiment.run`` sees the run context.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import einops
import numpy as np
import torch
from bertscope.experiments import attention
from bertscope.experiments.activations import CaptureSource, batch_activations
from bertscope.experiments.heads import gradients as grads
from bertscope.experiments.heads import importance as imp
from bertscope.experiments.heads import pruning
from bertscope.experiments.heads import similarity as sim
from bertscope.experiments.heads import statistics as hs
from bertscope.experiments.heads import syntax as syn
from bertscope.experiments.heads.parallel import map_sentences

if TYPE_CHECKING:
    from bertscope.experiments.heads.experiment import Settings

PUNCTUATION = (".", ",")
SCALARS = (*hs.SCALAR_METRICS, *hs.NORM_METRICS)  # per-sentence statistics, in array order
Progress = Callable[[Iterable[Any], str, int], Iterable[Any]]


def _no_progress(it: Iterable[Any], desc: str, total: int) -> Iterable[Any]:
    return it


def _counted(progress: Progress, desc: str, total: int) -> Callable[[Iterable[Any]], Iterable[Any]]:
    """``progress`` with its description and total fixed: the one-argument wrapper ``map_sentences`` takes."""
    return lambda it: progress(it, desc, total)


def attention_sites(n_layers: int) -> list[str]:
    """The sites the attention pass reads: every layer's ``attn.hook_pattern`` and ``attn.hook_v``."""
    return [f"blocks.{i}.attn.{h}" for i in range(n_layers) for h in ("hook_pattern", "hook_v")]


def attention_pass(
    model: Any, batches: Sequence[Any], corpus: Any, settings: Settings, progress: Progress = _no_progress,
    capture: CaptureSource | None = None,
) -> dict[str, np.ndarray]:
    """One forward pass over ``batches`` (the encoded ``corpus``): per-sentence statistics, head distances
    and arc hits, plus ``n_truncated`` (a scalar: truncated sentences left out of the syntax scores). The
    patterns and values come from the activations stage: a forward per batch (in the worker that measures it),
    or ``capture``.

    arrays: ``scalars [sentence, layer, head, metric]`` (order ``SCALARS``), ``offsets [sentence, layer, head,
    2 * max_offset + 1]``, ``distances [sentence, layer*head, layer*head]`` (first ``distance_sentences``),
    and, with gold trees, ``head_hits``, ``offset_hits``, ``relations``, ``arc_sentences``.
    """
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    tok = model.tokenizer
    special = {"cls": tok.cls_token_id, "sep": tok.sep_token_id, "punct": punctuation_ids(tok)}
    max_offset = max(b.input_ids.shape[1] for b in batches) - 1  # no argmax can lie further away
    n = len(corpus)
    out = {
        "scalars": np.full((n, n_layers, n_heads, len(SCALARS)), np.nan),
        "offsets": np.zeros((n, n_layers, n_heads, 2 * max_offset + 1), dtype=np.float32),
        "distances": np.zeros((min(n, settings.distance_sentences), n_layers * n_heads, n_layers * n_heads),
                              dtype=np.float32),
    }  # fmt: skip
    arc_parts: list[syn.ArcHits] = []
    skipped_syntax = 0

    def one(batch: Any) -> dict[str, Any]:
        return _attention_batch(model, batch, corpus, settings, special, max_offset, capture)

    wrap = lambda it: progress(it, "attention statistics", len(batches))  # noqa: E731
    device = next(model.parameters()).device
    for part in map_sentences(one, batches, settings.workers, wrap, device):  # batch order: arcs keep their order
        out["scalars"][part["index"]], out["offsets"][part["index"]] = part["scalars"], part["offsets"]
        for si, distance in part["distances"].items():
            out["distances"][si] = distance
        arc_parts += part["hits"]
        skipped_syntax += part["truncated"]
    if arc_parts:
        hits = syn.ArcHits.concat(arc_parts)
        out.update(head_hits=hits.head_hits, offset_hits=hits.offset_hits, relations=hits.relations.astype(str),
                   arc_sentences=hits.sentences)  # fmt: skip
    out["n_truncated"] = np.asarray(skipped_syntax)
    return out


def _attention_batch(
    model: Any, batch: Any, corpus: Any, settings: Settings, special: dict[str, Any], max_offset: int,
    capture: CaptureSource | None = None,
) -> dict[str, Any]:
    """One batch of ``attention_pass``: ``index`` (its sentences), their ``scalars`` and ``offsets`` rows,
    ``distances`` ``{sentence: [layer*head, layer*head]}`` (sentences below ``distance_sentences``), arc
    ``hits`` (a list of ``ArcHits``) and the number of ``truncated`` sentences with gold trees."""
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    index = np.asarray(batch.sentence_index)
    local = {
        "scalars": np.full((len(index), n_layers, n_heads, len(SCALARS)), np.nan),
        "offsets": np.zeros((len(index), n_layers, n_heads, 2 * max_offset + 1), dtype=np.float32),
    }
    acts = batch_activations(model, batch, attention_sites(n_layers), corpus=corpus, capture=capture, device="cpu")
    # [layer, batch, head, q, k]
    patterns = torch.stack([acts[f"blocks.{layer}.attn.hook_pattern"] for layer in range(n_layers)])
    values = [acts[f"blocks.{layer}.attn.hook_v"] for layer in range(n_layers)]
    W_O = [block.attn.W_O.detach().cpu() for block in model.blocks]
    _batch_statistics(local, patterns, values, W_O, batch, special, max_offset, rows=np.arange(len(index)))
    distances, hits, truncated = {}, [], 0
    for b, si in enumerate(index.tolist()):
        real = batch.attention_mask[b].cpu().bool()
        sentence_pattern = patterns[:, b][..., real, :][..., real]  # [layer, head, n, n], padding dropped
        if si < settings.distance_sentences:
            distances[si] = sim.head_distances(einops.rearrange(sentence_pattern, "l h q k -> (l h) q k")).numpy()
        arc = _arc_hits(sentence_pattern, batch, b, real, corpus[si], si, settings.collapse_subtypes)
        truncated += arc == "truncated"
        if isinstance(arc, syn.ArcHits):
            hits.append(arc)
    return {"index": index, **local, "distances": distances, "hits": hits, "truncated": truncated}


def _batch_statistics(
    out: dict[str, np.ndarray],
    patterns: torch.Tensor,
    values: list[torch.Tensor],
    W_O: list[torch.Tensor],
    batch: Any,
    special: dict[str, Any],
    max_offset: int,
    rows: np.ndarray | None = None,
) -> None:
    """Fill ``out["scalars"]`` and ``out["offsets"]`` for the sentences of one batch (at ``rows``, default their
    sentence indices).

    patterns ``[layer, batch, head, q, k]``; values per layer ``[batch, pos, head, d_head]`` (``hook_v``);
    W_O per layer ``[head, d_head, d_model]``; special: the ids of ``cls``, ``sep`` and ``punct`` (a list).
    """
    ids, mask = batch.input_ids.cpu(), batch.attention_mask.cpu()
    idx = np.asarray(batch.sentence_index) if rows is None else rows
    masks = {
        "cls_mask": ids == special["cls"],
        "sep_mask": ids == special["sep"],
        "punct_mask": torch.isin(ids, torch.tensor(special["punct"], dtype=ids.dtype)),
    }
    for layer, (v, w) in enumerate(zip(values, W_O, strict=True)):
        norms = attention.value_norms(v, w)
        stats = hs.attention_statistics(patterns[layer], mask, **masks, value_norms=norms, max_offset=max_offset)
        for k, name in enumerate(SCALARS):
            out["scalars"][idx, layer, :, k] = stats.scalars[name].numpy()
        out["offsets"][idx, layer] = stats.offset_fraction.numpy()


def _arc_hits(
    patterns: torch.Tensor,
    batch: Any,
    b: int,
    real: torch.Tensor,
    sentence: Any,
    si: int,
    collapse_subtypes: bool = False,
) -> syn.ArcHits | str | None:
    """Arc hits of row ``b`` (patterns ``[layer, head, q, k]`` over its real tokens ``real [pos]``, padding
    dropped); None without a gold tree, "truncated" when words were cut (the gold tree no longer fits)."""
    from bertscope.experiments.corpus import word_attention

    if sentence.heads is None:
        return None
    if batch.truncated[b]:
        return "truncated"
    word_maps = word_attention(patterns, batch.word_ids[b].cpu()[real])  # padding has no word: same maps
    return syn.sentence_arc_hits(word_maps, sentence.heads, sentence.deprels, si,
                                 collapse_subtypes=collapse_subtypes)  # fmt: skip


def importance_pass(
    model: Any,
    batches: Sequence[Any],
    settings: Settings,
    *,
    seed: int,
    rng: np.random.Generator,
    progress: Progress = _no_progress,
    gradient_batches: Sequence[Any] | None = None,
) -> dict[str, np.ndarray]:
    """Ablation effects, gradient importance and pruning curves on ``batches``, rows in corpus order.

    ``gradient_batches``: the same sentences batched for the gradient pass (default ``batches``); the projection
    objective draws its random directions batch by batch, so its batching is part of the seeded result.
    ``rng`` draws the ``settings.pruning_random_orders`` random pruning orders. Returns ``effects [sentence,
    method, layer, head, measure]``, ``grad [sentence, layer, head]``, ``pruning [sentence, order, count,
    measure]`` (importance orders chosen held-out), ``pruning_random [sentence, random order, count, measure]``,
    their labels, and with an MLM head Michel et al.'s per-sentence ``michel_sums`` / ``michel_tokens``.
    """
    order = np.concatenate([b.sentence_index for b in batches])
    inverse = np.argsort(order)  # back to corpus order
    n_sentences = len(order)
    effects, measures = imp.ablation_effects(model, batches, methods=settings.methods, seed=seed,
                                             workers=settings.workers,
                                             progress=lambda it: progress(it, "ablation", n_sentences))  # fmt: skip
    michel = {}
    gradient_batches = batches if gradient_batches is None else gradient_batches
    grad_inverse = np.argsort(np.concatenate([b.sentence_index for b in gradient_batches]))
    counted = progress(gradient_batches, "gradient importance (batches)", len(gradient_batches))
    if imp.has_mlm_head(model):
        sums, tokens = grads.michel_importance(model, counted, seed=seed)
        grad, objective = sums / tokens[:, None, None], "mlm"
        michel = {"michel_sums": sums[grad_inverse], "michel_tokens": tokens[grad_inverse]}
    else:
        grad, objective = grads.gradient_importance(model, counted, objective="projection",
                                                    n_projections=settings.n_projections, seed=seed)  # fmt: skip
    effects, grad = effects[inverse], grad[grad_inverse]
    out = {
        "effects": effects,
        "measures": np.asarray(measures, dtype=str),
        "methods": np.asarray(settings.methods, dtype=str),
        "grad": grad,
        "objective": np.asarray(objective),
    }
    return {**out, **_pruning(model, batches, effects, grad, settings, seed, rng, inverse, progress), **michel}


def _pruning(
    model: Any,
    batches: Sequence[Any],
    effects: np.ndarray,
    grad: np.ndarray,
    settings: Settings,
    seed: int,
    rng: np.random.Generator,
    inverse: np.ndarray,
    progress: Progress = _no_progress,
) -> dict[str, np.ndarray]:
    """Pruning curves of the held-out importance orders and of the random orders (batched masks, ``pruning``);
    ``progress`` counts sentences of each of the three passes (random orders, then each held-out half).

    An importance order is chosen on one half of the sentences (``statistics.heldout_folds``) and its curve read
    on the other half, both ways round (so it runs on that half only); the random orders run on every sentence.
    """
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    total = n_layers * n_heads
    counts = sorted({round(i * total / settings.pruning_points) for i in range(settings.pruning_points + 1)})
    fold = hs.heldout_folds(len(effects), seed)  # [sentence] in corpus order: 0/1
    zero = list(settings.methods).index("zero") if "zero" in settings.methods else 0
    ablation = effects[:, zero, :, :, imp.OUTPUT_MEASURES.index("pooled_cos")]  # [sentence, layer, head]
    names, flat_orders = [], []
    for label, score, directions in (("gradient", grad, ("least", "most")),
                                     (f"ablation ({settings.methods[zero]})", ablation, ("least",))):  # fmt: skip
        for which in directions:
            sign = 1 if which == "least" else -1
            names.append(f"{label}, {which} important first")
            flat_orders += [np.argsort(sign * score[fold != f].mean(0).ravel(), kind="stable") for f in (0, 1)]
    flat_orders += [rng.permutation(total) for _ in range(settings.pruning_random_orders)]
    keep = pruning.pruning_keeps([[divmod(int(i), n_heads) for i in o] for o in flat_orders], counts, n_layers,
                                 n_heads)  # fmt: skip
    n_chosen = 2 * len(names)
    workers = settings.workers
    random = pruning.pruning_curves(model, batches, keep[n_chosen:], workers=workers, progress=_counted(
        progress, f"pruning curves, {settings.pruning_random_orders} random orders", len(effects)))[inverse]
    heldout = np.zeros((len(effects), len(names), *random.shape[2:]))
    for f in (0, 1):  # the orders chosen without half f (keep[f::2]) are read on half f only
        rows = [fold[np.asarray(b.sentence_index)] == f for b in batches]
        sub = [_rows(b, r) for b, r in zip(batches, rows, strict=True) if r.any()]
        index = np.concatenate([np.asarray(b.sentence_index)[r] for b, r in zip(batches, rows, strict=True)])
        heldout[index] = pruning.pruning_curves(model, sub, keep[f:n_chosen:2], workers=workers, progress=_counted(
            progress, f"pruning curves, chosen orders on half {f + 1} of 2", len(index)))
    return {
        "pruning": heldout,  # [sentence, order, count, measure]
        "pruning_orders": np.asarray(names, dtype=str),
        "pruning_random": random,  # [sentence, random order, count, measure]
        "pruning_counts": np.asarray(counts),
    }


def _rows(batch: Any, rows: np.ndarray) -> imp.TokenBatch:
    """The sentences ``rows [batch]`` (bool) of a batch, trailing all-padding positions dropped."""
    keep = torch.as_tensor(rows)
    width = int(batch.attention_mask[keep].sum(-1).max())  # right padding: positions past the longest are padding
    cut = [None if t is None else t[keep][:, :width] for t in (batch.input_ids, batch.attention_mask,
                                                               batch.token_type_ids,
                                                               getattr(batch, "special_mask", None))]  # fmt: skip
    return imp.TokenBatch(*cut)


def punctuation_ids(tokenizer: Any) -> list[int]:
    """Ids of the single-token punctuation marks ``PUNCTUATION`` (ValueError when one is missing)."""
    vocab = tokenizer.get_vocab()
    missing = [p for p in PUNCTUATION if p not in vocab]
    if missing:
        raise ValueError(f"the tokenizer has no single token for {missing}; punctuation masses need '.' and ','")
    return [vocab[p] for p in PUNCTUATION]
