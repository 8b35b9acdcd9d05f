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

Metric definitions and nulls: :mod:`experiments.same_token.measures`. Tables: ``results`` (long: model,
corpus, source ``raw|head``, site, layer, head, weighting, metric, value, ci_low, ci_high, null, null_kind,
ratio, ...; raw rows have ``head = -1`` and ``layer = -1`` for the embedding sites, else the layer whose
``hook_resid_post`` was used) and ``example_maps`` (attention maps of a repeated sentence for the figures).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd
import torch
from bertscope.experiments.attention import value_norms
from bertscope.experiments.same_token.measures import (
    DUPLICATE_METRICS,
    Positions,
    Tallies,
    attention_masses,
    logit_metrics,
    norm_weighted,
    raw_attention,
    summarize,
    tally,
)
from bertscope.experiments.same_token.plots import plot
from bertscope.experiments.same_token.weights import weight_view
from einops import rearrange

NAME = "same-token"
DIRNAME = "same_token"
SUMMARY_TABLES = ["summary"]
__all__ = ["NAME", "DIRNAME", "SUMMARY_TABLES", "run", "plot", "measure", "weight_view", "example_maps"]

RANDOM_CORPUS = "repeated-random"


@dataclass(frozen=True)
class Settings:
    """Sizes of the same-token run (recorded in the manifest; part of the step-cache key)."""

    max_sentences: int = 200  # per corpus, when --max-sentences is not given (keeps the default run under a minute)
    n_boot: int = 1000  # bootstrap resamples behind every interval
    vocab_sample: int = 2000  # tokens of the weight view
    example_max_tokens: int = 40  # longest sentence drawn as an example map
    random_corpus: str = RANDOM_CORPUS  # the second corpus, measured beside --corpus
    ci: float = 0.95  # level of every percentile interval

CONVENTIONS = {
    "raw rows": "source=raw, head=-1; layer=-1 for embed.hook_word/embed.hook_out, else the layer of hook_resid_post",
    "raw attention": "softmax(X X^T / sqrt(d_model)) over real tokens; copies with identical X tie exactly",
    "norm weighting": "||A[i,j] (x_j W_V[h] + b_V[h]) W_O[h]|| renormalised per query; b_O excluded (shared)",
    "duplicates": "other content positions with the same token id; [CLS]/[SEP]/padding excluded",
    "null": "offset-matched for duplicate metrics where defined, else uniform (see null_kind)",
    "ci": "percentile group bootstrap at Settings.ci (95%) over sentences (tokens for the weight view)",
    "weight view": "x = LN(word + type 0 + mean position) of each token alone; biases b_Q, b_K included",
}


