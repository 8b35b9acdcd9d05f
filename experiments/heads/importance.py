"""How much the model depends on each head: ablation effects, gradient importance, pruning curves.

Ablations replace a head's output ``z`` (``blocks.L.attn.hook_z``, ``[batch, pos, head, d_head]``):

- ``zero``: ``z_h = 0``, the head writes nothing (same as zeroing its slice of ``W_O``);
- ``mean``: ``z_h`` = its mean over the real tokens of the evaluation sentences (keeps the head's average
  write, removes its token-dependent information);
- ``uniform``: the head attends uniformly to the real keys, ``z_h[q] = mean_k v_h[k]`` (identical to replacing
  its pattern with a uniform one, without materialising patterns).

Output change is measured on the final hidden states: ``hidden_cos`` (1 - cosine per real token, averaged
over the tokens of a sentence) and ``pooled_cos`` (1 - cosine of the mean-pooled sentence embedding, the
output of sentence-transformer checkpoints such as all-MiniLM-L6-v2). ``mlm_loss_change`` (ablated minus
clean masked-LM loss) is added only when the model carries a masked-LM head.

Many ablations run in one forward pass: the batch is replicated ``C`` times and copy ``c`` keeps heads
according to ``keep[c, layer, head]`` (each copy with its own method); single-head ablations start from the
clean residual stream at the ablated layer, since earlier blocks are unchanged. The sweeps run one sentence at
a time, its padding dropped: a one-sentence start residual is shared by all copies, so the start layer's Q/K/V
and attention run once and the copies fork at its head outputs (``forward_with_heads``).

Gradient importance (Michel et al. 2019) lives in ``gradients``, pruning curves in ``pruning``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import einops
import numpy as np
import torch
import torch.nn.functional as F
from bertscope.experiments.heads.parallel import map_sentences
from bertscope.hooks.ablation import METHODS, head_gates, mean_z_over, single_head_keep
from bertscope.hooks.hook_points import fork_batch
from bertscope.hooks.interventions import AblationMethod

METHOD_DESCRIPTIONS = {
    "zero": "z_h = 0 at every position (the head writes nothing; same as zeroing its W_O slice)",
    "mean": "z_h = its mean over the real tokens of the evaluation sentences",
    "uniform": "the head attends uniformly to the real keys: z_h[q] = mean_k v_h[k]",
}
OUTPUT_MEASURES = ("hidden_cos", "pooled_cos")
MLM_MEASURE = "mlm_loss_change"


@dataclass
class TokenBatch:
    """Model inputs ``[batch, pos]`` plus which tokens are special ([CLS]/[SEP]/padding)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor | None = None
    special_mask: torch.Tensor | None = None

    @classmethod
    def of(cls, batch: Any) -> TokenBatch:
        """From anything with ``input_ids``, ``attention_mask`` and optionally ``token_type_ids`` /
        ``special_mask`` attributes (e.g. ``experiments.corpus.Batch``)."""
        return cls(
            batch.input_ids,
            batch.attention_mask,
            getattr(batch, "token_type_ids", None),
            getattr(batch, "special_mask", None),
        )


