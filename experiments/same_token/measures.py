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

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

DUPLICATE_METRICS = ("duplicate", "duplicate_earlier")  # the metrics with an offset-matched null


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
        pos = input_ids.shape[1]
        same = input_ids[:, :, None] == input_ids[:, None, :]
        pair = content[:, :, None] & content[:, None, :]
        other = ~torch.eye(pos, dtype=torch.bool, device=input_ids.device)
        duplicate = same & pair & other
        earlier = duplicate & torch.ones(pos, pos, dtype=torch.bool, device=input_ids.device).tril(-1)
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

    def to_arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        """Flat numpy arrays (keys ``{prefix}{field}__{metric}``) for the step cache; inverse of :meth:`from_arrays`."""
        out = {f"{prefix}noncopy_mass": self.noncopy_mass.numpy(), f"{prefix}noncopy_count": self.noncopy_count.numpy()}
        for field in ("sums", "counts", "uniform", "pair_offsets"):
            out.update({f"{prefix}{field}__{m}": v.numpy() for m, v in getattr(self, field).items()})
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], prefix: str = "") -> Tallies:
        """Rebuild the tallies that :meth:`to_arrays` flattened with the same ``prefix``."""
        def part(field: str) -> dict[str, Tensor]:  # noqa: ANN202
            head = f"{prefix}{field}__"
            return {k[len(head):]: torch.from_numpy(np.asarray(v)) for k, v in arrays.items() if k.startswith(head)}

        return cls(part("sums"), part("counts"), part("uniform"), part("pair_offsets"),
                   torch.from_numpy(np.asarray(arrays[f"{prefix}noncopy_mass"])),
                   torch.from_numpy(np.asarray(arrays[f"{prefix}noncopy_count"])))

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

    def key_mass(keys: Tensor) -> Tensor:  # keys [batch, query, key] or [batch, key] bool -> [batch, head, query]
        if keys.dim() == 2:
            return (a @ keys.to(a.dtype)[:, None, :, None]).squeeze(-1)
        return (a * keys[:, None]).sum(-1)  # faster on CPU than an einsum, which permutes into a batched matmul

    content = pos.content
    inv_n = (1.0 / pos.n_keys.clamp(min=1).double())[:, None].expand_as(content)
    self_mass = a.diagonal(dim1=-2, dim2=-1)  # [batch, head, query]
    out = {"self": QueryMetric(self_mass, content, inv_n)}
    for name, copies in (("duplicate", pos.duplicate), ("duplicate_earlier", pos.earlier)):
        n_copies = copies.sum(-1).double()
        out[name] = QueryMetric(key_mass(copies), content & (n_copies > 0), n_copies * inv_n)
    # A[i, i-1] lives on the -1 diagonal: pad it at the front so index i is query i (and at the end for +1).
    prev = torch.nn.functional.pad(a.diagonal(offset=-1, dim1=-2, dim2=-1), (1, 0))
    nxt = torch.nn.functional.pad(a.diagonal(offset=1, dim1=-2, dim2=-1), (0, 1))
    has_prev = content & torch.nn.functional.pad(content[:, :-1], (1, 0), value=False)
    has_next = content & torch.nn.functional.pad(content[:, 1:], (0, 1), value=False)
    out["previous"] = QueryMetric(prev, has_prev, inv_n)
    out["next"] = QueryMetric(nxt, has_next, inv_n)
    for name, where in pos.special.items():
        out[f"self_{name}"] = QueryMetric(self_mass, where, inv_n)
        out[f"to_{name}"] = QueryMetric(key_mass(where), content, where.sum(-1, keepdim=True).double() * inv_n)
    out["to_pad"] = QueryMetric(key_mass(~pos.valid), content, torch.zeros_like(inv_n))
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