def run(ctx: Any, settings: Settings | None = None) -> pd.DataFrame:
    """The framework entry point: measure every source on both corpora plus the weight view; write
    ``example_maps`` and ``summary``; return the long results table."""
    from bertscope.experiments.corpus import load_corpus

    settings = ctx.use_settings(settings)
    model, options = ctx.model, ctx.options
    cap = options.max_sentences or settings.max_sentences
    corpora = [ctx.corpus if options.max_sentences else ctx.corpus[:cap]]
    if ctx.corpus.name != settings.random_corpus:
        corpora.append(load_corpus(settings.random_corpus, tokenizer=model.tokenizer, max_sentences=cap, seed=ctx.seed))
    ctx.note("sentences_per_corpus", {c.name: len(c) for c in corpora})
    ctx.note("settings", asdict(settings))
    ctx.note("n_boot", settings.n_boot)
    ctx.note("vocab_sample", settings.vocab_sample)
    ctx.note("repeated_random_meta", dict(corpora[-1].meta) if corpora[-1].name == RANDOM_CORPUS else None)
    ctx.note("conventions", CONVENTIONS)
    tables = []
    for corpus in corpora:
        encoded = ctx.encode(corpus)
        tables.append(
            ctx.step(
                f"measure_{corpus.name}",
                lambda corpus=corpus, encoded=encoded: measure(
                    model,
                    encoded,
                    corpus=corpus.name,
                    n_boot=settings.n_boot,
                    level=settings.ci,
                    seed=ctx.seed,
                    progress=lambda it, n, c=corpus.name: ctx.progress(it, f"{c}", total=n),
                ),
            )
        )
    tables.append(ctx.step(
        "weights",
        lambda: weight_view(
            model, n_tokens=settings.vocab_sample, seed=ctx.seed, n_boot=settings.n_boot, level=settings.ci
        ),
    ))
    results = pd.concat(tables, ignore_index=True)
    results.insert(0, "model", ctx.model_id)

    fallback = results[results.metric.isin(DUPLICATE_METRICS) & (results.null_kind == "uniform")]
    for corpus in sorted(fallback.corpus.unique()):
        ctx.log(
            f"{corpus}: some copies sit at offsets where every content pair is a copy, so the offset-matched "
            "null is undefined there (null_offset = NaN); null/ratio use the uniform null (null_kind)"
        )
    maps = ctx.step(
        "example_maps", lambda: example_maps(model, corpora, results, max_tokens=settings.example_max_tokens)
    )
    ctx.write_table(maps, "example_maps", formats=("parquet",))
    ctx.write_table(summary_table(results), "summary")
    return results


def measure(
    model: Any,
    encoded: Iterable[Any],
    *,
    corpus: str,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    progress: Callable[[Iterable[Any], int], Iterable[Any]] | None = None,
) -> pd.DataFrame:
    """Raw attention at every site and every learned head (plain and norm-weighted) on one encoded corpus.

    encoded: the batches of ``corpus.encode`` (each with input_ids, attention_mask, token_type_ids,
    special_mask [batch, pos]). Returns the long table for this corpus (no ``model`` column).
    """
    batches = list(encoded)
    if not batches:
        raise ValueError(f"corpus {corpus!r} encoded to no batches; give it at least one sentence")
    cfg = model.config
    n_layers, n_heads = cfg.n_layers, cfg.n_heads
    tok = model.tokenizer
    special_ids = {"cls": tok.cls_token_id, "sep": tok.sep_token_id}
    raw_sites = ["embed.hook_word", "embed.hook_out", *(f"blocks.{i}.hook_resid_post" for i in range(n_layers))]
    names = [*raw_sites, *(f"blocks.{i}.attn.{h}" for i in range(n_layers) for h in ("hook_pattern", "hook_v"))]
    W_O = [b.attn.W_O.float() for b in model.blocks]
    max_length = max(b.input_ids.shape[1] for b in batches)
    device = model.device

    raw_parts: dict[str, list[Tallies]] = {site: [] for site in raw_sites}
    head_parts: dict[str, list[Tallies]] = {"attention": [], "norm": []}
    iterator = progress(batches, len(batches)) if progress is not None else batches
    with torch.no_grad():
        for batch in iterator:
            ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)
            _, cache = model.run_with_cache(
                ids, attention_mask=mask, token_type_ids=batch.token_type_ids.to(device), names_filter=names
            )
            pos = Positions.from_batch(ids, mask, batch.special_mask.to(device), special_ids)
            for site in raw_sites:
                raw_parts[site].append(_raw_tallies(cache[site].float(), mask, pos, max_length))
            patterns = [cache[f"blocks.{i}.attn.hook_pattern"] for i in range(n_layers)]
            values = [cache[f"blocks.{i}.attn.hook_v"] for i in range(n_layers)]
            for weighting, t in _head_tallies(patterns, values, W_O, pos, max_length).items():
                head_parts[weighting].append(t)

    frames = []
    for site, parts in raw_parts.items():
        t = summarize(Tallies.concat(parts), n_boot=n_boot, seed=seed, ci=level)
        layer = int(site.split(".")[1]) if site.startswith("blocks.") else -1
        frames.append(_label(t, source="raw", site=site, layer=layer, head=-1, weighting="attention"))
    for weighting, parts in head_parts.items():
        t = summarize(Tallies.concat(parts), n_boot=n_boot, seed=seed, ci=level)
        layer, head = t["head"] // n_heads, t["head"] % n_heads
        site = "blocks." + layer.astype(str) + ".attn.hook_pattern"
        frames.append(_label(t, source="head", site=site, layer=layer, head=head, weighting=weighting))
    out = pd.concat(frames, ignore_index=True)
    out.insert(0, "corpus", corpus)
    return out


