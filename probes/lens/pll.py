"""Pseudo-log-likelihood (PLL) of sentences under a masked LM, per token and per sentence.

- ``original`` (Salazar et al. 2020, "Masked Language Model Scoring"): every scored token is masked in its own copy of
  the sentence and scored from the rest; the sentence's PLL is the sum.
- ``within_word_l2r`` (Kauf and Ivanova 2023, "A Better Way to Do Masked Language Model Scoring"): the copy for a
  token also masks the later pieces of the same word, so a word split into pieces is not scored from its own future
  pieces.

Scored tokens are those that are not ``[CLS]``/``[SEP]``/padding (``<s>``/``</s>``/``<pad>`` in RoBERTa's vocabulary),
words are the tokenizer's ``word_ids()``: the same choices as minicons' ``MaskedLMScorer`` (see
``benchmarks/pll_minicons.py``, which checks the numbers against it).

Batched: one masked copy per row, rows of similar length batched together (``batch_size`` rows a forward pass, any
size), each copy's target read at its own position. ``pll_loop`` is the brute-force reference (one forward pass per
copy, no padding) the tests and ``benchmarks/pll.py`` compare against.

With ``streams=True`` every residual stream is also read through the logit lens at the target position (stream
``n_layers`` is the model's own prediction): "from which layer on does the model prefer the good sentence".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch

from .logit import hidden_states, logit_lens, require_mlm_head

PLLMethod = Literal["original", "within_word_l2r"]
PLL_METHODS: tuple[str, ...] = ("original", "within_word_l2r")


@dataclass(frozen=True)
class MaskedCopy:
    """One row of the PLL computation: sentence ``sentence``'s token ids with ``masked`` positions replaced by the
    mask token, scoring the original token ``target_id`` at position ``target``."""

    sentence: int
    ids: tuple[int, ...]
    target: int
    target_id: int
    word: int | None
    masked: tuple[int, ...]


def check_method(method: str) -> str:
    """``method`` if it is a PLL method, else a one-line ``ValueError``."""
    if method not in PLL_METHODS:
        raise ValueError(f"unknown PLL method {method!r}; choose one of {', '.join(PLL_METHODS)}")
    return method


def _special_ids(model: Any) -> set[int]:
    tok = model.tokenizer
    return {int(i) for i in (tok.cls_token_id, tok.sep_token_id, tok.pad_token_id) if i is not None}


def masked_copies(model: Any, sentences: Sequence[str], method: str = "original") -> list[MaskedCopy]:
    """Every masked copy ``method`` scores, sentence by sentence, token by token (tokenised with ``model.tokenizer``,
    which must be a fast tokenizer for ``within_word_l2r``: words come from its ``word_ids()``)."""
    check_method(method)
    tok = model.tokenizer
    if tok is None:
        raise ValueError("pseudo-log-likelihood needs the model's tokenizer; this model has none")
    if tok.mask_token_id is None:
        raise ValueError("pseudo-log-likelihood needs a mask token; this tokenizer has none")
    if isinstance(sentences, str):
        raise TypeError("sentences must be a list of strings, got one string")
    enc = tok(list(sentences), padding=False, truncation=False)
    if method == "within_word_l2r" and not getattr(enc, "is_fast", False):
        raise ValueError("within_word_l2r needs a fast tokenizer (its word_ids() say which pieces form a word)")
    max_length = getattr(getattr(model, "config", None), "max_length", None)
    specials, mask_id = _special_ids(model), int(tok.mask_token_id)
    out: list[MaskedCopy] = []
    for i, ids in enumerate(enc["input_ids"]):
        if max_length is not None and len(ids) > max_length:
            raise ValueError(f"sentence {i} is {len(ids)} tokens long; the model takes at most {max_length}")
        words = enc.word_ids(i) if getattr(enc, "is_fast", False) else [None] * len(ids)
        targets = [p for p, t in enumerate(ids) if int(t) not in specials]
        for t in targets:
            masked = [t]
            if method == "within_word_l2r" and words[t] is not None:
                masked += [j for j in range(t + 1, targets[-1] + 1) if words[j] == words[t]]
            row = list(map(int, ids))
            for j in masked:
                row[j] = mask_id
            out.append(MaskedCopy(i, tuple(row), t, int(ids[t]), words[t], tuple(masked)))
    return out


#: Rows of logits converted to float64 at a time by `_target_logprobs` (a block that stays in the CPU's cache).
LSE_ROWS = 32


def _target_logprobs(logits: torch.Tensor, target_ids: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[target]`` in float64: ``logits`` ``[..., n, vocab]``, ``target_ids`` ``[n]`` ->
    ``[..., n]``. The target's logit minus the float64 log-sum-exp over the vocabulary, converted
    :data:`LSE_ROWS` rows at a time (a float64 copy of all the vocabulary-wide logits and its log-softmax took
    half the time of scoring BLiMP; this takes a quarter of that, same float64 numbers)."""
    index = target_ids.to(logits.device).expand(*logits.shape[:-1])[..., None]
    picked = logits.gather(-1, index)[..., 0].double()
    rows = logits.reshape(-1, logits.shape[-1])
    lse = torch.cat([torch.logsumexp(block.double(), dim=-1) for block in rows.split(LSE_ROWS)])
    return picked - lse.reshape(picked.shape)


