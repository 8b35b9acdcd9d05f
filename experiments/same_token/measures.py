"""Pure tensor metrics for the same-token experiment (no model): how much attention a query puts on itself,
on other occurrences of its own token, and on its neighbours, against uniform and offset-matched nulls.

The pipeline for one batch of sentences is

>>> pos = Positions.from_batch(input_ids, attention_mask, special_mask, special_ids={"cls": 101, "sep": 102})
>>> per_query = attention_masses(pattern, pos)            # metric -> QueryMetric (values per query)
>>> tallies = tally(per_query, pattern, pos, max_length)   # per-sentence sums, counts and null sums
>>> table = summarize(Tallies.concat([...]), n_boot=1000, seed=0)   # value, bootstrap CI, nulls, ratios

Definitions (``n`` = number of real tokens of the sentence, [CLS] and [SEP] included; "content" = real
tokens that are not special):

- ``self``: ``A[i, i]`` over content queries; uniform null ``1/n``.
- ``duplicate``: ``sum of A[i, j]`` over the other content positions ``j`` holding the same token id, averaged
  over the content queries that have at least one such copy; ``duplicate_earlier`` counts only copies with
  ``j < i`` (and only queries that have one). Uniform null ``|D(i)| / n``; offset-matched null
  ``sum over j in D(i) of M(j - i)`` where ``M(d)`` is the mean mass the same head puts at relative offset
  ``d`` on content pairs that are *not* copies (pooled over the corpus).
- ``previous`` / ``next``: ``A[i, i-1]`` / ``A[i, i+1]`` over content queries whose neighbour is content;
  uniform null ``1/n``.
- special tokens on their own lines: ``self_<name>`` (self mass of the [CLS]/[SEP] queries), ``to_<name>``
  (mass content queries put on those keys; null ``count/n``) and ``to_pad`` (mass on padding, must be 0).
- raw attention only (from logits): ``argmax_self_or_copy`` (the best key is the query itself or a copy;
  ties count as a hit; null ``(1 + |D(i)|) / n``) and ``logit_gap`` (self logit minus the best key holding a
  different token; no null).

Every value is a ratio of sums over sentences, so the bootstrap resamples sentences (the offset-matched
null is re-estimated inside each bootstrap draw).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from bertscope.experiments import attention
from bertscope.experiments.attention import norm_weighted
from bertscope.probes.bootstrap import percentile_interval, resample_counts
from torch import Tensor

DUPLICATE_METRICS = ("duplicate", "duplicate_earlier")  # the metrics with an offset-matched null
__all__ = ["DUPLICATE_METRICS", "Positions", "QueryMetric", "Tallies", "attention_masses", "logit_metrics",
           "norm_weighted", "raw_attention", "summarize", "tally"]  # fmt: skip


@dataclass(frozen=True)
class QueryMetric:
    """One metric for every query of a batch.

    values [batch, head, query] (float); counted [batch, query] (bool: the queries the metric averages
    over); uniform [batch, query] (float: the uniform-attention null per query) or None (no null).
    """

    values: Tensor
    counted: Tensor
    uniform: Tensor | None


@dataclass(frozen=True)
class Positions:
    """Token bookkeeping for one batch, shared by every pattern computed on it.

    valid, content [batch, pos] bool; duplicate, earlier, noncopy [batch, query, key] bool (content pairs:
    same id at another position / same id at an earlier position / different ids); n_keys [batch] (real
    tokens per sentence); special {name: [batch, pos] bool} for the named special-token ids.
    """

    input_ids: Tensor
    valid: Tensor
    content: Tensor
    duplicate: Tensor
    earlier: Tensor
    noncopy: Tensor
    n_keys: Tensor
    special: dict[str, Tensor]

    @classmethod
    def from_batch(
        cls,
        input_ids: Tensor,
        attention_mask: Tensor,
        special_mask: Tensor,
        special_ids: Mapping[str, int],
    ) -> Positions:
        """input_ids, attention_mask, special_mask [batch, pos]; special_ids e.g. {"cls": 101, "sep": 102}.

        Padding counts as special whatever ``special_mask`` says; duplicates are defined on content only.
        """
        if input_ids.shape != attention_mask.shape or input_ids.shape != special_mask.shape:
            raise ValueError(
                f"input_ids {tuple(input_ids.shape)}, attention_mask {tuple(attention_mask.shape)} and "
                f"special_mask {tuple(special_mask.shape)} must all be [batch, pos]"
            )
        valid = attention_mask.bool()
        content = valid & ~special_mask.bool()
        same = input_ids[:, :, None] == input_ids[:, None, :]
        pair = content[:, :, None] & content[:, None, :]
        duplicate, earlier = attention.copies(input_ids, content)
        return cls(
            input_ids=input_ids,
            valid=valid,
            content=content,
            duplicate=duplicate,
            earlier=earlier,
            noncopy=pair & ~same,
            n_keys=valid.sum(-1),
            special={name: valid & (input_ids == int(i)) for name, i in special_ids.items()},
        )


@dataclass
class Tallies:
    """Per-sentence sums for one pattern source (concatenate batches with :meth:`concat`).

    sums {metric: [sentence, head]}: sum over counted queries of the query's value;
    counts {metric: [sentence]}: number of counted queries; uniform {metric: [sentence]}: sum of the
    per-query uniform nulls (metrics without a null are absent); pair_offsets {duplicate metric:
    [sentence, offset]}: number of (query, copy) pairs per relative offset ``key - query`` (index
    ``offset + max_length - 1``); noncopy_mass [sentence, head, offset] and noncopy_count [sentence, offset]:
    attention mass and number of non-copy content pairs per offset. All float64 on the CPU.
    """

    sums: dict[str, Tensor]
    counts: dict[str, Tensor]
    uniform: dict[str, Tensor]
    pair_offsets: dict[str, Tensor]
    noncopy_mass: Tensor
    noncopy_count: Tensor

    @classmethod
    def concat(cls, parts: list[Tallies]) -> Tallies:
        """Stack the sentences of several batches (same heads, metrics and max_length)."""
        if not parts:
            raise ValueError("Tallies.concat needs at least one batch of tallies")

        def cat(get):  # noqa: ANN001, ANN202 - tiny local helper
            return torch.cat([get(p) for p in parts])

        first = parts[0]
        return cls(
            sums={m: cat(lambda p, m=m: p.sums[m]) for m in first.sums},
            counts={m: cat(lambda p, m=m: p.counts[m]) for m in first.counts},
            uniform={m: cat(lambda p, m=m: p.uniform[m]) for m in first.uniform},
            pair_offsets={m: cat(lambda p, m=m: p.pair_offsets[m]) for m in first.pair_offsets},
            noncopy_mass=cat(lambda p: p.noncopy_mass),
            noncopy_count=cat(lambda p: p.noncopy_count),
        )

    @property
    def metrics(self) -> list[str]:
        return list(self.sums)

    @property
    def n_sentences(self) -> int:
        return int(self.noncopy_count.shape[0])


# ------------------------------------------------------------------------------------- public entry points


def attention_masses(pattern: Tensor, pos: Positions) -> dict[str, QueryMetric]:
    """Per-query masses of an attention pattern.

    pattern [batch, head, query, key] (rows sum to 1 over real keys) -> {metric: QueryMetric}: ``self``,
    ``duplicate``, ``duplicate_earlier``, ``previous``, ``next``, ``to_pad`` and, per named special token,
    ``self_<name>`` and ``to_<name>`` (see the module docstring).
    """
    _check_pattern(pattern, pos)
    a = pattern  # sums stay in the pattern's dtype here; tally accumulates in float64
    content = pos.content
    inv_n = (1.0 / pos.n_keys.clamp(min=1).double())[:, None].expand_as(content)
    self_mass = attention.self_mass(a)  # [batch, head, query]
    out = {"self": QueryMetric(self_mass, content, inv_n)}
    for name, copies in (("duplicate", pos.duplicate), ("duplicate_earlier", pos.earlier)):
        n_copies = copies.sum(-1).double()
        out[name] = QueryMetric(attention.key_mass(a, copies), content & (n_copies > 0), n_copies * inv_n)
    out["previous"] = QueryMetric(attention.previous_mass(a), attention.has_previous(content), inv_n)
    out["next"] = QueryMetric(attention.next_mass(a), attention.has_next(content), inv_n)
    for name, where in pos.special.items():
        out[f"self_{name}"] = QueryMetric(self_mass, where, inv_n)
        to_special = attention.key_mass(a, where)
        out[f"to_{name}"] = QueryMetric(to_special, content, where.sum(-1, keepdim=True).double() * inv_n)
    out["to_pad"] = QueryMetric(attention.key_mass(a, ~pos.valid), content, torch.zeros_like(inv_n))
    return out


def raw_attention(x: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Tutorial attention with Q = K = V = x: ``softmax(x x^T / sqrt(d))``, padding keys masked.

    x [batch, pos, d]; attention_mask [batch, pos] -> (logits [batch, query, key] with padded keys at -inf,
    pattern [batch, query, key]). Positions whose vectors are bitwise identical get bitwise identical
    logits (their dot products are equal in exact arithmetic; a matmul may round them differently), so
    copies of a token tie exactly in the word-embedding view.
    """
    if x.dim() != 3 or x.shape[:2] != attention_mask.shape:
        raise ValueError(
            f"x must be [batch, pos, d] matching attention_mask [batch, pos]; got {tuple(x.shape)} and "
            f"{tuple(attention_mask.shape)}"
        )
    batch, n, d = x.shape
    logits = torch.einsum("bqd,bkd->bqk", x, x) / d**0.5
    _, inverse = torch.unique(x.reshape(batch * n, d), dim=0, return_inverse=True)
    inverse = inverse.reshape(batch, n)
    # representative = first position holding the same vector; read every logit at the representatives.
    rep = (inverse[:, :, None] == inverse[:, None, :]).int().argmax(-1)  # [batch, pos]
    logits = logits.gather(2, rep[:, None, :].expand(batch, n, n)).gather(1, rep[:, :, None].expand(batch, n, n))
    logits = logits.masked_fill(~attention_mask.bool()[:, None, :], float("-inf"))
    return logits, logits.softmax(-1)


