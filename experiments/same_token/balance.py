"""Type-balanced duplicate mass: per token type the mean over its queries, then the mean over types.

Pooled duplicate mass (``measures``: a ratio of sums over every query with a copy) is dominated by frequent
types: on natural text most copy pairs are determiners ("the", "a"), so the pooled number is mostly a
statistic about them. The type-balanced mass gives every token type that has a copy one vote, however
often it occurs. Its uniform null is balanced the same way (per type the mean of ``|D(i)| / n``, then the
mean over types). Sentences are the bootstrap's groups, as for every other same-token interval.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from bertscope.experiments.same_token.measures import QueryMetric, boot_weights, divide
from bertscope.probes.bootstrap import percentile_interval
from torch import Tensor

FIELDS = ("sentence", "token", "values", "uniform")


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
        """Keep the counted queries of ``m`` (values [batch, head, query]; input_ids [batch, pos]); sentences
        numbered from ``first_sentence``."""
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
        return cls(*(torch.cat([getattr(p, f) for p in parts]) for f in FIELDS))

    def to_arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        """Flat numpy arrays for the step cache."""
        return {f"{prefix}{f}": getattr(self, f).numpy() for f in FIELDS}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], prefix: str = "") -> QueryRows:
        """Inverse of :meth:`to_arrays`."""
        return cls(*(torch.from_numpy(np.asarray(arrays[f"{prefix}{f}"])) for f in FIELDS))


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
    coef = divide(w, per_type[:, type_index]).nan_to_num(0.0)  # [draw, query]
    value = divide(coef @ rows.values, present[:, None])
    null = divide(coef @ rows.uniform, present)
    return value, null


def type_balanced_table(
    rows: QueryRows, n_sentences: int, *, n_boot: int, seed: int, level: float = 0.95
) -> pd.DataFrame:
    """Rows like :func:`measures.summarize`'s (head index, metric ``duplicate_type_balanced``, value, CI,
    uniform null, ratio with CI) from the per-query duplicate masses ``rows``."""
    value, null = type_balanced_draws(rows, boot_weights(n_sentences, n_boot=n_boot, seed=seed))
    ratio = value / null[:, None]
    low, high = percentile_interval(value[1:].numpy(), level)
    r_low, r_high = percentile_interval(ratio[1:].numpy(), level)
    return pd.DataFrame({
        "head": np.arange(value.shape[1]), "metric": "duplicate_type_balanced", "value": value[0].numpy(),
        "ci_low": low, "ci_high": high, "null": float(null[0]), "null_kind": "uniform",
        "ratio": ratio[0].numpy(), "ratio_ci_low": r_low, "ratio_ci_high": r_high,
        "null_uniform": float(null[0]), "ratio_uniform": ratio[0].numpy(),
        "n_queries": len(rows.sentence), "n_sentences": n_sentences,
    })  # fmt: skip