def ablation_effects(
    model: torch.nn.Module,
    batches: Iterable[Any],
    *,
    methods: Sequence[AblationMethod] = METHODS,
    copies_per_pass: int | None = None,
    mlm_mask_prob: float = 0.15,
    seed: int = 0,
    workers: int = 1,
    progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None,
) -> tuple[np.ndarray, list[str]]:
    """Effect of ablating each head alone, per sentence (``progress`` optionally wraps the sentence loop).

    Args:
        model: an ``Encoder`` in eval mode.
        batches: model inputs (see ``TokenBatch.of``); sentences are numbered in iteration order. The masked-LM
            draws are made batch by batch (so batching is part of a seeded MLM result); the ablations then run
            sentence by sentence without padding (``split_sentences``).
        methods: subset of ``zero``, ``mean``, ``uniform``.
        copies_per_pass: ablations per forward pass (default: every head of a layer under every method).
        mlm_mask_prob: share of real, non-special tokens masked for ``mlm_loss_change``.
        workers: processes for the sentences (``parallel.map_sentences``; 1 = in this process).

    Returns:
        ``(effects, measures)``: ``effects [sentence, method, layer, head, measure]`` float64.
    """
    _check_eval(model)
    batches = [TokenBatch.of(b) for b in batches]
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown ablation method(s) {sorted(unknown)}; use any of {METHODS}")
    mean_z = mean_head_outputs(model, batches) if "mean" in methods else None
    mlm = has_mlm_head(model)
    measures = [*OUTPUT_MEASURES, *([MLM_MEASURE] if mlm else [])]
    per_pass = copies_per_pass or n_heads * len(methods)
    generator = torch.Generator().manual_seed(seed)
    tasks = []  # (sentence [1, pos], its masked-LM copy (ids, labels) or None)
    for batch in batches:
        masked = _mlm_inputs(model, batch, mlm_mask_prob, generator) if mlm else None
        for i, sentence in enumerate(split_sentences(batch)):
            real = batch.attention_mask[i].bool()
            tasks.append((sentence, None if masked is None else (masked[0][i][real][None], masked[1][i][real][None])))

    def one(task: tuple[TokenBatch, tuple[torch.Tensor, torch.Tensor] | None]) -> np.ndarray:
        sentence, masked = task
        effects = torch.zeros(len(methods), n_layers, n_heads, len(measures))
        with torch.no_grad():
            _sentence_effects(model, sentence, None, methods, mean_z, per_pass, effects)
            if masked is not None:  # the same sentence with the batch's draw of masked pieces
                _sentence_effects(model, TokenBatch(masked[0], *_rest(sentence)), masked[1], methods, mean_z,
                                  per_pass, effects)  # fmt: skip
        return effects.double().numpy()

    out = map_sentences(one, tasks, workers, progress, _device(model))
    shape = (0, len(methods), n_layers, n_heads, len(measures))
    return (np.stack(out) if out else np.zeros(shape)), measures


