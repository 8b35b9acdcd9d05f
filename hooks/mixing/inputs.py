"""Input attributions of a scalar per-sentence target: gradient x input, integrated gradients (Captum), leave-one-out.

All three return ``[batch, 1, key]`` (one target per sentence, no query axis); padding is 0.

Targets (``target=``), each a score ``s(x)`` per sentence computed from the last hidden state:

- ``"pooled_cosine"``: ``cos(pool(x), pool(x_clean))`` with ``pool`` the mean over real tokens (how a
  sentence-transformers model such as the bundled all-MiniLM-L6-v2 embeds a sentence).
- ``"pooled_projection"``: ``<pool(x), pool(x_clean)> / ||pool(x_clean)||``. The cosine is maximal at the
  input itself, so its gradient there is exactly zero and ``grad_x_input`` would return zeros; the projection
  is its first-order stand-in, and the default for ``grad_x_input`` on a model without an MLM head.
- ``"mlm_loss"``: the masked-LM log-likelihood ``mean_t log p(label_t | x)`` over labelled positions; labels
  are ``labels`` ``[batch, pos]`` (-100 = ignore) or by default the clean model's top prediction at every
  ``[MASK]`` position. Needs a checkpoint with an MLM head.
- a callable ``fn(hidden [b, p, m], attention_mask [b, p]) -> [b]`` for anything else (e.g. a classifier's
  logit computed from the hidden states by the caller's head).

``"auto"``: ``mlm_loss`` when the model has an MLM head, else ``pooled_cosine`` (``pooled_projection`` for
``grad_x_input``).

Attributions are differences in ``s``: ``loo``'s ``a_j = s(x) - s(x with token j replaced)`` (the drop in
the target; for ``pooled_cosine`` that is ``1 - cos``; for ``mlm_loss`` the rise in loss).
``integrated_gradients`` and ``grad_x_input`` attribute ``s`` with respect to the word-piece embeddings
``embed.hook_word`` (position and segment embeddings stay), summed over d_model, so IG's attributions add up to
``s(x) - s(baseline)`` (completeness).

Baselines (``baseline=``): ``"mask"`` (the [MASK] embedding, as in mt-upc's blank-out), ``"pad"`` (the [PAD]
embedding), ``"zero"`` (a zero word embedding); ``loo`` also takes ``"remove"`` (the token is masked out of
attention and of the pooling). The IG baseline replaces every real token, [CLS]/[SEP] included, so every
token gets an attribution comparable with ``loo``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from bertscope.hooks.mixing import table

TARGETS = ("pooled_cosine", "pooled_projection", "mlm_loss")
BASELINES = ("mask", "pad", "zero")


def attribute(
    model: torch.nn.Module,
    ids: torch.Tensor,
    mask: torch.Tensor,
    types: torch.Tensor | None,
    method: str,
    *,
    target: str | Callable[..., torch.Tensor] = "auto",
    baseline: str = "mask",
    n_steps: int = 32,
    labels: torch.Tensor | None = None,
    chunk_tokens: int = 32768,
    progress: Callable[[str, int], Any] | None = None,
) -> torch.Tensor:
    """``[batch, 1, key]`` attributions of ``target`` by ``method`` (see the module docstring); ``progress(desc,
    total)`` gives a bar for the method's long loop (``loo``'s groups of left-out tokens)."""
    target = _resolve_target(model, target, method)
    if baseline not in BASELINES + (("remove",) if method == "loo" else ()):
        allowed = BASELINES + (("remove",) if method == "loo" else ())
        raise ValueError(f"baseline for {method} must be one of {allowed}, got {baseline!r}")
    with torch.no_grad():
        clean_hidden = model(ids, mask, types)
        ref = _reference(model, target, clean_hidden, ids, mask, labels)
    compute = table.TABLE[method].compute
    out = compute(model, ids, mask, types, target, ref, baseline=baseline, n_steps=n_steps, chunk_tokens=chunk_tokens,
                  progress=progress)
    return (out * mask)[:, None, :]


# ---------------------------------------------------------------------------- the table's functions, [b, key]
def loo(model, ids, mask, types, target, ref, *, baseline: str, n_steps: int, chunk_tokens: int,
        progress=None) -> torch.Tensor:  # fmt: skip
    """Leave-one-out: ``s(x) - s(x with token j replaced by the baseline, or removed)``."""
    return _loo(model, ids, mask, types, target, ref, baseline, chunk_tokens, progress)


def grad_x_input(model, ids, mask, types, target, ref, *, baseline: str, n_steps: int, chunk_tokens: int,
                 progress=None) -> torch.Tensor:  # fmt: skip
    """Gradient x input on the word embeddings (Captum's ``InputXGradient``), summed over d_model."""
    return _gradient(model, ids, mask, types, target, ref, baseline, "grad_x_input", n_steps, chunk_tokens)


def integrated_gradients(model, ids, mask, types, target, ref, *, baseline: str, n_steps: int, chunk_tokens: int,
                         progress=None) -> torch.Tensor:  # fmt: skip
    """Integrated gradients from the baseline (Captum's ``IntegratedGradients``), summed over d_model."""
    return _gradient(model, ids, mask, types, target, ref, baseline, "integrated_gradients", n_steps, chunk_tokens)


def score(model, target, hidden: torch.Tensor, mask: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """The target ``s`` ``[b]`` from hidden states ``[b, p, m]``; ``ref`` is the clean pooled embedding ``[b, m]``
    (pooled targets) or the labels ``[b, p]`` (``mlm_loss``)."""
    if callable(target):
        return target(hidden, mask)
    if target == "mlm_loss":
        logp = F.log_softmax(model.mlm_logits(hidden).float(), dim=-1)
        keep = ref >= 0
        picked = logp.gather(-1, ref.clamp_min(0)[..., None])[..., 0] * keep
        return picked.sum(-1) / keep.sum(-1)
    w = mask.to(hidden.dtype)[..., None]
    pooled = (hidden * w).sum(1) / w.sum(1).clamp_min(1)
    if target == "pooled_cosine":
        return F.cosine_similarity(pooled, ref, dim=-1)
    return (pooled * F.normalize(ref, dim=-1)).sum(-1)


def _resolve_target(model, target, method):
    if callable(target):
        return target
    if target == "auto":
        if getattr(model, "mlm_head", None) is not None:
            return "mlm_loss"
        return "pooled_projection" if method == "grad_x_input" else "pooled_cosine"
    if target not in TARGETS:
        raise ValueError(
            f"target must be 'auto', one of {TARGETS} or a callable(hidden, mask) -> [batch]; got {target!r}"
        )
    if target == "mlm_loss" and getattr(model, "mlm_head", None) is None:
        raise ValueError("target 'mlm_loss' needs a checkpoint with a masked-LM head; this model has none")
    if target == "pooled_cosine" and method == "grad_x_input":
        raise ValueError(
            "grad_x_input of 'pooled_cosine' is identically zero: the cosine to the clean embedding is maximal at "
            "the input, so its gradient vanishes there. Use target='pooled_projection' or integrated_gradients."
        )
    return target


def _reference(model, target, hidden, ids, mask, labels):
    if callable(target):
        return torch.zeros(ids.shape[0], device=ids.device)
    if target != "mlm_loss":
        w = mask.to(hidden.dtype)[..., None]
        return (hidden * w).sum(1) / w.sum(1).clamp_min(1)
    if labels is not None:
        if labels.shape != ids.shape:
            raise ValueError(f"labels shape {tuple(labels.shape)} != input_ids shape {tuple(ids.shape)}")
        labels = labels.to(ids.device)
    else:
        mask_id = getattr(model.tokenizer, "mask_token_id", None)
        if mask_id is None:
            raise ValueError("mlm_loss without labels needs a tokenizer with a [MASK] token; pass labels=")
        pred = model.mlm_logits(hidden).argmax(-1)
        labels = torch.where((ids == mask_id) & mask.bool(), pred, torch.full_like(pred, -100))
    if bool(((labels >= 0).sum(-1) == 0).any()):
        raise ValueError("mlm_loss needs at least one labelled ([MASK]) position in every sentence")
    return labels


def _baseline_word(model, ids: torch.Tensor, baseline: str) -> torch.Tensor:
    """Word embeddings of the baseline ``[b, p, m]``."""
    word = model.W_E
    if baseline == "zero":
        return torch.zeros(*ids.shape, word.shape[1], dtype=word.dtype, device=word.device)
    tok = getattr(model.tokenizer, f"{baseline}_token_id", None)
    if tok is None and baseline == "pad":
        tok = model.config.pad_token_id
    if tok is None:
        raise ValueError(f"baseline {baseline!r} needs a tokenizer with a {baseline} token")
    return word[torch.full_like(ids, tok)]


@torch.no_grad()
def _loo(model, ids, mask, types, target, ref, baseline, chunk_tokens, progress=None) -> torch.Tensor:
    """Leave each real token out in turn: ``s(x) - s(x without j)`` ``[b, p]``. One forward per token, batched."""
    b, n = ids.shape
    per = max(1, chunk_tokens // (b * n))
    bar = progress("leave-one-out (groups of left-out tokens)", -(-n // per)) if progress else None
    clean = score(model, target, model(ids, mask, types), mask, ref)
    base_word = None if baseline == "remove" else _baseline_word(model, ids, baseline)
    out = torch.zeros(b, n, dtype=clean.dtype, device=ids.device)
    for start in range(0, n, per):
        pos = torch.arange(start, min(n, start + per), device=ids.device)
        reps = len(pos)
        which = pos.repeat_interleave(b)  # replica r (= position index * b + sentence) drops position which[r]
        rows = torch.arange(reps * b, device=ids.device)
        r_ids, r_mask = ids.repeat(reps, 1), mask.repeat(reps, 1)
        r_types = None if types is None else types.repeat(reps, 1)
        hooks = []
        if baseline == "remove":
            r_mask = r_mask.clone()
            r_mask[rows, which] = 0
        else:
            replacement = base_word.repeat(reps, 1, 1)[rows, which]

            def swap(word: torch.Tensor, hook, which=which, rows=rows, replacement=replacement) -> torch.Tensor:
                word = word.clone()
                word[rows, which] = replacement
                return word

            hooks = [("embed.hook_word", swap)]
        with model.hooks(hooks):
            hidden = model(r_ids, r_mask, r_types)
        s = score(model, target, hidden, r_mask, ref.repeat(reps, *([1] * (ref.dim() - 1))))
        out[:, pos] = (clean.repeat(reps) - s).reshape(reps, b).T
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return out


def _gradient(model, ids, mask, types, target, ref, baseline, method, n_steps, chunk_tokens) -> torch.Tensor:
    """Captum's ``InputXGradient`` / ``IntegratedGradients`` on the word embeddings, summed over d_model."""
    from captum.attr import InputXGradient, IntegratedGradients

    def forward(word, ids, mask, types, ref):
        with model.hooks([("embed.hook_word", lambda t, hook: word)]):
            hidden = model(ids, mask, None if types.numel() == 0 else types)
        return score(model, target, hidden, mask, ref)

    with torch.no_grad():
        word = model.W_E[ids].detach()
    types_arg = torch.empty(ids.shape[0], 0, dtype=torch.long, device=ids.device) if types is None else types
    extra = (ids, mask, types_arg, ref)
    word = word.clone().requires_grad_(True)
    with torch.enable_grad():
        if method == "grad_x_input":
            attr = InputXGradient(forward).attribute(word, additional_forward_args=extra)
        else:
            base = _baseline_word(model, ids, baseline)
            base = torch.where(mask.bool()[..., None], base, word.detach())  # padding is never perturbed
            internal = max(1, chunk_tokens // ids.numel()) * ids.shape[0]
            attr = IntegratedGradients(forward).attribute(
                word, baselines=base, additional_forward_args=extra, n_steps=n_steps,
                internal_batch_size=internal,
            )
    return attr.sum(-1).detach()