def logit_metrics(logits: Tensor, pos: Positions) -> dict[str, QueryMetric]:
    """Raw-attention metrics read from logits [batch, query, key] (padded keys at -inf).

    -> {"argmax_self_or_copy", "logit_gap"} as QueryMetric with a head dimension of 1, over content queries.
    """
    _check_pattern(logits[:, None], pos)
    batch, n, _ = logits.shape
    eye = torch.eye(n, dtype=torch.bool, device=logits.device)
    same = pos.duplicate | eye  # self or a copy
    other = pos.valid[:, None, :] & ~same
    l64 = logits.double()
    best_same = l64.masked_fill(~same, float("-inf")).amax(-1)
    best_other = l64.masked_fill(~other, float("-inf")).amax(-1)
    hit = (best_same >= best_other).double()
    gap = l64.diagonal(dim1=-2, dim2=-1) - best_other
    counted = pos.content & other.any(-1)
    chance = (1 + pos.duplicate.sum(-1)).double() / pos.n_keys.clamp(min=1).double()[:, None]
    return {
        "argmax_self_or_copy": QueryMetric(hit[:, None], counted, chance),
        "logit_gap": QueryMetric(gap[:, None], counted, None),
    }


def tally(per_query: Mapping[str, QueryMetric], pattern: Tensor, pos: Positions, max_length: int) -> Tallies:
    """Reduce per-query metrics to per-sentence sums, plus the pattern's [batch, head, query, key] non-copy
    mass per relative offset that the offset-matched null needs (offsets up to max_length - 1)."""
    _check_pattern(pattern, pos)
    n = pos.content.shape[1]
    if n > max_length:
        raise ValueError(f"sequences have {n} positions but max_length={max_length}; pass the encode limit")
    n_offsets = 2 * max_length - 1
    q_idx, k_idx = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    offset_index = (k_idx - q_idx + max_length - 1).reshape(-1).to(pos.content.device)

    def per_offset(x: Tensor) -> Tensor:  # [..., query, key] -> [..., offset] (float64)
        x = x.float() if x.dtype == torch.bool else x
        flat = x.reshape(*x.shape[:-2], n * n)
        out = torch.zeros(*x.shape[:-2], n_offsets, dtype=x.dtype, device=x.device)
        return out.index_add_(-1, offset_index, flat).double()

    sums, counts, uniform = {}, {}, {}
    for name, m in per_query.items():
        # where, not a product: values at uncounted queries may be inf or NaN (e.g. a -inf logit gap)
        sums[name] = torch.where(m.counted[:, None], m.values.double(), 0.0).sum(-1).cpu()
        counts[name] = m.counted.double().sum(-1).cpu()
        if m.uniform is not None:
            uniform[name] = torch.where(m.counted, m.uniform.double(), 0.0).sum(-1).cpu()
    return Tallies(
        sums=sums,
        counts=counts,
        uniform=uniform,
        pair_offsets={
            "duplicate": per_offset(pos.duplicate).cpu(),
            "duplicate_earlier": per_offset(pos.earlier).cpu(),
        },
        noncopy_mass=per_offset(pattern * pos.noncopy[:, None]).cpu(),
        noncopy_count=per_offset(pos.noncopy).cpu(),
    )