def _sentence_effects(
    model: torch.nn.Module,
    inputs: TokenBatch,
    labels: torch.Tensor | None,
    methods: Sequence[AblationMethod],
    mean_z: torch.Tensor | None,
    per_pass: int,
    effects: torch.Tensor,
) -> None:
    """Fill ``effects [method, layer, head, measure]`` for one sentence (``inputs [1, pos]``): output measures
    without ``labels``, the masked-LM loss change (last measure) with them. Each layer's ablations (every head
    under every method, method-major) fork from the clean residual at that layer (``forward_with_heads``)."""
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    clean, resid = _clean_run(model, inputs)
    clean_loss = _mlm_loss(model, clean, labels) if labels is not None else None
    copy_methods = [m for m in methods for _ in range(n_heads)]
    for layer in range(n_layers):
        keep = single_head_keep(n_layers, n_heads, layer).repeat(len(methods), 1, 1)  # [(method head), layer, head]
        for first in range(0, len(keep), per_pass):
            part = slice(first, first + per_pass)
            hidden = forward_with_heads(model, inputs, keep[part], method=copy_methods[part], mean_z=mean_z,
                                        start=(layer, resid[layer]))  # fmt: skip
            if labels is None:
                change = output_change(clean, hidden[:, None], inputs.attention_mask)
                values = torch.stack([change[name][:, 0] for name in OUTPUT_MEASURES], -1)  # [copy, measure]
                index = slice(0, len(OUTPUT_MEASURES))
            else:
                values = (_mlm_loss(model, hidden, labels.expand(len(hidden), -1)) - clean_loss)[:, None]
                index = slice(effects.shape[-1] - 1, None)
            copies = torch.arange(len(keep))[part]
            effects[:, layer][copies // n_heads, copies % n_heads, index] = values.to(effects.device, effects.dtype)


def forward_with_heads(
    model: torch.nn.Module,
    batch: TokenBatch,
    keep: torch.Tensor,
    *,
    method: AblationMethod | Sequence[AblationMethod] = "zero",
    mean_z: torch.Tensor | None = None,
    start: tuple[int, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Run ``C`` copies of the batch, copy ``c`` with head ``(L, h)`` kept to degree ``keep[c, L, h]``.

    ``z' = keep * z + (1 - keep) * replacement`` (replacement per ``method``; see the module docstring).

    Args:
        batch: inputs ``[batch, pos]``.
        keep: ``[copy, layer, head]`` in [0, 1] (1 = untouched).
        method: one method for every copy, or one per copy (copies of different methods share the pass).
        mean_z: ``[layer, head, d_head]`` for ``method="mean"`` (from ``mean_head_outputs``).
        start: ``(L, resid_pre)`` with ``resid_pre [batch, pos, d_model]`` the clean ``blocks.L.hook_resid_pre``:
            skip the embeddings and blocks before ``L`` (they are unchanged when only heads of layers >= L
            are touched). With one sentence (``batch = 1``) the copies share the residual: blocks run on the
            single stream up to the first gated layer, whose ``hook_z`` forks it into the ``C`` copies (so that
            layer's Q/K/V and attention run once, not ``C`` times).

    Returns:
        Final hidden states ``[(copy batch), pos, d_model]``, copy-major.
    """
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    if keep.ndim != 3 or tuple(keep.shape[1:]) != (n_layers, n_heads):
        raise ValueError(f"keep must be [copy, layer, head] = [C, {n_layers}, {n_heads}], got {tuple(keep.shape)}")
    first_layer = 0 if start is None else start[0]
    if start is not None and bool((keep[:, :first_layer] != 1).any()):
        raise ValueError(f"start at layer {first_layer} but keep touches heads of earlier layers")
    copies, b = keep.shape[0], batch.input_ids.shape[0]
    methods = [method] * copies if isinstance(method, str) else list(method)
    if len(methods) != copies:
        raise ValueError(f"method: one per copy ({copies}) or a single name, got {len(methods)}")
    rep = _replicate(batch, copies)
    hooks = []
    shared = start is not None and b == 1 and start[1].shape[0] == 1
    if shared:  # fork the single stream at the first gated layer (before any gate of that layer)
        gated = (keep != 1).flatten(2).any(-1).any(0)  # [layer]
        if bool(gated.any()):
            fork = int(gated.float().argmax())
            hooks.append((f"blocks.{fork}.attn.hook_z", fork_batch(copies)))
    for name in dict.fromkeys(methods):  # each method gates its own copies; the others pass through (gate 1)
        own = torch.tensor([m == name for m in methods])
        hooks += head_gates(torch.where(own[:, None, None], keep, torch.ones(())), n_batch=b, method=name,
                            mean_z=mean_z, attention_mask=rep.attention_mask, first_layer=first_layer)  # fmt: skip
    with model.hooks(hooks):
        if start is None:
            return model(rep.input_ids, rep.attention_mask, rep.token_type_ids)
        if shared:
            hidden = model.forward_from(first_layer, start[1], batch.attention_mask)
            return hidden.expand(copies, *hidden.shape[1:])  # no gate at all: the copies are the clean stream
        resid = einops.repeat(start[1], "b p m -> (c b) p m", c=copies)
        return model.forward_from(first_layer, resid, rep.attention_mask)


def mean_head_outputs(model: torch.nn.Module, batches: Iterable[Any]) -> torch.Tensor:
    """Mean of every head's ``z`` over all real tokens of ``batches`` -> ``[layer, head, d_head]``
    (``hooks.ablation.mean_z_over`` on token batches)."""
    return mean_z_over(model, [TokenBatch.of(b) for b in batches])


def output_change(clean: torch.Tensor, ablated: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Cosine distances between clean and ablated outputs.

    Args:
        clean: ``[batch, pos, d_model]``; ablated: ``[copy, batch, pos, d_model]``; attention_mask ``[batch, pos]``.

    Returns:
        ``{"hidden_cos": [copy, batch], "pooled_cos": [copy, batch]}`` float64.
    """
    clean, ablated = clean.double(), ablated.double()
    real = attention_mask.to(device=clean.device, dtype=clean.dtype)
    token = 1.0 - F.cosine_similarity(ablated, clean[None], dim=-1)  # [copy, batch, pos]
    hidden = (token * real).sum(-1) / real.sum(-1)
    pooled_clean = mean_pool(clean, attention_mask)
    pooled = torch.stack([mean_pool(a, attention_mask) for a in ablated])
    return {"hidden_cos": hidden, "pooled_cos": 1.0 - F.cosine_similarity(pooled, pooled_clean[None], dim=-1)}


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean over real tokens: ``[batch, pos, d_model] -> [batch, d_model]``."""
    real = attention_mask.to(device=hidden.device, dtype=hidden.dtype)[..., None]
    return (hidden * real).sum(-2) / real.sum(-2)


def split_sentences(batch: TokenBatch) -> list[TokenBatch]:
    """One ``[1, n]`` batch per sentence of ``batch`` with its padding dropped (``n`` = its real tokens)."""
    out = []
    for i in range(batch.input_ids.shape[0]):
        real = batch.attention_mask[i].bool()
        out.append(TokenBatch(*(None if t is None else t[i][real][None] for t in (
            batch.input_ids, batch.attention_mask, batch.token_type_ids, batch.special_mask))))  # fmt: skip
    return out


def has_mlm_head(model: torch.nn.Module) -> bool:
    """True when the model can produce masked-LM logits (``model.mlm_head`` is set)."""
    return getattr(model, "mlm_head", None) is not None and hasattr(model, "mlm_logits")


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation of two flat arrays (average ranks for ties)."""
    from scipy.stats import spearmanr

    return float(spearmanr(np.ravel(a), np.ravel(b)).statistic)


# ----------------------------------------------------------------------------------------------- helpers


def _clean_run(model: torch.nn.Module, batch: TokenBatch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Clean last hidden state and every layer's ``hook_resid_pre`` (``Encoder.forward_from`` restarts from
    these; tests pin that it reproduces the full forward)."""
    clean, cache = model.run_with_cache(
        batch.input_ids, batch.attention_mask, batch.token_type_ids, names_filter="blocks.*.hook_resid_pre"
    )
    return clean, [cache[f"blocks.{layer}.hook_resid_pre"] for layer in range(model.config.n_layers)]


def _check_eval(model: torch.nn.Module) -> None:
    if model.training:
        raise ValueError("the model is in training mode: dropout would make effects random; call model.eval()")


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _dtype(model: torch.nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def _rest(batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    return batch.attention_mask, batch.token_type_ids, batch.special_mask


def _replicate(batch: TokenBatch, copies: int) -> TokenBatch:
    def rep(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else einops.repeat(t, "b p -> (c b) p", c=copies)

    return TokenBatch(
        rep(batch.input_ids), rep(batch.attention_mask), rep(batch.token_type_ids), rep(batch.special_mask)
    )


def _mlm_inputs(
    model: torch.nn.Module, batch: TokenBatch, prob: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask ``prob`` of the real non-special tokens (at least one per sentence) -> ``(masked ids, labels)``."""
    tokenizer = getattr(model, "tokenizer", None)
    mask_id = getattr(tokenizer, "mask_token_id", None)
    if mask_id is None:
        raise ValueError("masked-LM scoring needs model.tokenizer with a mask token")
    ids = batch.input_ids
    candidates = batch.attention_mask.to(torch.bool)
    if batch.special_mask is not None:
        candidates &= ~batch.special_mask.to(torch.bool)
    else:
        special = torch.tensor(sorted(set(tokenizer.all_special_ids)))
        candidates &= ~torch.isin(ids.cpu(), special).to(ids.device)
    draw = torch.rand(ids.shape, generator=generator).to(ids.device)
    chosen = candidates & (draw < prob)
    # Guarantee one masked token per sentence that has a candidate: the candidate with the smallest draw.
    first = torch.where(candidates, draw, math.inf).argmin(-1)
    chosen[torch.arange(len(ids)), first] |= candidates[torch.arange(len(ids)), first]
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    return torch.where(chosen, torch.full_like(ids, mask_id), ids), labels


def _mlm_loss(model: Any, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over masked positions, per example -> ``[batch]`` (0 with no masked token)."""
    logits = model.mlm_logits(hidden).double()
    labels = labels.to(logits.device)
    ce = F.cross_entropy(einops.rearrange(logits, "b p v -> b v p"), labels, ignore_index=-100, reduction="none")
    n = (labels != -100).sum(-1).clamp_min(1)
    return ce.sum(-1) / n
