"""Held-out top heads: chosen on one half of the sentences, reported on the other (both ways, averaged).

Choosing the top heads and reporting them on the same sentences inflates their numbers (the winner's curse).
Here each corpus' sentences are split once, at random (seeded), into two halves A and B. The top-k heads
chosen on A are read on B and those chosen on B are read on A; the reported value at rank r is the mean of
the two readings. The interval is a percentile group bootstrap (:mod:`bertscope.probes.bootstrap`) that
resamples each half's sentences independently and *re-chooses* the heads in every draw, so it carries the
selection's variance as well as the sampling variance of the reading.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd
import torch
from bertscope.experiments.same_token.balance import QueryRows, type_balanced_draws
from bertscope.experiments.same_token.control import CONTROL_CORPUS, RANDOM_CORPUS
from bertscope.experiments.same_token.measures import Tallies, boot_weights, metric_draws, metric_value
from bertscope.probes.bootstrap import percentile_interval
from torch import Tensor

Weights = dict[str, Tensor]  # corpus -> sentence weights [draw, sentence] (row 0: the half itself)
Statistic = Callable[[Weights], Tensor]  # weights -> [draw, head]


def held_out_table(
    stores: Mapping[str, Mapping[str, np.ndarray]],
    *,
    main: str,
    n_boot: int = 1000,
    seed: int = 0,
    k: int = 5,
    level: float = 0.95,
) -> pd.DataFrame:
    """Top-k heads per criterion, chosen held-out (:func:`held_out_top`), for both head weightings.

    stores: corpus -> :func:`.collect.collect`'s arrays. On ``main`` (the run's corpus, unless it is
    repeated-random) the heads are chosen by duplicate mass / primary null and reported as pooled and
    type-balanced duplicate mass and that ratio; on repeated-random with its control they are chosen by
    copy-specific mass and reported as copy-specific, repeated and control mass.
    Columns: corpus, weighting, criterion, rank, layer, head (chosen on half 1), layer_other, head_other
    (chosen on half 2), metric, value, ci_low, ci_high, selection (= "held-out"), n_sentences.
    """
    n_heads = int(next(iter(stores.values()))["n_heads"])
    halves = _halves(stores, n_boot=n_boot, seed=seed)
    rows = []
    for weighting in ("attention", "norm"):
        t = {name: Tallies.from_arrays(a, f"head|{weighting}|") for name, a in stores.items()}
        q = {name: QueryRows.from_arrays(a, f"rows|{weighting}|") for name, a in stores.items()}
        for corpus, criterion, score, report in _plans(t, q, main):
            for r in held_out_top(score, report, halves, k=k, level=level):
                h1, h2 = r["chosen"]
                rows.append({"corpus": corpus, "weighting": weighting, "criterion": criterion, "rank": r["rank"],
                             "layer": h1 // n_heads, "head": h1 % n_heads, "layer_other": h2 // n_heads,
                             "head_other": h2 % n_heads, "metric": r["name"], "value": r["value"],
                             "ci_low": r["ci_low"], "ci_high": r["ci_high"], "selection": "held-out",
                             "n_sentences": t[corpus].n_sentences})  # fmt: skip
    return pd.DataFrame(rows)


def held_out_top(
    score: Statistic,
    report: Mapping[str, Statistic],
    halves: tuple[Weights, Weights],
    *,
    k: int = 5,
    level: float = 0.95,
) -> list[dict]:
    """Top-``k`` heads chosen on one half of the sentences and reported on the other, both ways, averaged.

    halves: two dicts corpus -> sentence weights [draw, sentence] (row 0 = the half itself, rows 1.. its group
    bootstrap draws: :func:`.measures.boot_weights` with ``subset``); score(weights) -> [draw, head] (larger =
    better); report[name](weights) -> [draw, head]. In every draw the heads are re-chosen on the resampled
    choosing half. -> one dict per (rank, reported name): rank, chosen (head index chosen on half 1, on half 2,
    at draw 0), name, value, ci_low, ci_high (percentile interval at ``level`` over draws 1..).
    """
    scores = [score(h).nan_to_num(float("-inf")) for h in halves]
    tops = [s.topk(min(k, s.shape[1]), dim=1).indices for s in scores]  # [draw, k] per choosing half
    reported = {name: [fn(h) for h in halves] for name, fn in report.items()}
    rows = []
    for rank in range(tops[0].shape[1]):
        for name, (on_1, on_2) in reported.items():
            # chosen on half 1 -> read on half 2, and the other way; averaged per draw
            a = on_2.gather(1, tops[0][:, rank : rank + 1])[:, 0]
            b = on_1.gather(1, tops[1][:, rank : rank + 1])[:, 0]
            both = ((a + b) / 2).numpy()
            low, high = percentile_interval(both[1:], level)
            rows.append({"rank": rank + 1, "chosen": (int(tops[0][0, rank]), int(tops[1][0, rank])), "name": name,
                         "value": float(both[0]), "ci_low": float(low), "ci_high": float(high)})
    return rows


def _halves(stores: Mapping[str, Mapping[str, np.ndarray]], *, n_boot: int, seed: int) -> tuple[Weights, Weights]:
    """One seeded random split of each corpus' sentences into two halves, with each half's bootstrap weights."""
    out: tuple[Weights, Weights] = ({}, {})
    for c, (name, arrays) in enumerate(stores.items()):
        n = int(arrays["head|attention|noncopy_count"].shape[0])
        if n < 4:
            raise ValueError(f"corpus {name!r} has {n} sentences; a held-out split needs at least 4")
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 101 * c))
        for i, part in enumerate((perm[: n // 2], perm[n // 2 :])):
            out[i][name] = boot_weights(n, n_boot=n_boot, seed=seed + 10 * c + i, subset=part.sort().values)
    return out


def _plans(
    t: Mapping[str, Tallies], q: Mapping[str, QueryRows], main: str
) -> list[tuple[str, str, Statistic, dict[str, Statistic]]]:
    """(corpus, criterion, score, report) for :func:`held_out_table`, for one weighting's tallies ``t`` and
    per-query rows ``q`` by corpus."""

    def dup(name: str) -> Statistic:
        return _once(lambda w: metric_value(t[name], "duplicate", w[name]))

    @_once
    def ratio(w: Weights) -> Tensor:
        value, null, *_ = metric_draws(t[main], "duplicate", w[main])
        return value / null

    @_once
    def balanced(w: Weights) -> Tensor:
        return type_balanced_draws(q[main], w[main])[0]

    dup_repeated, dup_control = dup(RANDOM_CORPUS), dup(CONTROL_CORPUS)

    @_once
    def specific(w: Weights) -> Tensor:
        return dup_repeated(w) - dup_control(w)

    plans = []
    if main in t and main not in (RANDOM_CORPUS, CONTROL_CORPUS):
        plans.append((main, "duplicate / primary null", ratio,
                      {"duplicate": dup(main), "duplicate_ratio": ratio, "duplicate_type_balanced": balanced}))
    if RANDOM_CORPUS in t and CONTROL_CORPUS in t:
        plans.append((RANDOM_CORPUS, "copy-specific mass (repeated - control)", specific,
                      {"duplicate_copy_specific": specific, "duplicate": dup_repeated,
                       "control_duplicate": dup_control}))
    return plans


def _once(fn: Statistic) -> Statistic:
    """``fn`` computed once per weights dict (a half is scored and read by several statistics)."""
    memo: dict[int, tuple[Weights, Tensor]] = {}

    def wrapped(w: Weights) -> Tensor:
        if id(w) not in memo:
            memo[id(w)] = (w, fn(w))  # keep w alive so its id is not reused
        return memo[id(w)][1]

    return wrapped