def _raw_tallies(x: torch.Tensor, mask: torch.Tensor, pos: Positions, max_length: int) -> Tallies:
    """Tallies of raw attention ``softmax(x x^T / sqrt(d))`` on one site's vectors ``x [batch, pos, d]``."""
    logits, pattern = raw_attention(x, mask)
    per_query = {**attention_masses(pattern[:, None], pos), **logit_metrics(logits, pos)}
    return tally(per_query, pattern[:, None], pos, max_length)


def _head_tallies(
    patterns: list[torch.Tensor], values: list[torch.Tensor], W_O: list[torch.Tensor], pos: Positions, max_length: int
) -> dict[str, Tallies]:
    """Tallies of every learned head, plain (``attention``) and norm-weighted (``norm``).

    patterns per layer ``[batch, head, q, k]``; values per layer ``[batch, pos, head, d_head]`` (``hook_v``);
    W_O per layer ``[head, d_head, d_model]``. Heads are flattened layer-major: index ``layer * n_heads + head``.
    """
    pattern = rearrange(torch.stack(patterns).float(), "layer b h q k -> b (layer h) q k")
    norms = torch.stack([value_norms(v.float(), w) for v, w in zip(values, W_O, strict=True)])
    weighted = norm_weighted(pattern, rearrange(norms, "layer b h k -> b (layer h) k"))
    return {
        "attention": tally(attention_masses(pattern, pos), pattern, pos, max_length),
        "norm": tally(attention_masses(weighted, pos), weighted, pos, max_length),
    }