def summarize(tallies: Tallies, *, n_boot: int = 1000, seed: int = 0, ci: float = 0.95) -> pd.DataFrame:
    """Point estimates, percentile bootstrap CIs over sentences, nulls and observed/null ratios.

    -> long table, one row per (head, metric): head (index in the tallies' head dimension), metric, value,
    ci_low, ci_high, null, null_kind, ratio, ratio_ci_low, ratio_ci_high, null_offset, ratio_offset,
    null_uniform, ratio_uniform, n_queries, n_sentences.

    ``null`` is the offset-matched null for the duplicate metrics where it is defined, else the uniform
    null, and ``null_kind`` says which ("offset" | "uniform" | "" for none). The offset-matched null is
    undefined (NaN in ``null_offset``) when some copy sits at an offset where the corpus has no non-copy
    content pair, as in ``repeated-random``, where every pair at offset m is a copy. Ratios are NaN where
    their null is 0 or undefined.
    """
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    n_sent = tallies.n_sentences
    weights = torch.ones(n_boot + 1, n_sent, dtype=torch.float64)  # row 0: the full sample
    weights[1:] = torch.from_numpy(resample_counts(n_sent, n_boot, seed))  # rows 1..: bootstrap multiplicities

    frames = [_summary_frame(tallies, metric, weights, ci) for metric in tallies.metrics]
    return pd.concat(frames, ignore_index=True)