@torch.inference_mode()
def _score_batch(model: Any, rows: list[MaskedCopy], *, streams: bool, bias: bool) -> np.ndarray:
    """Log-probabilities of the rows' targets: ``[n_rows]``, or ``[stream, n_rows]`` with ``streams``."""
    n = max(len(r.ids) for r in rows)
    pad = model.tokenizer.pad_token_id or 0
    ids = torch.full((len(rows), n), int(pad), dtype=torch.long)
    mask = torch.zeros((len(rows), n), dtype=torch.long)
    for k, r in enumerate(rows):
        ids[k, : len(r.ids)] = torch.tensor(r.ids)
        mask[k, : len(r.ids)] = 1
    device = model.device
    ids, mask = ids.to(device), mask.to(device)
    at = torch.arange(len(rows), device=device)
    target = torch.tensor([r.target for r in rows], device=device)
    target_ids = torch.tensor([r.target_id for r in rows], device=device)
    if streams:
        hidden = hidden_states(model, ids, mask)[:, at, target]  # [stream, row, d_model]
        return torch.stack([_lens_logprobs(model, h, target_ids, bias) for h in hidden]).cpu().numpy()
    last = model(ids, mask)[at, target]  # [row, d_model]
    return _target_logprobs(model.mlm_logits(last[:, None], bias=bias)[:, 0], target_ids).cpu().numpy()


def _lens_logprobs(model: Any, hidden: torch.Tensor, target_ids: torch.Tensor, bias: bool) -> torch.Tensor:
    """One stream's log-probabilities of the targets through the logit lens: ``hidden`` ``[row, d_model]`` ->
    ``[row]``. Identical rows are read through the head once (at a masked position the embeddings' stream depends
    on the position alone, so stream 0 has a few distinct rows: the head's vocabulary-wide product is the cost)."""
    unique, inverse = torch.unique(hidden, dim=0, return_inverse=True)
    if unique.shape[0] == hidden.shape[0]:
        return _target_logprobs(logit_lens(model, hidden, bias=bias), target_ids)
    logits = logit_lens(model, unique, bias=bias)  # [unique, vocab]
    lse = torch.cat([torch.logsumexp(block.double(), dim=-1) for block in logits.split(LSE_ROWS)])  # [unique]
    return logits[inverse, target_ids.to(logits.device)].double() - lse[inverse]


def _table(model: Any, rows: list[MaskedCopy], scores: np.ndarray, method: str) -> pd.DataFrame:
    """The long per-token table from rows and their scores (``[n_rows]`` or ``[stream, n_rows]``)."""
    pieces = model.tokenizer.convert_ids_to_tokens([r.target_id for r in rows]) if rows else []
    base = pd.DataFrame({
        "sentence": np.array([r.sentence for r in rows], dtype=np.int64),
        "position": np.array([r.target for r in rows], dtype=np.int64),
        "token_id": np.array([r.target_id for r in rows], dtype=np.int64),
        "piece": pd.Series(pieces, dtype=object),
        "word": pd.array([r.word for r in rows], dtype="Int64"),
        "n_masked": np.array([len(r.masked) for r in rows], dtype=np.int64),
        "method": method,
    })  # fmt: skip
    if scores.ndim == 1:
        return base.assign(logprob=scores)
    parts = [base.assign(stream=s, logprob=scores[s]) for s in range(scores.shape[0])]
    return pd.concat(parts, ignore_index=True) if parts else base.assign(stream=pd.Series(dtype=np.int64), logprob=0.0)


