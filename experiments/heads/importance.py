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
according to ``keep[c, layer, head]``; single-head ablations start from the clean residual stream at the
ablated layer, since earlier blocks are unchanged.

Gradient importance (Michel et al. 2019) with an MLM head is what their code computes
(pmichel31415/pytorch-pretrained-BERT, ``calculate_head_importance``): with ``ctx`` a head's output at a token
(``z_h[b, t]``) and ``L`` the loss summed over examples, the token's score is ``|<dL/dctx, ctx>|``, i.e.
``|dL/dg_{h,b,t}|`` for a gate per head AND token; it is summed over the real tokens of every sentence, divided by
the number of real tokens, then normalised per layer by the L2 norm over that layer's heads
(``normalize_scores_by_layer``; their extra division of the last layer by the subset size is not reproduced).
``L`` is the masked-LM loss (15% of the word pieces masked, seeded; mean over a sentence's masked pieces).
Otherwise, for a sentence encoder without an MLM head, a per-example gate is used and
``L = <r, u>`` with ``u`` the unit-normalised mean-pooled embedding and ``r ~ N(0, I)`` a fixed random
direction per example (several per example): since ``E_r |<r, J>| = sqrt(2 / pi) ||J||``, the importance is
proportional to the norm of the first-order change of the embedding's direction when the head is scaled, a
first-order (Taylor) estimate of the ``pooled_cos`` ablation effect. The distance from the clean embedding
itself would be useless here: it is minimal at ``g = 1``, so its gradient there is zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import einops
import numpy as np
import torch
import torch.nn.functional as F
from bertscope.hooks.ablation import METHODS, head_gates, mean_z_over
from bertscope.hooks.interventions import AblationMethod

METHOD_DESCRIPTIONS = {
    "zero": "z_h = 0 at every position (the head writes nothing; same as zeroing its W_O slice)",
    "mean": "z_h = its mean over the real tokens of the evaluation sentences",
    "uniform": "the head attends uniformly to the real keys: z_h[q] = mean_k v_h[k]",
}
OBJECTIVE_DESCRIPTIONS = {
    "mlm": (
        "Michel et al.: |<dL/dz_h, z_h>| per token, masked-LM loss (15% of word pieces masked, seeded), mean over "
        "real tokens, L2-normalised per layer"
    ),
    "projection": (
        "consistency check, not Michel et al.'s score (no MLM head): L = <r, u> with u the unit mean-pooled "
        "embedding and r ~ N(0, I) fixed per sentence and projection; E|dL/dg_h| is proportional to the norm of "
        "the first-order change of u, i.e. a Taylor estimate of the pooled_cos ablation effect"
    ),
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
    progress: Callable[[list[Any]], Iterable[Any]] | None = None,
) -> tuple[np.ndarray, list[str]]:
    """Effect of ablating each head alone, per sentence (``progress`` optionally wraps the batch loop).

    Args:
        model: an ``Encoder`` in eval mode.
        batches: model inputs (see ``TokenBatch.of``); sentences are numbered in iteration order.
        methods: subset of ``zero``, ``mean``, ``uniform``.
        copies_per_pass: ablations per forward pass (default: all heads of a layer).
        mlm_mask_prob: share of real, non-special tokens masked for ``mlm_loss_change``.

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
    per_pass = copies_per_pass or n_heads
    generator = torch.Generator().manual_seed(seed)
    out = []
    for batch in progress(batches) if progress is not None else batches:
        effects = torch.zeros(batch.input_ids.shape[0], len(methods), n_layers, n_heads, len(measures))
        runs = [(batch, None)]  # (inputs, MLM labels): the clean text, plus a masked copy for the MLM loss
        if mlm:
            ids, labels = _mlm_inputs(model, batch, mlm_mask_prob, generator)
            runs.append((TokenBatch(ids, *_rest(batch)), labels))
        with torch.no_grad():
            for inputs, labels in runs:
                clean, resid = _clean_run(model, inputs)
                clean_loss = _mlm_loss(model, clean, labels) if labels is not None else None
                for mi, method in enumerate(methods):
                    for layer in range(n_layers):
                        keep = single_head_keep(n_layers, n_heads, layer)  # [head, layer, head]
                        for first in range(0, n_heads, per_pass):
                            part = keep[first : first + per_pass]
                            hidden = forward_with_heads(
                                model, inputs, part, method=method, mean_z=mean_z, start=(layer, resid[layer])
                            )
                            heads = slice(first, first + len(part))
                            if labels is None:
                                hidden = einops.rearrange(hidden, "(c b) p m -> c b p m", c=len(part))
                                change = output_change(clean, hidden, inputs.attention_mask)
                                for k, name in enumerate(OUTPUT_MEASURES):
                                    effects[:, mi, layer, heads, k] = change[name].T
                            else:
                                loss = _mlm_loss(model, hidden, labels.repeat(len(part), 1))
                                loss = einops.rearrange(loss, "(c b) -> b c", c=len(part))
                                effects[:, mi, layer, heads, -1] = loss - clean_loss[:, None]
        out.append(effects.double())
    return torch.cat(out).numpy(), measures


def gradient_importance(
    model: torch.nn.Module,
    batches: Iterable[Any],
    *,
    objective: Literal["auto", "mlm", "projection"] = "auto",
    n_projections: int = 4,
    mlm_mask_prob: float = 0.15,
    seed: int = 0,
) -> tuple[np.ndarray, str]:
    """Per-sentence gradient importance at ``g = 1``.

    Args:
        objective: ``mlm`` (needs an MLM head: Michel et al.'s per-token score, ``michel_importance``, as the mean
            over a sentence's real tokens, before the per-layer normalisation), ``projection`` (per-example gate,
            ``|dL/dg_h|`` averaged over random projections; a consistency check, see the module docstring) or
            ``auto`` (MLM when the model has a head for it, else projection).
        n_projections: random directions per sentence for the projection objective.

    Returns:
        ``(importance [sentence, layer, head] float64, objective name)``.
    """
    _check_eval(model)
    if objective == "auto":
        objective = "mlm" if has_mlm_head(model) else "projection"
    if objective == "mlm" and not has_mlm_head(model):
        raise ValueError("objective='mlm' needs a model with a masked-LM head; use objective='projection'")
    if objective not in ("mlm", "projection"):
        raise ValueError(f"objective must be 'auto', 'mlm' or 'projection', got {objective!r}")
    if objective == "mlm":
        sums, tokens = michel_importance(model, batches, mlm_mask_prob=mlm_mask_prob, seed=seed)
        return sums / tokens[:, None, None], objective
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    generator = torch.Generator().manual_seed(seed)
    copies = n_projections
    out = []
    for raw in batches:
        batch = TokenBatch.of(raw)
        b = batch.input_ids.shape[0]
        projections = torch.randn(copies * b, model.config.d_model, generator=generator)
        rep = _replicate(batch, copies)
        gates = torch.ones(copies * b, n_layers, n_heads, device=_device(model), dtype=_dtype(model))
        gates.requires_grad_(True)
        loss = gate_objective(model, rep, gates, projections=projections)
        (grad,) = torch.autograd.grad(loss.sum(), gates)
        grad = einops.reduce(grad.abs().double(), "(k b) l h -> b l h", "mean", k=copies)
        out.append(grad.cpu())
    return torch.cat(out).numpy(), objective


def michel_importance(
    model: torch.nn.Module, batches: Iterable[Any], *, mlm_mask_prob: float = 0.15, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Michel et al.'s per-token head importance on the masked-LM loss, per sentence (before normalisation).

    Returns:
        ``(token_sums [sentence, layer, head], tokens [sentence])``: ``sum_t |dL/dg_{h,t}|`` over the real tokens
        of each sentence (``g`` a gate per head and token on ``z``) and the number of real tokens. The corpus score
        is ``michel_normalise(token_sums.sum(0) / tokens.sum())``.
    """
    _check_eval(model)
    if not has_mlm_head(model):
        raise ValueError("Michel et al.'s importance needs a model with a masked-LM head")
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    generator = torch.Generator().manual_seed(seed)
    sums, tokens = [], []
    for raw in batches:
        batch = TokenBatch.of(raw)
        ids, labels = _mlm_inputs(model, batch, mlm_mask_prob, generator)
        b, p = ids.shape
        gates = torch.ones(b, p, n_layers, n_heads, device=_device(model), dtype=_dtype(model), requires_grad=True)
        hooks = [(f"blocks.{layer}.attn.hook_z", lambda z, hook, g=gates[:, :, layer, :, None]: z * g.to(z.dtype))
                 for layer in range(n_layers)]  # fmt: skip
        with model.hooks(hooks):
            hidden = model(ids, batch.attention_mask, batch.token_type_ids)
        loss = _mlm_loss(model, hidden, labels).sum()  # summed over examples, as their classifier loss
        (grad,) = torch.autograd.grad(loss, gates)
        real = batch.attention_mask.to(grad.device, torch.float64)[:, :, None, None]
        sums.append((grad.abs().double() * real).sum(1).cpu())
        tokens.append(batch.attention_mask.sum(-1).double().cpu())
    return torch.cat(sums).numpy(), torch.cat(tokens).numpy()


def michel_normalise(importance: np.ndarray) -> np.ndarray:
    """Per-layer L2 normalisation of ``[..., layer, head]`` scores (their ``normalize_scores_by_layer``)."""
    x = np.asarray(importance, dtype=np.float64)
    return x / (np.sqrt((x**2).sum(-1, keepdims=True)) + 1e-20)


def gate_objective(
    model: torch.nn.Module,
    batch: TokenBatch,
    gates: torch.Tensor,
    *,
    projections: torch.Tensor | None = None,
    mlm_labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-example objective with head outputs scaled by gates: ``z[b, :, h] *= gates[b, layer, h]``.

    Args:
        batch: inputs ``[batch, pos]``.
        gates: ``[batch, layer, head]`` (requires grad for importance).
        projections: ``[batch, d_model]`` random directions -> ``L_b = <r_b, u_b>``, ``u_b`` the unit
            mean-pooled embedding.
        mlm_labels: ``[batch, pos]`` token ids at masked positions, -100 elsewhere -> masked-LM loss.

    Returns:
        ``[batch]``.
    """
    if (projections is None) == (mlm_labels is None):
        raise ValueError("gate_objective needs exactly one of projections or mlm_labels")
    hooks = []
    for layer in range(model.config.n_layers):
        g = einops.rearrange(gates[:, layer], "b h -> b 1 h 1")
        hooks.append((f"blocks.{layer}.attn.hook_z", lambda z, hook, g=g: z * g.to(z.dtype)))
    with model.hooks(hooks):
        hidden = model(batch.input_ids, batch.attention_mask, batch.token_type_ids)
    if mlm_labels is not None:
        return _mlm_loss(model, hidden, mlm_labels)
    pooled = F.normalize(mean_pool(hidden, batch.attention_mask).double(), dim=-1)
    return (pooled * projections.to(pooled)).sum(-1)


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
    _check_eval(model)
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    if any(not 0 <= k <= len(order) for k in counts):
        raise ValueError(f"counts must lie in 0..{len(order)} (the length of order), got {list(counts)}")
    keep = torch.ones(len(counts), n_layers, n_heads)
    for c, k in enumerate(counts):
        for layer, head in order[:k]:
            keep[c, layer, head] = 0.0
    out = []
    for raw in batches:
        batch = TokenBatch.of(raw)
        with torch.no_grad():
            clean = model(batch.input_ids, batch.attention_mask, batch.token_type_ids)
            hidden = forward_with_heads(model, batch, keep, method="zero")
        hidden = einops.rearrange(hidden, "(c b) p m -> c b p m", c=len(counts))
        change = output_change(clean, hidden, batch.attention_mask)
        out.append(torch.stack([change[m].T for m in OUTPUT_MEASURES], dim=-1).double())  # [b, count, measure]
    return torch.cat(out).numpy()


def forward_with_heads(
    model: torch.nn.Module,
    batch: TokenBatch,
    keep: torch.Tensor,
    *,
    method: AblationMethod = "zero",
    mean_z: torch.Tensor | None = None,
    start: tuple[int, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Run ``C`` copies of the batch, copy ``c`` with head ``(L, h)`` kept to degree ``keep[c, L, h]``.

    ``z' = keep * z + (1 - keep) * replacement`` (replacement per ``method``; see the module docstring).

    Args:
        batch: inputs ``[batch, pos]``.
        keep: ``[copy, layer, head]`` in [0, 1] (1 = untouched).
        mean_z: ``[layer, head, d_head]`` for ``method="mean"`` (from ``mean_head_outputs``).
        start: ``(L, resid_pre)`` with ``resid_pre [batch, pos, d_model]`` the clean ``blocks.L.hook_resid_pre``:
            skip the embeddings and blocks before ``L`` (they are unchanged when only heads of layers >= L
            are touched).

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
    rep = _replicate(batch, copies)
    hooks = head_gates(keep, n_batch=b, method=method, mean_z=mean_z, attention_mask=rep.attention_mask,
                       first_layer=first_layer)  # fmt: skip
    with model.hooks(hooks):
        if start is None:
            return model(rep.input_ids, rep.attention_mask, rep.token_type_ids)
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


def single_head_keep(n_layers: int, n_heads: int, layer: int) -> torch.Tensor:
    """``keep [head, layer, head]``: copy ``h`` ablates head ``h`` of ``layer`` only."""
    keep = torch.ones(n_heads, n_layers, n_heads)
    keep[torch.arange(n_heads), layer, torch.arange(n_heads)] = 0.0
    return keep


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