# ------------------------------------------------------------------------------------------------ helpers


def _summary_frame(tallies: Tallies, metric: str, weights: Tensor, ci: float) -> pd.DataFrame:
    """Rows of one metric for ``summarize``: ``weights [draw, sentence]`` holds the full sample in row 0 and the
    bootstrap multiplicities in rows 1..; intervals are percentiles over rows 1.. at level ``ci``."""
    counts = weights @ tallies.counts[metric]  # [draw]
    value = _divide(weights @ tallies.sums[metric], counts[:, None])  # [draw, head]
    nan = torch.full_like(value, float("nan"))
    uniform = (
        _divide(weights @ tallies.uniform[metric], counts)[:, None].expand_as(value)
        if metric in tallies.uniform
        else nan
    )
    offset = _offset_null(tallies, metric, weights, counts) if metric in DUPLICATE_METRICS else nan
    use_offset = bool(torch.isfinite(offset[0]).all())
    kind = "offset" if use_offset else ("uniform" if metric in tallies.uniform else "")
    null = offset if use_offset else uniform
    ratio = _divide(value, null)
    ci_low, ci_high = percentile_interval(value[1:].numpy(), ci)
    ratio_low, ratio_high = percentile_interval(ratio[1:].numpy(), ci)
    return pd.DataFrame(
        {
            "head": np.arange(value.shape[1]),
            "metric": metric,
            "value": value[0].numpy(),
            "ci_low": ci_low,
            "ci_high": ci_high,
            "null": null[0].numpy(),
            "null_kind": kind,
            "ratio": ratio[0].numpy(),
            "ratio_ci_low": ratio_low,
            "ratio_ci_high": ratio_high,
            "null_offset": offset[0].numpy(),
            "ratio_offset": _divide(value, offset)[0].numpy(),
            "null_uniform": uniform[0].numpy(),
            "ratio_uniform": _divide(value, uniform)[0].numpy(),
            "n_queries": int(counts[0]),
            "n_sentences": tallies.n_sentences,
        }
    )


def _offset_null(tallies: Tallies, metric: str, weights: Tensor, counts: Tensor) -> Tensor:
    """Offset-matched null per draw and head: mean over counted queries of sum over their copies of the
    head's mean non-copy mass at the copy's offset -> [draw, head] (NaN where an offset has no support)."""
    pairs = tallies.pair_offsets[metric]  # [sentence, offset]
    used = pairs.sum(0) > 0
    pairs = weights @ pairs[:, used]  # [draw, offset]
    mass = torch.einsum("ws,sho->who", weights, tallies.noncopy_mass[:, :, used])
    support = weights @ tallies.noncopy_count[:, used]  # [draw, offset]
    mean_mass = _divide(mass, support[:, None, :])  # [draw, head, offset]
    contrib = torch.where(pairs[:, None, :] > 0, pairs[:, None, :] * mean_mass, 0.0)
    return _divide(contrib.sum(-1), counts[:, None])


def _divide(num: Tensor, den: Tensor) -> Tensor:
    """num / den with NaN where den == 0."""
    return torch.where(den != 0, num / torch.where(den != 0, den, 1.0), float("nan"))


def _check_pattern(pattern: Tensor, pos: Positions) -> None:
    batch, n = pos.content.shape
    if pattern.dim() != 4 or pattern.shape[0] != batch or pattern.shape[2:] != (n, n):
        raise ValueError(
            f"pattern must be [batch, head, query, key] = [{batch}, H, {n}, {n}] to match the token masks; "
            f"got {tuple(pattern.shape)}"
        )
