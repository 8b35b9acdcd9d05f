"""Minimal pairs scored by pseudo-log-likelihood: the model prefers the good sentence when its PLL is higher
(Salazar et al. 2020's BLiMP protocol), raw and length-normalised, through every stream's logit lens if asked.

Pairs come from BLiMP's TSV (``uid``, ``field``, ``linguistics_term``, ``pair_id``, ``sentence_good``,
``sentence_bad``; gzip or not) or JSONL (BLiMP's own ``data/*.jsonl`` rows), or any TSV/JSONL with a good and a bad
sentence per row (``sentence_good``/``sentence_bad`` or ``good``/``bad``) and an optional ``paradigm`` (or ``uid``)
column.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..bootstrap import percentile_interval
from .pll import sentence_pll, token_pll

_ALIASES = {"sentence_good": "good", "sentence_bad": "bad", "uid": "paradigm"}


def read_pairs(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Pairs table: ``pair`` (row index), ``good``, ``bad``, ``paradigm`` ("all" when absent), ``field`` ("" when
    absent). Raises ``ValueError`` (one line) for a file without a good and a bad sentence column or with an empty
    sentence."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no pairs file at {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    stem = path.name.removesuffix(".gz")
    with opener(path, "rt", encoding="utf-8") as f:
        if stem.endswith(".jsonl"):
            try:
                table = pd.DataFrame([json.loads(line) for line in f if line.strip()])
            except json.JSONDecodeError as err:
                raise ValueError(f"{path} is not JSONL: {err}") from None
        elif stem.endswith(".tsv"):
            table = pd.read_csv(f, sep="\t", quoting=3, dtype=str, keep_default_na=False)
        else:
            raise ValueError(f"pairs must be a .tsv or .jsonl file (optionally .gz), got {path.name}")
    table = table.rename(columns={k: v for k, v in _ALIASES.items() if k in table.columns and v not in table.columns})
    missing = [c for c in ("good", "bad") if c not in table.columns]
    if missing:
        raise ValueError(f"{path} has no {' or '.join(missing)} sentence column (sentence_good/sentence_bad or "
                         f"good/bad); its columns: {', '.join(map(str, table.columns))}")
    if len(table) == 0:
        raise ValueError(f"{path} holds no pairs")
    table["good"], table["bad"] = table["good"].astype(str), table["bad"].astype(str)
    empty = (table["good"].str.strip() == "") | (table["bad"].str.strip() == "")
    if empty.any():
        raise ValueError(f"{path}: pair {int(np.flatnonzero(empty)[0])} has an empty sentence")
    out = pd.DataFrame({"pair": np.arange(len(table)), "good": table["good"], "bad": table["bad"],
                        "paradigm": table["paradigm"].astype(str) if "paradigm" in table else "all",
                        "field": table["field"].astype(str) if "field" in table else ""})  # fmt: skip
    return out.reset_index(drop=True)


def score_pairs(model: Any, pairs: pd.DataFrame, method: str = "original", *, batch_size: int = 64,
                streams: bool = False) -> pd.DataFrame:
    """One row per pair (and stream with ``streams=True``): the pair's columns, ``pll_good``, ``pll_bad``,
    ``n_good``, ``n_bad`` (scored pieces), ``win`` (good PLL > bad PLL) and ``win_normalised`` (the same per
    scored piece, so that a bad sentence with more pieces does not lose by length alone)."""
    sentences = [*pairs["good"], *pairs["bad"]]
    scores = sentence_pll(token_pll(model, sentences, method, batch_size=batch_size, streams=streams), len(sentences))
    return pair_scores(pairs, scores, method)


def pair_scores(pairs: pd.DataFrame, scores: pd.DataFrame, method: str = "original") -> pd.DataFrame:
    """`score_pairs`' table from per-sentence scores already computed: ``scores`` is `sentence_pll`'s table (or
    any with ``sentence``, ``pll``, ``n_tokens``, ``pll_per_token`` and optionally ``stream``) over the ``2 n``
    sentences ``[*pairs["good"], *pairs["bad"]]``."""
    n = len(pairs)
    keys = ["stream"] if "stream" in scores.columns else []
    good = scores[scores["sentence"] < n].set_index(["sentence", *keys])
    bad = scores[scores["sentence"] >= n].assign(sentence=lambda d: d["sentence"] - n).set_index(["sentence", *keys])
    joined = good.merge(bad, left_index=True, right_index=True, suffixes=("_good", "_bad")).reset_index()
    out = pairs.reset_index(drop=True).iloc[joined["sentence"].to_numpy()].reset_index(drop=True)
    if keys:
        out["stream"] = joined["stream"].to_numpy()
    out["pll_good"], out["pll_bad"] = joined["pll_good"].to_numpy(), joined["pll_bad"].to_numpy()
    out["n_good"], out["n_bad"] = joined["n_tokens_good"].to_numpy(), joined["n_tokens_bad"].to_numpy()
    out["win"] = out["pll_good"] > out["pll_bad"]
    out["win_normalised"] = joined["pll_per_token_good"].to_numpy() > joined["pll_per_token_bad"].to_numpy()
    out["method"] = method
    return out


def pair_accuracy(scores: pd.DataFrame, by: tuple[str, ...] = ("paradigm",), *, n_boot: int = 1000,
                  level: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Accuracy (share of pairs won) per group of ``by`` (and per stream when ``scores`` has one), raw and
    length-normalised, each with the percentile interval of the bootstrap over pairs (`win_shares`): ``score``
    ("raw" or "normalised"), ``accuracy``, ``low``, ``high``, ``n_pairs``. ``by=()`` gives the overall accuracy."""
    keys = [*by, *(["stream"] if "stream" in scores.columns else [])]
    rows = []
    for key, group in (scores.groupby(keys, sort=True) if keys else [((), scores)]):
        key = key if isinstance(key, tuple) else (key,)
        wins = group[["win", "win_normalised"]].to_numpy(dtype=bool)  # [pair, 2]
        value, low, high = win_shares(wins, n_boot=n_boot, level=level, seed=seed)
        for i, score in enumerate(("raw", "normalised")):
            rows.append({**dict(zip(keys, key, strict=True)), "score": score, "accuracy": value[i],
                         "low": low[i], "high": high[i], "n_pairs": len(group)})  # fmt: skip
    return pd.DataFrame(rows)


