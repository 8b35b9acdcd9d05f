"""Experiment ``minimal-pairs``: does the masked-LM head prefer the good sentence of a minimal pair, and from which
layer on?

Pairs: ``--corpus FILE`` (BLiMP's TSV or JSONL, or any CSV/TSV/JSONL with a good and a bad sentence per row and
optional paradigm, field and phenomenon columns; `data.PAIRS`), else the 30 builtin pairs of `data`. Each sentence
is scored by pseudo-log-likelihood (PLL; Salazar et al. 2020's ``original``, one mask per piece, and Kauf and
Ivanova 2023's ``within_word_l2r``), and, with the lens on, by the PLL computed with the logit lens of every stream
in place of the final head (stream 0 = the embeddings .. n_layers = the model's own prediction).

Tables: ``results`` (long: a row per pair and method: PLL of good and bad, raw and per scored piece, pieces,
wins), ``accuracy`` (per method, overall / field / paradigm, raw and normalised, 95% percentile bootstrap over
pairs), ``summary`` (its overall and field rows), ``length_control`` (accuracy split by the sign of the bad
minus good piece and word counts), ``layers`` (``accuracy`` per stream through the logit lens) and
``first_layer`` (the first stream from which on the lower bound stays above chance). Definitions:
``docs/experiments/minimal-pairs.md``.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
from bertscope.experiments.jobs import Job
from bertscope.experiments.minimal_pairs import data, measures
from bertscope.experiments.registry import CannotRun
from bertscope.experiments.settings import require
from bertscope.probes.lens.pll import PLL_METHODS

NAME = "minimal-pairs"
DIRNAME = "minimal_pairs"
SUMMARY_TABLES = ["summary", "length_control", "first_layer"]
#: What ``--corpus FILE`` holds when this experiment runs alone (read before anything is written).
PAIRS = data.PAIRS
#: Fewest pairs an interval over pairs is computed from.
MIN_PAIRS = 2


@dataclass(frozen=True)
class Settings:
    """What ``bertscope run minimal-pairs`` computes (``--set minimal-pairs.FIELD=VALUE``); checked when built."""

    methods: tuple[str, ...] = PLL_METHODS  # PLL methods: original (Salazar et al.), within_word_l2r (Kauf & Ivanova)
    lens: bool = True  # also score every stream through the logit lens (per-layer accuracy)
    bias: bool = True  # the head's output bias (Kobayashi et al. 2023: it carries word frequency)
    batch_rows: int = 256  # masked copies per forward pass
    chunk_pairs: int = 500  # pairs per cached job (an interrupted run resumes from the finished chunks)
    workers: int | None = None  # processes scoring chunks at once, one thread each (None: every core; 1: here)
    n_boot: int = 1000  # bootstrap resamples of the pairs for every interval

    def __post_init__(self) -> None:
        """Refuse settings no run could use (each message names the setting)."""
        require(self, positive=("batch_rows", "chunk_pairs", "n_boot", "workers"), subsets={"methods": PLL_METHODS},
                non_empty=("methods",))


CONVENTIONS = {
    "win": "the good sentence's PLL (natural log, summed over its scored pieces) is higher than the bad one's",
    "win_normalised": "the same with PLL per scored piece (a bad sentence with more pieces does not lose by "
    "length alone)",
    "ci": "95% percentile bootstrap over pairs (resampling pairs)",
    "stream": "0 = the embeddings, k = block k-1's output, read through the model's own masked-LM head (logit "
    "lens); the last stream is the model's prediction",
    "chance": "0.5: a model without a preference wins half the pairs",
}


def check(inputs: Any, settings: Settings) -> None:
    """Before anything is written: the model needs a masked-LM head, a pairs file at least two pairs."""
    if getattr(inputs.model, "mlm_head", None) is None:
        raise CannotRun(f"{inputs.model.source} has no masked-LM head, which pseudo-log-likelihood scoring needs: "
                        "give --model a checkpoint saved from a *ForMaskedLM model")
    if inputs.pairs is not None and len(inputs.pairs) < MIN_PAIRS:
        raise CannotRun(f"--corpus {inputs.pairs.source} has {len(inputs.pairs)} pair(s); at least {MIN_PAIRS} are "
                        "needed for intervals over pairs")


def run(ctx: Any, settings: Settings | None = None) -> pd.DataFrame:
    """Score the pairs, write the accuracy, control and per-layer tables; returns the per-pair table."""
    settings = ctx.use_settings(settings)
    ctx.note("settings", asdict(settings))
    ctx.note("conventions", CONVENTIONS)
    pairs, corpus = _pairs(ctx)
    arrays = _score(ctx, pairs, settings)
    rows = measures.pair_rows(pairs, arrays["pll"], arrays["n_tokens"], settings.methods)
    results = measures.results_table(rows)
    accuracy = measures.accuracy_table(results, n_boot=settings.n_boot, seed=ctx.seed)
    ctx.write_table(accuracy, "accuracy")
    ctx.write_table(measures.summary_table(accuracy), "summary")
    ctx.write_table(measures.length_control(results, n_boot=settings.n_boot, seed=ctx.seed), "length_control")
    if settings.lens:
        layers = measures.accuracy_table(rows, n_boot=settings.n_boot, seed=ctx.seed)
        ctx.write_table(layers, "layers")
        ctx.write_table(measures.first_layer(layers), "first_layer")
    results.insert(0, "corpus", corpus)
    results.insert(0, "model", ctx.model_id)
    return results


def _pairs(ctx: Any) -> tuple[pd.DataFrame, str]:
    """The run's pairs table (the ``--corpus`` file or the builtin set, capped by ``--max-sentences``), without
    pairs a sentence of which is longer than ``--max-length`` pieces (said and recorded); and the corpus name."""
    source = ctx.inputs.pairs
    if source is None:
        source = data.builtin_pairs()
        ctx.log(f"{len(source)} builtin pairs (give a pairs file with --corpus FILE, e.g. BLiMP's TSV)")
    ctx.note("pairs", source.summary())
    pairs = data.pairs_table(source, ctx.options.max_sentences)
    pieces = data.piece_counts(ctx.model.tokenizer, [*pairs["good"], *pairs["bad"]]).reshape(2, -1).max(0)
    too_long = pieces > ctx.options.max_length
    if too_long.any():
        ctx.warn(f"left out {int(too_long.sum())} pair(s) with a sentence over --max-length "
                 f"{ctx.options.max_length} pieces (first: pair {int(pairs['pair'][too_long].iloc[0])})")
        ctx.note("n_skipped_too_long", int(too_long.sum()))
        pairs = pairs[~too_long].reset_index(drop=True)
    if len(pairs) < MIN_PAIRS:
        raise CannotRun(f"{len(pairs)} pair(s) fit --max-length {ctx.options.max_length}; at least {MIN_PAIRS} are "
                        "needed for intervals over pairs")
    ctx.record_used({"pairs": len(pairs)}, unit="pairs")
    return pairs, source.name


def _score(ctx: Any, pairs: pd.DataFrame, settings: Settings) -> dict[str, np.ndarray]:
    """:func:`data.pair_pll` over the pairs, one cached job per ``chunk_pairs`` pairs on the job service's workers
    (forked, one thread each: chunks are independent, and two single-thread processes use two cores better than
    two threads on these small products); ``pll`` ``[m, s, 2 n]`` and ``n_tokens`` ``[m, 2 n]`` over
    ``[*good, *bad]``."""
    size, jobs = settings.chunk_pairs, []
    for start in range(0, len(pairs), size):
        chunk = pairs.iloc[start : start + size]
        digest = hashlib.sha256("\n".join([*chunk["good"], *chunk["bad"]]).encode()).hexdigest()[:16]
        fn = partial(data.pair_pll, ctx.model, list(chunk["good"]), list(chunk["bad"]), settings.methods,
                     batch_size=settings.batch_rows, streams=settings.lens, bias=settings.bias)
        jobs.append(Job("pll", {"start": start, "texts": digest}, fn, cost=len(chunk), kind="arrays"))
    service = ctx.jobs(workers=settings.workers, threads=None if settings.workers == 1 else 1)
    parts = service.run(jobs, "scoring pairs (chunks)")
    n = [min(size, len(pairs) - start) for start in range(0, len(pairs), size)]
    goods = [{k: v[..., :m] for k, v in part.items()} for part, m in zip(parts, n, strict=True)]
    bads = [{k: v[..., m:] for k, v in part.items()} for part, m in zip(parts, n, strict=True)]
    return {k: np.concatenate([p[k] for p in goods] + [p[k] for p in bads], axis=-1) for k in ("pll", "n_tokens")}
