"""Experiment ``same-token``: does attention favour identical tokens, raw and learned?

The tutorials claim that plain scaled dot-product attention with Q = K = V = the embeddings puts very large
weight on identical tokens, and that learned projections exist to escape this. This experiment measures:

1. **raw attention** ``softmax(X X^T / sqrt(d_model))`` with X = the word embeddings alone
   (``embed.hook_word``), the embedding output (``embed.hook_out``) and every layer's
   ``blocks.L.hook_resid_post``: self mass, duplicate mass, argmax-is-self-or-copy rate, logit gap;
2. **every learned head** from ``blocks.L.attn.hook_pattern``: self, duplicate (both directions and
   earlier-only), previous/next mass and the special-token lines, against uniform and offset-matched nulls,
   plain and norm-weighted (Kobayashi et al. 2020: ``||A[i, j] f_h(x_j)||`` with ``f_h(x) = (x W_V[h] +
   b_V[h]) W_O[h]``, i.e. ``hook_v`` times ``W_O[h]``; the head's share of the value bias is included, the
   output bias ``b_O`` is not, since it is shared by all heads and every row of A sums to 1);
3. on the chosen corpus (natural repetition) and on ``repeated-random`` (random tokens repeated at offset m);
4. a context-free **weight view**: for a seeded sample of vocabulary tokens, how often a head's
   ``(x W_Q + b_Q)(x W_K + b_K)^T`` ranks a token's own key first (x = the embedding output of the token
   alone with the position embedding replaced by its mean; exact input for layer 0 of a post-LN model,
   a direct-path approximation for later layers).

Beside repeated-random, its non-repeating control ``random-control`` (:mod:`.control`) gives the copy-specific
mass; on every corpus the duplicate mass is also type-balanced (:mod:`.balance`); the top heads are chosen
held-out (:mod:`.held_out`). Every interval is a percentile group bootstrap (:mod:`bertscope.probes.bootstrap`)
over sentences (tokens for the weight view).

Files by role: ``data`` (the model pass and the long table; old name ``collect``), ``measures`` (per-query metrics,
tallies, nulls), ``balance``, ``control``, ``held_out``, ``weights`` (the W_QK view), ``examples`` (maps for the
figures), ``plots``, ``findings``. Tables: ``results`` (long: model, corpus, source ``raw|head``, site, layer, head,
weighting, metric, value, ci_low, ci_high, null, null_kind, ratio, ...; raw rows have ``head = -1`` and ``layer =
-1`` for the embedding sites, else the layer whose ``hook_resid_post`` was used), ``held_out``, ``summary`` and
``example_maps`` (attention maps of a repeated sentence for the figures).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd
from bertscope.experiments.activations import open_capture
from bertscope.experiments.options import sentences_used
from bertscope.experiments.same_token.control import CONTROL_CORPUS, RANDOM_CORPUS, control_corpus, copy_specific
from bertscope.experiments.same_token.data import Progress, collect, tables
from bertscope.experiments.same_token.data import sites as collect_sites
from bertscope.experiments.same_token.examples import example_maps
from bertscope.experiments.same_token.held_out import held_out_table
from bertscope.experiments.same_token.measures import DUPLICATE_METRICS
from bertscope.experiments.same_token.plots import plot
from bertscope.experiments.same_token.weights import weight_view

NAME = "same-token"
DIRNAME = "same_token"
SUMMARY_TABLES = ["summary"]
__all__ = ["NAME", "DIRNAME", "SUMMARY_TABLES", "check", "run", "plot", "measure", "weight_view", "example_maps"]


@dataclass(frozen=True)
class Settings:
    """Sizes of the same-token run (recorded in the manifest; part of the step-cache key)."""

    max_sentences: int = 200  # the run's corpus, when --max-sentences is not given
    random_sentences: int = 100  # repeated-random beside it, and its control (2m = 40 queries with a copy each)
    n_boot: int = 1000  # bootstrap resamples behind every interval
    vocab_sample: int = 2000  # tokens of the weight view
    example_max_tokens: int = 40  # longest sentence drawn as an example map
    random_corpus: str = RANDOM_CORPUS  # the second corpus, measured beside --corpus (with its control)
    top_k: int = 5  # heads chosen held-out per criterion
    ci: float = 0.95  # level of every percentile interval

    def __post_init__(self) -> None:
        from bertscope.experiments.settings import require

        require(self, positive=("max_sentences", "random_sentences", "n_boot", "vocab_sample", "example_max_tokens",
                                "top_k"), fraction=("ci",))
        if not re.fullmatch(r"repeated-random(:m=\d+)?", self.random_corpus):
            raise ValueError(f"random_corpus must be repeated-random or repeated-random:m=<int>, got "
                             f"{self.random_corpus!r}")


CONVENTIONS = {
    "raw rows": "source=raw, head=-1; layer=-1 for embed.hook_word/embed.hook_out, else the layer of hook_resid_post",
    "raw attention": "softmax(X X^T / sqrt(d_model)) over real tokens; copies with identical X tie exactly",
    "norm weighting": "||A[i,j] (x_j W_V[h] + b_V[h]) W_O[h]|| renormalised per query; b_O excluded (shared)",
    "duplicates": "other content positions with the same token id; [CLS]/[SEP]/padding excluded",
    "null": "offset-matched for duplicate metrics where defined, else uniform (see null_kind)",
    "control": "random-control: 2m distinct words from repeated-random's pool; its 'duplicate' is the mass at the "
    "would-be copy (offset +-m); duplicate_copy_specific = repeated-random duplicate minus that",
    "type-balanced": "duplicate_type_balanced: per token type the mean duplicate mass, then the mean over types",
    "held-out": "held_out table: top heads chosen on one half of the sentences, reported on the other, both ways "
    "averaged; intervals re-choose in every bootstrap draw",
    "ci": "percentile group bootstrap at Settings.ci (95%) over sentences (tokens for the weight view); "
    "intervals cover sentence sampling only (the model is fixed; the weight view's token sample is seeded)",
    "weight view": "x = LN(word + type 0 + mean position) of each token alone; biases b_Q, b_K included",
}


MIN_SENTENCES = 4  # the held-out head choice splits each corpus in two halves of at least 2 (`held_out`)


def check(inputs: Any, settings: Settings) -> None:
    """Refuse (`registry.CannotRun`) a corpus of fewer than 4 sentences (the held-out head choice needs two
    halves), before anything is written."""
    from bertscope.experiments.registry import CannotRun

    corpus = inputs.corpus
    if len(corpus) < MIN_SENTENCES:
        raise CannotRun(f"needs at least {MIN_SENTENCES} sentences (heads are chosen on one half and reported on "
                        f"the other), and corpus {corpus.name!r} has {len(corpus)}; use a larger --corpus or "
                        "--max-sentences")


def run(ctx: Any, settings: Settings | None = None) -> pd.DataFrame:
    """The framework entry point: measure every source on the corpora (the run's, repeated-random and its
    control) plus the weight view; write ``example_maps``, ``held_out`` and ``summary``; return the long
    results table."""
    settings = ctx.use_settings(settings)
    corpora = _corpora(ctx, settings)
    random = _record_inputs(ctx, settings, corpora)
    stats = {"n_boot": settings.n_boot, "seed": ctx.seed, "level": settings.ci}
    stores, frames = {}, []
    source = open_capture(ctx.options.activations, ctx.model)  # --activations: the run's corpus from a capture
    for corpus in corpora:
        stores[corpus.name] = _collect_step(ctx, corpus, source if corpus is corpora[0] else None)
        ctx.log(f"{corpus.name}: self and duplicate masses with {settings.n_boot} bootstrap draws")
        frames.append(ctx.step(f"measure_{corpus.name}", lambda c=corpus.name: tables(stores[c], corpus=c, **stats)))
    if random is not None:
        frames.append(ctx.step("copy_specific", lambda: copy_specific(stores[RANDOM_CORPUS], stores[CONTROL_CORPUS],
                                                                      **stats)))  # fmt: skip
    ctx.log("held-out head choice (chosen on one half of the sentences, reported on the other); weight view")
    held_out = ctx.step("held_out", lambda: held_out_table(stores, main=ctx.corpus.name, k=settings.top_k, **stats))
    frames.append(ctx.step("weights", lambda: weight_view(ctx.model, n_tokens=settings.vocab_sample, **stats)))
    results = pd.concat(frames, ignore_index=True)
    results.insert(0, "model", ctx.model_id)
    _log_null_fallback(ctx, results)
    ctx.log("example attention maps")
    maps = ctx.step(
        "example_maps", lambda: example_maps(ctx.model, corpora, results, max_tokens=settings.example_max_tokens)
    )
    ctx.write_table(maps, "example_maps", formats=("parquet",))
    ctx.write_table(held_out.assign(model=ctx.model_id), "held_out")
    ctx.write_table(summary_table(results, held_out), "summary")
    return results


def _record_inputs(ctx: Any, settings: Settings, corpora: list) -> Any:
    """Note the settings and the sentences of each corpus (part of ``run``); returns repeated-random (or None)."""
    ctx.note("settings", asdict(settings))
    ctx.note("n_boot", settings.n_boot)
    ctx.note("vocab_sample", settings.vocab_sample)
    ctx.note("sentences_per_corpus", {c.name: len(c) for c in corpora})
    ctx.record_used({c.name: len(c) for c in corpora}, available=len(ctx.corpus),
                    more="--set same-token.max_sentences=N")
    random = next((c for c in corpora if c.name == RANDOM_CORPUS), None)
    ctx.note("repeated_random_meta", dict(random.meta) if random is not None else None)
    ctx.note("conventions", CONVENTIONS)
    return random


def _log_null_fallback(ctx: Any, results: pd.DataFrame) -> None:
    """Say, per corpus, where the offset-matched null was undefined and the uniform null stood in."""
    fallback = results[results.metric.isin(DUPLICATE_METRICS) & (results.null_kind == "uniform")]
    for corpus in sorted(fallback.corpus.unique()):
        ctx.log(
            f"{corpus}: some copies sit at offsets where every content pair is a copy, so the offset-matched "
            "null is undefined there (null_offset = NaN); null/ratio use the uniform null (null_kind)"
        )


def measure(
    model: Any,
    encoded: Iterable[Any],
    *,
    corpus: str,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    progress: Progress | None = None,
    shadow_m: int | None = None,
) -> pd.DataFrame:
    """Raw attention at every site and every learned head (plain and norm-weighted) on one encoded corpus.

    encoded: the batches of ``corpus.encode`` (each with input_ids, attention_mask, token_type_ids,
    special_mask [batch, pos]). Returns the long table for this corpus (no ``model`` column):
    :func:`.data.collect` then :func:`.data.tables`.
    """
    arrays = collect(model, encoded, progress=progress, shadow_m=shadow_m)
    return tables(arrays, corpus=corpus, n_boot=n_boot, seed=seed, level=level)


def summary_table(results: pd.DataFrame, held_out: pd.DataFrame | None = None) -> pd.DataFrame:
    """The headline numbers: raw self/duplicate mass per site and corpus; for learned heads the median
    and max over heads of self and duplicate mass, the five largest duplicate ratios (in-sample, as before),
    and the held-out top heads (``held_out_table``). Column ``selection``: "in-sample" | "held-out" |
    "" (no selection)."""
    keep = ["self", "duplicate", "duplicate_type_balanced", "argmax_self_or_copy", "logit_gap", "qk_self_top1"]
    raw = results[(results.source == "raw") & results.metric.isin(keep)]
    raw = raw[["corpus", "site", "metric", "value", "ci_low", "ci_high", "ratio"]].assign(stat="raw", selection="")
    heads = results[(results.source == "head") & results.metric.isin(keep)]
    spread = (
        heads.groupby(["corpus", "weighting", "metric"])["value"]
        .describe(percentiles=[0.5])[["min", "50%", "max"]]
        .reset_index()
        .melt(id_vars=["corpus", "weighting", "metric"], var_name="stat", value_name="value")
        .assign(stat=lambda d: "heads " + d["stat"].replace({"50%": "median"}), selection="")
    )
    dup = heads[heads.metric == "duplicate"].dropna(subset=["ratio"])
    top = (
        dup.sort_values("ratio", ascending=False)
        .groupby(["corpus", "weighting"])
        .head(5)[["corpus", "weighting", "metric", "layer", "head", "value", "ratio", "ratio_ci_low", "null"]]
        .assign(stat="top duplicate ratio", selection="in-sample")
    )
    parts = [raw, spread, top]
    if held_out is not None and len(held_out):
        keep_cols = ["corpus", "weighting", "metric", "layer", "head", "value", "ci_low", "ci_high", "rank",
                     "criterion", "selection"]
        parts.append(held_out[keep_cols].assign(stat="held-out top heads"))
    return pd.concat(parts, ignore_index=True)


def _corpora(ctx: Any, settings: Settings) -> list[Any]:
    """The run's corpus (capped), repeated-random beside it (at most ``random_sentences``), and repeated-random's
    non-repeating control (as many sequences as repeated-random)."""
    from bertscope.experiments.corpus import load_corpus

    cap = ctx.options.max_sentences or settings.max_sentences
    tok = ctx.model.tokenizer
    n_used, why = sentences_used(ctx.options.max_sentences, settings.max_sentences, len(ctx.corpus))
    ctx.log(f"{n_used} sentences of {ctx.corpus_id} ({why})")
    corpora = [ctx.corpus[:n_used]]
    if ctx.corpus.name != settings.random_corpus:
        n_random = min(cap, settings.random_sentences)
        corpora.append(load_corpus(settings.random_corpus, tokenizer=tok, max_sentences=n_random, seed=ctx.seed))
    random = next((c for c in corpora if c.name == RANDOM_CORPUS), None)
    if random is not None:
        corpora.append(control_corpus(tok, len(random), m=int(random.meta["m"]), seed=ctx.seed))
    return corpora


def activation_sites(model: Any) -> list[str]:
    """The sites the pass over the run's corpus reads (what ``--activations`` must hold); repeated-random and
    its control are generated here, so their forward always runs."""
    return collect_sites(model.config.n_layers)


def _collect_step(ctx: Any, corpus: Any, capture: Any = None) -> dict[str, Any]:
    """The cached model pass over one corpus (:func:`.data.collect`); the control needs only the heads, read
    at its would-be copies. ``capture``: a `CaptureSource` to read instead of running the model."""
    encoded = ctx.encode(corpus)
    control = corpus.name == CONTROL_CORPUS
    shadow = int(corpus.meta["m"]) if control else None
    progress = lambda it, n: ctx.progress(it, corpus.name, total=n)  # noqa: E731
    return ctx.step_arrays(f"collect_{corpus.name}", lambda: collect(
        ctx.model, encoded, shadow_m=shadow, raw=not control, progress=progress, corpus=corpus, capture=capture))