def token_pll(
    model: Any,
    sentences: Sequence[str],
    method: str = "original",
    *,
    batch_size: int = 64,
    streams: bool = False,
    bias: bool = True,
) -> pd.DataFrame:
    """Per-token pseudo-log-likelihoods, a long table: ``sentence`` (index into ``sentences``), ``position``,
    ``token_id``, ``piece``, ``word`` (the tokenizer's word index), ``n_masked`` (positions masked in the token's
    copy), ``method``, ``logprob`` (natural log); with ``streams=True`` one row per stream too (``stream`` 0 =
    embeddings .. n_layers = the model's output, read through the logit lens). ``bias=False`` scores without the
    head's output bias. Rows of a batch are sorted by length (less padding); the table keeps sentence order."""
    require_mlm_head(model, "pseudo-log-likelihood")
    rows = masked_copies(model, sentences, method)
    return _table(model, rows, score_copies(model, rows, batch_size=batch_size, streams=streams, bias=bias), method)


def score_copies(
    model: Any, rows: Sequence[MaskedCopy], *, batch_size: int = 64, streams: bool = False, bias: bool = True
) -> np.ndarray:
    """The log-probability (natural log) of each masked copy's target, in ``rows`` order: ``[n_rows]``, or
    ``[stream, n_rows]`` with ``streams=True`` (every stream through the logit lens; the last is the model's own
    prediction). ``batch_size`` copies a forward pass, rows of similar length together. The engine of
    `token_pll`; a caller scoring several methods can pass the union of their copies once (equal copies of two
    methods, e.g. a one-piece word's, are equal rows)."""
    require_mlm_head(model, "pseudo-log-likelihood")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(rows)), key=lambda k: len(rows[k].ids))
    n_streams = model.config.n_layers + 1
    scores = np.zeros((n_streams, len(rows)) if streams else (len(rows),), dtype=np.float64)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        scores[..., chunk] = _score_batch(model, [rows[k] for k in chunk], streams=streams, bias=bias)
    return scores


def pll_loop(model: Any, sentences: Sequence[str], method: str = "original", *, bias: bool = True) -> pd.DataFrame:
    """The brute-force reference of ``token_pll``: one forward pass per masked copy, no padding, no batching."""
    require_mlm_head(model, "pseudo-log-likelihood")
    rows = masked_copies(model, sentences, method)
    scores = np.array([_score_batch(model, [r], streams=False, bias=bias)[0] for r in rows], dtype=np.float64)
    return _table(model, rows, scores, method)


def sentence_pll(tokens: pd.DataFrame, n_sentences: int | None = None) -> pd.DataFrame:
    """Per-sentence sums of ``token_pll``'s table: ``sentence`` (and ``stream`` if present), ``pll``, ``n_tokens``,
    ``pll_per_token`` (``pll / n_tokens``, the length-normalised score; NaN for a sentence with no scored token).
    ``n_sentences`` keeps sentences without scored tokens (PLL 0)."""
    keys = ["sentence", "stream"] if "stream" in tokens.columns else ["sentence"]
    out = tokens.groupby(keys, sort=True).agg(pll=("logprob", "sum"), n_tokens=("logprob", "size")).reset_index()
    if n_sentences is not None:
        streams = sorted(tokens["stream"].unique()) if "stream" in keys else [None]
        full = pd.MultiIndex.from_product([range(n_sentences), streams], names=["sentence", "stream"]).to_frame(
            index=False)
        if "stream" not in keys:
            full = full.drop(columns="stream")
        out = full.merge(out, on=keys, how="left").fillna({"pll": 0.0, "n_tokens": 0})
        out["n_tokens"] = out["n_tokens"].astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["pll_per_token"] = np.where(out["n_tokens"] > 0, out["pll"] / out["n_tokens"].clip(lower=1), np.nan)
    return out


def pseudo_log_likelihood(
    model: Any, sentences: Sequence[str], method: str = "original", *, batch_size: int = 64, bias: bool = True
) -> pd.DataFrame:
    """Per-sentence PLL (``sentence``, ``pll``, ``n_tokens``, ``pll_per_token``), one row per sentence in order."""
    return sentence_pll(token_pll(model, sentences, method, batch_size=batch_size, bias=bias), len(sentences))