def norm_weighted(pattern: Tensor, value_norms: Tensor) -> Tensor:
    """Kobayashi et al. (2020) norm-based attention: ``||A[i, j] f(x_j)||`` renormalised over keys.

    pattern [batch, head, query, key]; value_norms [batch, head, key] = ``||f_h(x_j)||`` -> [batch, head,
    query, key], each row summing to 1 (rows whose weighted mass is 0 stay 0).
    """
    if value_norms.shape != (pattern.shape[0], pattern.shape[1], pattern.shape[3]):
        raise ValueError(
            f"value_norms must be [batch, head, key] = {(pattern.shape[0], pattern.shape[1], pattern.shape[3])}"
            f" to match pattern {tuple(pattern.shape)}; got {tuple(value_norms.shape)}"
        )
    weighted = pattern * value_norms[:, :, None, :]
    total = weighted.sum(-1, keepdim=True)
    return torch.where(total > 0, weighted / total.clamp(min=torch.finfo(total.dtype).tiny), 0.0)


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
    weights = boot_weights(n_sent, n_boot=n_boot, seed=seed)
    quantiles = torch.tensor([(1 - ci) / 2, 1 - (1 - ci) / 2], dtype=torch.float64)

    def interval(x: Tensor) -> tuple[Tensor, Tensor]:  # [draw, head] -> CI bounds over draws 1.., [head] each
        quantile = torch.quantile if bool(torch.isfinite(x[1:]).all()) else torch.nanquantile
        return tuple(quantile(x[1:], quantiles, dim=0))

    frames = []
    for metric in tallies.metrics:
        counts = weights @ tallies.counts[metric]  # [draw]
        value, null, kind, offset, uniform = metric_draws(tallies, metric, weights)
        ratio = _divide(value, null)
        ci_low, ci_high = interval(value)
        ratio_low, ratio_high = interval(ratio)
        frames.append(
            pd.DataFrame(
                {
                    "head": np.arange(value.shape[1]),
                    "metric": metric,
                    "value": value[0].numpy(),
                    "ci_low": ci_low.numpy(),
                    "ci_high": ci_high.numpy(),
                    "null": null[0].numpy(),
                    "null_kind": kind,
                    "ratio": ratio[0].numpy(),
                    "ratio_ci_low": ratio_low.numpy(),
                    "ratio_ci_high": ratio_high.numpy(),
                    "null_offset": offset[0].numpy(),
                    "ratio_offset": _divide(value, offset)[0].numpy(),
                    "null_uniform": uniform[0].numpy(),
                    "ratio_uniform": _divide(value, uniform)[0].numpy(),
                    "n_queries": int(counts[0]),
                    "n_sentences": n_sent,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def boot_weights(n: int, *, n_boot: int, seed: int, subset: Tensor | None = None) -> Tensor:
    """Group-bootstrap multiplicities over ``n`` sentences -> [n_boot + 1, n] float64.

    Row 0 is the full sample (weight 1 on every sentence); rows 1.. resample the sentences with replacement.
    ``subset`` (indices): only those sentences take part (weight 0 elsewhere, each draw resamples the subset's
    own size), as for one half of a held-out split. The one bootstrap of the same-token experiment.
    """
    idx = torch.arange(n) if subset is None else torch.as_tensor(subset, dtype=torch.long)
    generator = torch.Generator().manual_seed(seed)
    draws = idx[torch.randint(0, len(idx), (n_boot, len(idx)), generator=generator)]
    weights = torch.zeros(n_boot + 1, n, dtype=torch.float64)
    weights[0, idx] = 1.0
    weights[1:].scatter_add_(1, draws, torch.ones_like(draws, dtype=torch.float64))
    return weights


def metric_draws(tallies: Tallies, metric: str, weights: Tensor) -> tuple[Tensor, Tensor, str, Tensor, Tensor]:
    """One metric under sentence weights [draw, sentence] -> (value [draw, head], primary null [draw, head],
    null kind, offset-matched null [draw, head] (NaN if none), uniform null [draw, head] (NaN if none)).

    The primary null is the offset-matched one for the duplicate metrics where it is defined on the full
    sample, else the uniform one (kind "offset" | "uniform" | "")."""
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
    return value, (offset if use_offset else uniform), kind, offset, uniform


@dataclass
class QueryRows:
    """Per-query values of one metric, kept for type-balanced averages.

    sentence [query] (index into the corpus' sentences), token [query] (token id), values [query, head],
    uniform [query] (uniform null of the query). Only counted queries are kept. float64 / int64 on the CPU.
    """

    sentence: Tensor
    token: Tensor
    values: Tensor
    uniform: Tensor

    @classmethod
    def from_metric(cls, m: QueryMetric, input_ids: Tensor, first_sentence: int) -> QueryRows:
        """Keep the counted queries of ``m`` (values [batch, head, query]); sentences numbered from
        ``first_sentence``."""
        b, q = torch.nonzero(m.counted, as_tuple=True)
        return cls(
            sentence=(b + first_sentence).cpu(),
            token=input_ids[b, q].cpu(),
            values=m.values[b, :, q].double().cpu(),
            uniform=m.uniform[b, q].double().cpu(),
        )

    @classmethod
    def concat(cls, parts: list[QueryRows]) -> QueryRows:
        """Stack the queries of several batches."""
        return cls(*(torch.cat([getattr(p, f) for p in parts]) for f in ("sentence", "token", "values", "uniform")))

    def to_arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        """Flat numpy arrays for the step cache."""
        return {f"{prefix}{f}": getattr(self, f).numpy() for f in ("sentence", "token", "values", "uniform")}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], prefix: str = "") -> QueryRows:
        """Inverse of :meth:`to_arrays`."""
        return cls(*(torch.from_numpy(np.asarray(arrays[f"{prefix}{f}"]))
                     for f in ("sentence", "token", "values", "uniform")))


def type_balanced_draws(rows: QueryRows, weights: Tensor) -> tuple[Tensor, Tensor]:
    """Type-balanced mean under sentence weights [draw, sentence]: per token type the mean over its queries,
    then the unweighted mean over the types present in the draw -> (value [draw, head], uniform null [draw]).

    A type with a weighted count c contributes each of its queries with weight w / c; every present type
    then counts once, however often it occurs (so "the" counts as much as a noun seen twice)."""
    _, type_index = torch.unique(rows.token, return_inverse=True)
    n_types = int(type_index.max()) + 1 if len(type_index) else 0
    w = weights[:, rows.sentence]  # [draw, query]
    per_type = torch.zeros(len(weights), n_types, dtype=torch.float64).index_add_(1, type_index, w)  # [draw, type]
    present = (per_type > 0).sum(-1).double()  # [draw]
    coef = _divide(w, per_type[:, type_index]).nan_to_num(0.0)  # [draw, query]
    value = _divide(coef @ rows.values, present[:, None])
    null = _divide(coef @ rows.uniform, present)
    return value, null


def held_out_top(
    score: Callable[[dict[str, Tensor]], Tensor],
    report: Mapping[str, Callable[[dict[str, Tensor]], Tensor]],
    halves: tuple[dict[str, Tensor], dict[str, Tensor]],
    *,
    k: int = 5,
    ci: float = 0.95,
) -> list[dict]:
    """Top-``k`` heads chosen on one half of the sentences and reported on the other, both ways, averaged.

    halves: two dicts corpus -> boot weights [draw, sentence] (row 0 = the half itself, rows 1.. its group
    bootstrap draws; see :func:`boot_weights` with ``subset``); score(weights) -> [draw, head] (larger =
    better); report[name](weights) -> [draw, head]. In every draw the heads are re-chosen on the resampled
    choosing half, so the interval includes the selection's variance. -> one dict per (rank, reported name):
    rank, chosen (head index chosen on half 1, on half 2 at draw 0), name, value, ci_low, ci_high.
    """
    quantiles = torch.tensor([(1 - ci) / 2, 1 - (1 - ci) / 2], dtype=torch.float64)
    scores = [score(h).nan_to_num(float("-inf")) for h in halves]
    tops = [s.topk(min(k, s.shape[1]), dim=1).indices for s in scores]  # [draw, k] per choosing half
    reported = {name: [fn(h) for h in halves] for name, fn in report.items()}
    rows = []
    for rank in range(tops[0].shape[1]):
        for name, (on_1, on_2) in reported.items():
            # chosen on half 1 -> read on half 2, and the other way; averaged per draw
            a = on_2.gather(1, tops[0][:, rank : rank + 1])[:, 0]
            b = on_1.gather(1, tops[1][:, rank : rank + 1])[:, 0]
            both = (a + b) / 2
            low, high = torch.nanquantile(both[1:], quantiles)
            rows.append({"rank": rank + 1, "chosen": (int(tops[0][0, rank]), int(tops[1][0, rank])), "name": name,
                         "value": float(both[0]), "ci_low": float(low), "ci_high": float(high)})
    return rows


# ------------------------------------------------------------------------------------------------ helpers


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
