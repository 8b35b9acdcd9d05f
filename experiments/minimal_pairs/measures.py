"""The minimal-pairs tables from plain arrays (the template's ``measures`` role; no forward pass).

A pair is won when the good sentence's pseudo-log-likelihood (PLL) is higher (Salazar et al. 2020's BLiMP
protocol); ``win_normalised`` compares PLL per scored piece, so that a bad sentence with more pieces does not lose
by length alone. Accuracy is the share of pairs won, with the percentile interval of the bootstrap over pairs
(`probes.lens.pairs.pair_accuracy`, `probes.bootstrap`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from bertscope.probes.lens.pairs import first_preferring_stream, pair_accuracy, pair_scores

#: Grouping levels of the accuracy tables: level -> the pairs column it groups by (overall: none).
LEVELS: dict[str, str | None] = {"overall": None, "field": "field", "paradigm": "paradigm"}
#: Chance accuracy: a model with no preference wins half the pairs.
CHANCE = 0.5
#: The token-count (and word-count) control's groups, by the sign of (bad sentence's count - good sentence's).
DIFFERENCE = {1: "bad longer", 0: "same length", -1: "bad shorter"}
PAIR_COLUMNS = ["pair", "paradigm", "field", "phenomenon", "good", "bad"]


def sentence_table(pll: np.ndarray, n_tokens: np.ndarray) -> pd.DataFrame:
    """One method's per-sentence scores as `probes.lens.pll.sentence_pll`'s table: ``pll`` ``[s, t]``,
    ``n_tokens`` ``[t]`` -> ``sentence``, ``stream``, ``pll``, ``n_tokens``, ``pll_per_token``."""
    n_streams, n = pll.shape
    counts = np.tile(n_tokens, n_streams)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_token = np.where(counts > 0, pll.reshape(-1) / np.maximum(counts, 1), np.nan)
    return pd.DataFrame({"sentence": np.tile(np.arange(n), n_streams), "stream": np.repeat(np.arange(n_streams), n),
                         "pll": pll.reshape(-1), "n_tokens": counts, "pll_per_token": per_token})


def pair_rows(pairs: pd.DataFrame, pll: np.ndarray, n_tokens: np.ndarray, methods: Sequence[str]) -> pd.DataFrame:
    """Per pair, method and stream (``pll`` ``[m, s, 2 n]``, ``n_tokens`` ``[m, 2 n]`` over ``[*good, *bad]``):
    the pair's columns, ``stream``, ``pll_good``, ``pll_bad``, ``n_good``, ``n_bad``, ``win``, ``win_normalised``,
    ``method`` (`probes.lens.pairs.pair_scores`)."""
    parts = [pair_scores(pairs[PAIR_COLUMNS], sentence_table(pll[i], n_tokens[i]), method)
             for i, method in enumerate(methods)]
    return pd.concat(parts, ignore_index=True)


def results_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The main table: the last stream's rows (the model's own head), one per pair and method, with the
    length-normalised scores and the pieces and words the bad sentence has more than the good one."""
    out = rows[rows["stream"] == rows["stream"].max()].drop(columns="stream").reset_index(drop=True)
    out["pll_per_token_good"] = out["pll_good"] / out["n_good"].clip(lower=1)
    out["pll_per_token_bad"] = out["pll_bad"] / out["n_bad"].clip(lower=1)
    out["piece_difference"] = out["n_bad"] - out["n_good"]
    out["word_difference"] = out["bad"].str.split().str.len() - out["good"].str.split().str.len()
    first = ["method", *PAIR_COLUMNS]
    return out[[*first, *[c for c in out.columns if c not in first]]]


def accuracy_table(scores: pd.DataFrame, *, n_boot: int, seed: int, levels: Sequence[str] = tuple(LEVELS)
                   ) -> pd.DataFrame:
    """Accuracy per method (and stream, when ``scores`` has one) at each level (overall, per field, per
    paradigm), raw and normalised: ``method``, ``level``, ``group``, [``stream``], ``score``, ``accuracy``,
    ``low``, ``high`` (95% percentile bootstrap over pairs), ``n_pairs``."""
    parts = []
    for level in levels:
        column = LEVELS[level]
        by = ("method",) if column is None else ("method", column)
        table = pair_accuracy(scores, by=by, n_boot=n_boot, seed=seed)
        table = table.rename(columns={column: "group"}) if column else table.assign(group="all")
        parts.append(table.assign(level=level))
    out = pd.concat(parts, ignore_index=True)
    first = ["method", "level", "group", *(["stream"] if "stream" in out else [])]
    return out[[*first, *[c for c in out.columns if c not in first]]]


def length_control(results: pd.DataFrame, *, n_boot: int, seed: int) -> pd.DataFrame:
    """The token-count control: accuracy raw and normalised per method, for pairs where the bad sentence has more,
    as many or fewer word pieces (``unit`` "pieces") and words (``unit`` "words") than the good one: ``method``,
    ``unit``, ``difference``, ``score``, ``accuracy``, ``low``, ``high``, ``n_pairs``. Raw PLL is a sum over
    pieces, so it favours the shorter sentence: "bad longer" pairs are won by length alone, "bad shorter" lost."""
    parts = []
    for unit, column in (("pieces", "piece_difference"), ("words", "word_difference")):
        signs = results.assign(difference=np.sign(results[column]).map(DIFFERENCE))
        parts.append(pair_accuracy(signs, by=("method", "difference"), n_boot=n_boot, seed=seed).assign(unit=unit))
    out = pd.concat(parts, ignore_index=True)
    return out[["method", "unit", "difference", *[c for c in out.columns if c not in ("method", "unit",
                                                                                       "difference")]]]


def first_layer(layers: pd.DataFrame) -> pd.DataFrame:
    """Per method, level and group of the per-stream accuracy: ``first_stream``, the first stream from which on the
    raw accuracy's lower bound stays above chance ("from which layer on does the model prefer the good
    sentence"; -1: not even at the last stream) (`probes.lens.pairs.first_preferring_stream`)."""
    order = {level: i for i, level in enumerate(LEVELS)}
    out = first_preferring_stream(layers, threshold=CHANCE)
    return out.sort_values(["method", "level", "group"], key=lambda c: c.map(order) if c.name == "level" else c,
                           ignore_index=True)


def summary_table(accuracy: pd.DataFrame) -> pd.DataFrame:
    """The headline rows: overall and per-field accuracy (the model's own head), raw and normalised."""
    return accuracy[accuracy["level"].isin(("overall", "field"))].reset_index(drop=True)