def example_maps(model: Any, corpora: list[Any], results: pd.DataFrame, *, max_tokens: int = 40) -> pd.DataFrame:
    """Attention maps of one repeated sentence per corpus, for the figures.

    The sentence is the one with the most repeated tokens among those of at most ``max_tokens`` tokens.
    Panels: raw attention on the word embeddings, the embedding output and the last layer; the three heads
    with the largest duplicate ratio on that corpus and the head with the largest self ratio. Long table:
    corpus, sentence_id, panel, source, site, layer, head, query, key, query_token, key_token, weight.
    """
    from bertscope.experiments.corpus import Corpus, encode

    tok = model.tokenizer
    n_layers = model.config.n_layers
    frames = []
    for corpus in corpora:
        sentence = _most_repetitive(corpus, tok, max_tokens)
        if sentence is None:
            continue
        batch = next(iter(encode(Corpus(corpus.name, corpus.source, [sentence]), tok, max_length=max_tokens + 2)))
        panels = _example_panels(results[results.corpus == corpus.name], n_layers)
        names = [p["site"] for p in panels]
        with torch.no_grad():
            _, cache = model.run_with_cache(
                batch.input_ids.to(model.device),
                attention_mask=batch.attention_mask.to(model.device),
                token_type_ids=batch.token_type_ids.to(model.device),
                names_filter=sorted(set(names)),
            )
        tokens = tok.convert_ids_to_tokens(batch.input_ids[0].tolist())
        n = len(tokens)
        for panel in panels:
            if panel["source"] == "raw":
                _, pattern = raw_attention(cache[panel["site"]].float(), batch.attention_mask.to(model.device))
                grid = pattern[0]
            else:
                grid = cache[panel["site"]][0, panel["head"]].float()
            q, k = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
            frames.append(
                pd.DataFrame(
                    {
                        "corpus": corpus.name,
                        "sentence_id": sentence.id,
                        **panel,
                        "query": q.reshape(-1).numpy(),
                        "key": k.reshape(-1).numpy(),
                        "query_token": [tokens[i] for i in q.reshape(-1).tolist()],
                        "key_token": [tokens[j] for j in k.reshape(-1).tolist()],
                        "weight": grid.cpu().reshape(-1).numpy(),
                    }
                )
            )
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def summary_table(results: pd.DataFrame) -> pd.DataFrame:
    """The headline numbers: raw self/duplicate mass per site and corpus; for learned heads the median
    and max over heads of self and duplicate mass, and the five largest duplicate ratios."""
    keep = ["self", "duplicate", "argmax_self_or_copy", "logit_gap", "qk_self_top1"]
    raw = results[(results.source == "raw") & results.metric.isin(keep)]
    raw = raw[["corpus", "site", "metric", "value", "ci_low", "ci_high", "ratio"]].assign(stat="raw")
    heads = results[(results.source == "head") & results.metric.isin(keep)]
    spread = (
        heads.groupby(["corpus", "weighting", "metric"])["value"]
        .describe(percentiles=[0.5])[["min", "50%", "max"]]
        .reset_index()
        .melt(id_vars=["corpus", "weighting", "metric"], var_name="stat", value_name="value")
        .assign(stat=lambda d: "heads " + d["stat"].replace({"50%": "median"}))
    )
    dup = heads[heads.metric == "duplicate"].dropna(subset=["ratio"])
    top = (
        dup.sort_values("ratio", ascending=False)
        .groupby(["corpus", "weighting"])
        .head(5)[["corpus", "weighting", "metric", "layer", "head", "value", "ratio", "ratio_ci_low", "null"]]
        .assign(stat="top duplicate ratio")
    )
    return pd.concat([raw, spread, top], ignore_index=True)


# ------------------------------------------------------------------------------------------------ helpers


def _label(t: pd.DataFrame, **columns: Any) -> pd.DataFrame:
    """Put the identifying columns first, in the results' order."""
    t = t.drop(columns="head")
    ident = pd.DataFrame(columns, index=t.index)
    return pd.concat([ident, t], axis=1)


def _most_repetitive(corpus: Any, tok: Any, max_tokens: int) -> Any:
    """The sentence of at most ``max_tokens`` word pieces with the most repeated pieces (None if none)."""
    best, best_count = None, 0
    for sentence in corpus:
        ids = tok(list(sentence.words), is_split_into_words=True, add_special_tokens=False)["input_ids"]
        repeats = len(ids) - len(set(ids))
        if len(ids) <= max_tokens and repeats > best_count:
            best, best_count = sentence, repeats
    return best


def _example_panels(results: pd.DataFrame, n_layers: int) -> list[dict[str, Any]]:
    panels = [
        {"panel": "raw: word embeddings", "source": "raw", "site": "embed.hook_word", "layer": -1, "head": -1},
        {"panel": "raw: embedding output", "source": "raw", "site": "embed.hook_out", "layer": -1, "head": -1},
        {
            "panel": f"raw: layer {n_layers - 1} output",
            "source": "raw",
            "site": f"blocks.{n_layers - 1}.hook_resid_post",
            "layer": n_layers - 1,
            "head": -1,
        },
    ]
    heads = results[(results.source == "head") & (results.weighting == "attention")]
    for metric, n in (("duplicate", 3), ("self", 1)):
        rows = heads[heads.metric == metric].sort_values("ratio", ascending=False)
        for r in rows.head(n).itertuples():
            panels.append(
                {
                    "panel": f"L{r.layer}H{r.head}: {metric} / {r.null_kind} null = {r.ratio:.1f}",
                    "source": "head",
                    "site": f"blocks.{r.layer}.attn.hook_pattern",
                    "layer": int(r.layer),
                    "head": int(r.head),
                }
            )
    return panels