def win_shares(wins: np.ndarray, *, n_boot: int = 1000, level: float = 0.95, seed: int = 0
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shares of True in each column of ``wins`` ``[pair, k]`` (bool) and their percentile intervals of the
    bootstrap over pairs: ``(value [k], low [k], high [k])``.

    Resampling ``n`` pairs with replacement draws each distinct row of ``wins`` (at most ``2^k`` outcomes) with its
    frequency, so the resampled counts of the outcomes are ``Multinomial(n, frequencies)``: drawn directly, the
    bootstrap costs ``n_boot`` draws instead of ``n_boot * n`` (BLiMP's 67,000 pairs: 60 CPU seconds -> under
    one), with the same distribution as `probes.bootstrap.ratio_of_sums` over pairs (tested against it)."""
    wins = np.asarray(wins, dtype=bool)
    if wins.ndim != 2 or wins.shape[0] == 0:
        raise ValueError(f"wins must be [pair, k] with at least one pair, got {wins.shape}")
    n = wins.shape[0]
    value = wins.mean(0)
    outcomes, counts = np.unique(wins, axis=0, return_counts=True)  # [m, k], [m]
    draws = np.random.default_rng(seed).multinomial(n, counts / n, size=n_boot)  # [n_boot, m]
    low, high = percentile_interval(draws @ outcomes.astype(np.float64) / n, level)
    return value, low, high


def first_preferring_stream(accuracy: pd.DataFrame, threshold: float = 0.5) -> pd.DataFrame:
    """Per group of a per-stream ``pair_accuracy`` table: the first stream from which on the raw accuracy's lower
    bound stays above ``threshold`` ("from which layer on does the model prefer the good sentence"); -1 if none."""
    raw = accuracy[accuracy["score"] == "raw"]
    keys = [c for c in raw.columns if c not in ("stream", "score", "accuracy", "low", "high", "n_pairs")]
    rows = []
    for key, group in (raw.groupby(keys, sort=True) if keys else [((), raw)]):
        above = group.sort_values("stream")["low"].to_numpy() > threshold
        tail = np.flatnonzero(~above)
        first = 0 if tail.size == 0 else (int(tail[-1]) + 1 if tail[-1] + 1 < above.size else -1)
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(keys, key, strict=True)), "first_stream": first})
    return pd.DataFrame(rows)
