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

import numpy as np
import pandas as pd
import torch
from bertscope.experiments.same_token.measures import (
    DUPLICATE_METRICS,
    Positions,
    QueryRows,
    Tallies,
    attention_masses,
    boot_weights,
    held_out_top,
    logit_metrics,
    metric_draws,
    norm_weighted,
    raw_attention,
    summarize,
    tally,
    type_balanced_draws,
)
from bertscope.experiments.same_token.plots import plot
from einops import rearrange

NAME = "same-token"
DIRNAME = "same_token"
SUMMARY_TABLES = ["summary"]
__all__ = ["NAME", "DIRNAME", "SUMMARY_TABLES", "run", "plot", "measure", "weight_view", "example_maps"]

RANDOM_CORPUS = "repeated-random"
CONTROL_CORPUS = "random-control"  # repeated-random's non-repeating control


@dataclass(frozen=True)
class Settings:
    """Sizes of the same-token run (recorded in the manifest; part of the step-cache key)."""

    max_sentences: int = 200  # per corpus, when --max-sentences is not given (keeps the default run under a minute)
    n_boot: int = 1000  # bootstrap resamples behind every interval
    vocab_sample: int = 2000  # tokens of the weight view
    example_max_tokens: int = 40  # longest sentence drawn as an example map
    random_corpus: str = RANDOM_CORPUS  # the second corpus, measured beside --corpus (with its control)
    top_k: int = 5  # heads chosen held-out per criterion

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
    "ci": "95% percentile bootstrap over sentences (tokens for the weight view)",
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
    ctx.note("settings", asdict(settings))
    ctx.note("n_boot", settings.n_boot)
    ctx.note("vocab_sample", settings.vocab_sample)
    ctx.note("repeated_random_meta", dict(corpora[-1].meta) if corpora[-1].name == RANDOM_CORPUS else None)
    random = next((c for c in corpora if c.name == RANDOM_CORPUS), None)
    if random is not None:
        corpora.append(control_corpus(model.tokenizer, len(random), m=int(random.meta["m"]), seed=ctx.seed))
    ctx.note("sentences_per_corpus", {c.name: len(c) for c in corpora})
    ctx.note("conventions", CONVENTIONS)
    stores: dict[str, dict[str, np.ndarray]] = {}
    frames = []
    for corpus in corpora:
        encoded = ctx.encode(corpus)
        shadow = int(corpus.meta["m"]) if corpus.name == CONTROL_CORPUS else None
        stores[corpus.name] = ctx.step_arrays(
            f"collect_{corpus.name}",
            lambda corpus=corpus, encoded=encoded, shadow=shadow: collect(
                model, encoded, shadow_m=shadow,
                progress=lambda it, n, c=corpus.name: ctx.progress(it, f"{c}", total=n),
            ),
        )
        frames.append(ctx.step(
            f"measure_{corpus.name}",
            lambda corpus=corpus: tables(stores[corpus.name], corpus=corpus.name, n_boot=settings.n_boot,
                                         seed=ctx.seed),
        ))
    if random is not None:
        frames.append(ctx.step("copy_specific", lambda: copy_specific(
            stores[RANDOM_CORPUS], stores[CONTROL_CORPUS], n_boot=settings.n_boot, seed=ctx.seed)))
    held_out = ctx.step("held_out", lambda: held_out_table(
        stores, main=ctx.corpus.name, n_boot=settings.n_boot, seed=ctx.seed, k=settings.top_k))
    tables_ = frames
    tables_.append(ctx.step(
        "weights", lambda: weight_view(model, n_tokens=settings.vocab_sample, seed=ctx.seed, n_boot=settings.n_boot)
    ))
    results = pd.concat(tables_, ignore_index=True)
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
    ctx.write_table(held_out.assign(model=ctx.model_id), "held_out")
    ctx.write_table(summary_table(results, held_out), "summary")
    return results


def measure(
    model: Any,
    encoded: Iterable[Any],
    *,
    corpus: str,
    n_boot: int = 1000,
    seed: int = 0,
    progress: Callable[[Iterable[Any], int], Iterable[Any]] | None = None,
    shadow_m: int | None = None,
) -> pd.DataFrame:
    """Raw attention at every site and every learned head (plain and norm-weighted) on one encoded corpus.

    encoded: the batches of ``corpus.encode`` (each with input_ids, attention_mask, token_type_ids,
    special_mask [batch, pos]). Returns the long table for this corpus (no ``model`` column):
    :func:`collect` then :func:`tables`.
    """
    arrays = collect(model, encoded, progress=progress, shadow_m=shadow_m)
    return tables(arrays, corpus=corpus, n_boot=n_boot, seed=seed)


def collect(
    model: Any,
    encoded: Iterable[Any],
    *,
    progress: Callable[[Iterable[Any], int], Iterable[Any]] | None = None,
    shadow_m: int | None = None,
) -> dict[str, np.ndarray]:
    """The model pass: per-sentence tallies of every raw site and every head (plain and norm-weighted), and
    the per-query duplicate masses that the type-balanced average needs, as flat arrays (step-cacheable).

    shadow_m: for the non-repeating control, every sequence is [CLS] w_1..w_2m [SEP] and position i + m is
    treated as the "copy" of position i (as in repeated-random), so ``duplicate`` there is the mass a head
    puts at the copy offsets when there are no copies.
    """
    batches = list(encoded)
    if not batches:
        raise ValueError("the corpus encoded to no batches; give it at least one sentence")
    cfg = model.config
    n_layers, n_heads = cfg.n_layers, cfg.n_heads
    tok = model.tokenizer
    special_ids = {"cls": tok.cls_token_id, "sep": tok.sep_token_id}
    raw_sites = ["embed.hook_word", "embed.hook_out", *(f"blocks.{i}.hook_resid_post" for i in range(n_layers))]
    names = [*raw_sites, *(f"blocks.{i}.attn.{h}" for i in range(n_layers) for h in ("hook_pattern", "hook_v"))]
    # ||v W_O[h]||^2 = v (W_O[h] W_O[h]^T) v^T: a [d_head, d_head] Gram matrix per head instead of d_model.
    grams = [torch.einsum("hdm,hem->hde", b.attn.W_O.float(), b.attn.W_O.float()) for b in model.blocks]
    max_length = max(b.input_ids.shape[1] for b in batches)
    device = model.device

    raw_parts: dict[str, list[Tallies]] = {site: [] for site in raw_sites}
    head_parts: dict[str, list[Tallies]] = {"attention": [], "norm": []}
    row_parts: dict[str, list[QueryRows]] = {"attention": [], "norm": []}
    first = 0
    iterator = progress(batches, len(batches)) if progress is not None else batches
    with torch.no_grad():
        for batch in iterator:
            ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)
            _, cache = model.run_with_cache(
                ids, attention_mask=mask, token_type_ids=batch.token_type_ids.to(device), names_filter=names
            )
            pos = Positions.from_batch(_shadow_ids(ids, mask, shadow_m), mask, batch.special_mask.to(device),
                                       special_ids)
            for site in raw_sites:
                logits, pattern = raw_attention(cache[site].float(), mask)
                per_query = {**attention_masses(pattern[:, None], pos), **logit_metrics(logits, pos)}
                raw_parts[site].append(tally(per_query, pattern[:, None], pos, max_length))
            pattern = rearrange(
                torch.stack([cache[f"blocks.{i}.attn.hook_pattern"] for i in range(n_layers)]).float(),
                "layer b h q k -> b (layer h) q k",
            )
            norms = torch.stack(
                [
                    torch.einsum("bphd,hde,bphe->bhp", v, g, v).clamp(min=0).sqrt()
                    for i, g in enumerate(grams)
                    for v in [cache[f"blocks.{i}.attn.hook_v"].float()]
                ]
            )
            norms = rearrange(norms, "layer b h k -> b (layer h) k")
            for weighting, p in (("attention", pattern), ("norm", norm_weighted(pattern, norms))):
                masses = attention_masses(p, pos)
                head_parts[weighting].append(tally(masses, p, pos, max_length))
                row_parts[weighting].append(QueryRows.from_metric(masses["duplicate"], pos.input_ids, first))
            first += ids.shape[0]

    arrays: dict[str, np.ndarray] = {"n_heads": np.array(n_heads)}
    for site, parts in raw_parts.items():
        arrays.update(Tallies.concat(parts).to_arrays(f"raw|{site}|"))
    for weighting in head_parts:
        arrays.update(Tallies.concat(head_parts[weighting]).to_arrays(f"head|{weighting}|"))
        arrays.update(QueryRows.concat(row_parts[weighting]).to_arrays(f"rows|{weighting}|"))
    return arrays


def tables(arrays: dict[str, np.ndarray], *, corpus: str, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """The long results table of one corpus from :func:`collect`'s arrays: every metric of every raw site and
    head, plus ``duplicate_type_balanced`` per head (mean over token types of the per-type mean duplicate mass;
    uniform null) beside the pooled ``duplicate``."""
    n_heads = int(arrays["n_heads"])
    frames = []
    for site in _sources(arrays, "raw"):
        t = summarize(Tallies.from_arrays(arrays, f"raw|{site}|"), n_boot=n_boot, seed=seed)
        layer = int(site.split(".")[1]) if site.startswith("blocks.") else -1
        frames.append(_label(t, source="raw", site=site, layer=layer, head=-1, weighting="attention"))
    for weighting in _sources(arrays, "head"):
        tallies = Tallies.from_arrays(arrays, f"head|{weighting}|")
        t = summarize(tallies, n_boot=n_boot, seed=seed)
        t = pd.concat([t, _type_balanced(QueryRows.from_arrays(arrays, f"rows|{weighting}|"), tallies.n_sentences,
                                         n_boot=n_boot, seed=seed)], ignore_index=True)
        layer, head = t["head"] // n_heads, t["head"] % n_heads
        site = "blocks." + layer.astype(str) + ".attn.hook_pattern"
        frames.append(_label(t, source="head", site=site, layer=layer, head=head, weighting=weighting))
    out = pd.concat(frames, ignore_index=True)
    out.insert(0, "corpus", corpus)
    return out


def control_corpus(tokenizer: Any, n_sentences: int, *, m: int, seed: int = 0) -> Any:
    """The non-repeating control of ``repeated-random``: ``n_sentences`` sequences of 2m distinct words drawn
    from the same single-piece vocabulary pool (same length, same token distribution, no repeats)."""
    import random

    from bertscope.experiments.corpus import Corpus, Sentence, single_piece_words

    pool = single_piece_words(tokenizer)
    if len(pool) < 2 * m:
        raise ValueError(f"the tokenizer has {len(pool)} single-piece words; the control needs 2m = {2 * m}")
    rng = random.Random(f"bertscope-random-control/{seed}/{m}")
    sentences = []
    for i in range(n_sentences):
        words = tuple(rng.sample(pool, 2 * m))
        sentences.append(Sentence(id=f"{CONTROL_CORPUS}/{seed}/{i}", words=words, text=" ".join(words)))
    meta = {"m": m, "seed": seed, "n_sentences": n_sentences, "pool_size": len(pool)}
    return Corpus(name=CONTROL_CORPUS, source=f"random without repeats (2m={2 * m}, seed={seed})",
                  sentences=sentences, meta=meta)


def copy_specific(
    repeated: dict[str, np.ndarray], control: dict[str, np.ndarray], *, n_boot: int = 1000, seed: int = 0
) -> pd.DataFrame:
    """Per head and weighting: duplicate mass on repeated-random minus the mass the same head puts at the copy
    offset (+-m) on the non-repeating control, with a bootstrap interval (sentences of each corpus resampled
    independently). Rows like the results table: corpus repeated-random, metric ``duplicate_copy_specific``,
    ``null`` = the control's mass (null_kind ``control``), ratio = repeated / control."""
    n_heads = int(repeated["n_heads"])
    frames = []
    for weighting in _sources(repeated, "head"):
        draws = []
        for k, arrays in enumerate((repeated, control)):
            t = Tallies.from_arrays(arrays, f"head|{weighting}|")
            draws.append(metric_draws(t, "duplicate", boot_weights(t.n_sentences, n_boot=n_boot, seed=seed + k))[0])
        rep, ctrl = draws
        diff, ratio = rep - ctrl, rep / ctrl
        q = torch.tensor([0.025, 0.975], dtype=torch.float64)
        low, high = torch.nanquantile(diff[1:], q, dim=0)
        r_low, r_high = torch.nanquantile(ratio[1:], q, dim=0)
        heads = np.arange(diff.shape[1])
        frames.append(pd.DataFrame({
            "corpus": RANDOM_CORPUS, "source": "head",
            "site": [f"blocks.{h // n_heads}.attn.hook_pattern" for h in heads],
            "layer": heads // n_heads, "head": heads % n_heads, "weighting": weighting,
            "metric": "duplicate_copy_specific", "value": diff[0].numpy(), "ci_low": low.numpy(),
            "ci_high": high.numpy(), "null": ctrl[0].numpy(), "null_kind": "control", "ratio": ratio[0].numpy(),
            "ratio_ci_low": r_low.numpy(), "ratio_ci_high": r_high.numpy(),
            "n_sentences": int(Tallies.from_arrays(repeated, f"head|{weighting}|").n_sentences),
        }))
    return pd.concat(frames, ignore_index=True)


def held_out_table(
    stores: dict[str, dict[str, np.ndarray]], *, main: str, n_boot: int = 1000, seed: int = 0, k: int = 5
) -> pd.DataFrame:
    """Top-k heads chosen on one half of the sentences and reported on the other (both ways, averaged), with
    group-bootstrap intervals that re-choose in every draw (:func:`measures.held_out_top`).

    On ``main`` (the run's corpus) the heads are chosen by duplicate mass / primary null and reported as
    pooled and type-balanced duplicate mass and the ratio; on repeated-random (with its control) they are
    chosen by copy-specific mass and reported as copy-specific, repeated and control mass.
    Columns: corpus, weighting, criterion, rank, layer, head (chosen on half 1), layer_other, head_other
    (chosen on half 2), metric, value, ci_low, ci_high, selection (= "held-out"), n_sentences.
    """
    n_heads = int(next(iter(stores.values()))["n_heads"])
    halves_by_corpus = {}
    for c, (name, arrays) in enumerate(stores.items()):
        n = int(arrays["head|attention|noncopy_count"].shape[0])
        if n < 4:
            raise ValueError(f"corpus {name!r} has {n} sentences; a held-out split needs at least 4")
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 101 * c))
        halves_by_corpus[name] = [boot_weights(n, n_boot=n_boot, seed=seed + 10 * c + i, subset=part.sort().values)
                                  for i, part in enumerate((perm[: n // 2], perm[n // 2 :]))]
    rows = []
    for weighting in ("attention", "norm"):
        t = {name: Tallies.from_arrays(a, f"head|{weighting}|") for name, a in stores.items()}
        q = {name: QueryRows.from_arrays(a, f"rows|{weighting}|") for name, a in stores.items()}

        plans = _held_out_plans(t, q, main)
        for corpus, criterion, score, report in plans:
            halves = tuple({name: h[i] for name, h in halves_by_corpus.items()} for i in range(2))
            for r in held_out_top(score, report, halves, k=k):
                (h1, h2) = r["chosen"]
                rows.append({"corpus": corpus, "weighting": weighting, "criterion": criterion, "rank": r["rank"],
                             "layer": h1 // n_heads, "head": h1 % n_heads, "layer_other": h2 // n_heads,
                             "head_other": h2 % n_heads, "metric": r["name"], "value": r["value"],
                             "ci_low": r["ci_low"], "ci_high": r["ci_high"], "selection": "held-out",
                             "n_sentences": t[corpus].n_sentences})
    return pd.DataFrame(rows)


def weight_view(
    model: Any,
    *,
    n_tokens: int = 2000,
    seed: int = 0,
    n_boot: int = 1000,
    token_ids: list[int] | None = None,
) -> pd.DataFrame:
    """Context-free self-preference: for a seeded sample of ``n_tokens`` vocabulary tokens (specials and
    ``[unused*]`` excluded; or exactly ``token_ids``), does a token's query score its own key above every
    other sampled key?

    Metrics per head (source ``head``, site ``blocks.L.attn.W_QK``): ``qk_self_top1`` (share of tokens whose
    own key scores highest; null ``1/n_tokens``) and ``qk_self_percentile`` (share of other keys scoring
    below the own key; null 0.5); the same for raw attention ``x x^T`` on the word embeddings and on the
    embedding output (source ``raw``). Bootstrap CIs over the sampled tokens. Corpus ``vocab-sample``.
    """
    if token_ids is None:
        tok = model.tokenizer
        special = set(tok.all_special_ids)
        vocab = tok.get_vocab().items()
        candidates = sorted(i for t, i in vocab if i not in special and not t.startswith("[unused"))
        if len(candidates) < n_tokens:
            raise ValueError(f"the vocabulary has {len(candidates)} ordinary tokens; ask for n_tokens <= that")
        pick = torch.randperm(len(candidates), generator=torch.Generator().manual_seed(seed))[:n_tokens]
        token_ids = torch.tensor(candidates)[pick.sort().values].tolist()
    n_tokens = len(token_ids)
    if n_tokens < 2 or len(set(token_ids)) != n_tokens:
        raise ValueError(f"token_ids must hold at least 2 distinct ids; got {n_tokens}, {len(set(token_ids))} distinct")
    ids = torch.tensor(token_ids)[:, None].to(model.device)  # each token alone: [n_tokens, 1]
    mean_pos = model.W_pos[1 : min(model.config.max_positions, 128)].mean(0)

    def mean_position(x: torch.Tensor, hook: Any) -> torch.Tensor:
        return mean_pos.to(x.dtype).expand_as(x)

    with torch.no_grad():
        _, cache = model.run_with_cache(
            ids,
            names_filter=["embed.hook_word", "embed.hook_out"],
            fwd_hooks=[("embed.hook_pos", mean_position)],
            stop_at_layer=0,
        )
        word, x = cache["embed.hook_word"][:, 0].float(), cache["embed.hook_out"][:, 0].float()
        per_token = {("raw", "embed.hook_word", -1, -1): _self_preference(word, word)}
        per_token[("raw", "embed.hook_out", -1, -1)] = _self_preference(x, x)
        for layer, block in enumerate(model.blocks):
            attn = block.attn
            q = torch.einsum("nm,hmd->hnd", x, attn.W_Q.float()) + attn.b_Q.float()[:, None]
            k = torch.einsum("nm,hmd->hnd", x, attn.W_K.float()) + attn.b_K.float()[:, None]
            for head in range(model.config.n_heads):
                per_token[("head", f"blocks.{layer}.attn.W_QK", layer, head)] = _self_preference(q[head], k[head])

    rows = []
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randint(0, n_tokens, (n_boot, n_tokens), generator=generator)
    for (source, site, layer, head), (top1, percentile) in per_token.items():
        for metric, values, null in (("qk_self_top1", top1, 1 / n_tokens), ("qk_self_percentile", percentile, 0.5)):
            boot = values[draws].mean(-1)
            value = float(values.mean())
            rows.append(
                {
                    "corpus": "vocab-sample",
                    "source": source,
                    "site": site,
                    "layer": layer,
                    "head": head,
                    "weighting": "weights",
                    "metric": metric,
                    "value": value,
                    "ci_low": float(boot.quantile(0.025)),
                    "ci_high": float(boot.quantile(0.975)),
                    "null": null,
                    "null_kind": "uniform",
                    "ratio": value / null,
                    "ratio_ci_low": float(boot.quantile(0.025)) / null,
                    "ratio_ci_high": float(boot.quantile(0.975)) / null,
                    "null_uniform": null,
                    "ratio_uniform": value / null,
                    "n_queries": n_tokens,
                    "n_sentences": 0,
                }
            )
    return pd.DataFrame(rows)


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


# ------------------------------------------------------------------------------------------------ helpers


def _shadow_ids(ids: torch.Tensor, mask: torch.Tensor, m: int | None) -> torch.Tensor:
    """ids [batch, pos] with positions m+1..2m relabelled as copies of 1..m (the control's would-be copies)."""
    if m is None:
        return ids
    if not bool((mask.sum(-1) == 2 * m + 2).all()):
        raise ValueError(f"the control's sequences must hold 2m + 2 = {2 * m + 2} tokens with [CLS] and [SEP]")
    out = ids.clone()
    out[:, m + 1 : 2 * m + 1] = ids[:, 1 : m + 1]
    return out


def _held_out_plans(t: dict[str, Tallies], q: dict[str, QueryRows], main: str) -> list[tuple]:
    """(corpus, criterion, score, report) for :func:`held_out_table`, for one weighting's tallies ``t`` and
    per-query rows ``q`` by corpus."""

    def dup(name: str) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
        return lambda w: metric_draws(t[name], "duplicate", w[name])[0]

    def ratio(w: dict[str, torch.Tensor]) -> torch.Tensor:
        return _ratio(t[main], w[main])

    def balanced(w: dict[str, torch.Tensor]) -> torch.Tensor:
        return type_balanced_draws(q[main], w[main])[0]

    def specific(w: dict[str, torch.Tensor]) -> torch.Tensor:
        return dup(RANDOM_CORPUS)(w) - dup(CONTROL_CORPUS)(w)

    plans = []
    if main in t and main not in (RANDOM_CORPUS, CONTROL_CORPUS):
        plans.append((main, "duplicate / primary null", ratio,
                      {"duplicate": dup(main), "duplicate_ratio": ratio, "duplicate_type_balanced": balanced}))
    if RANDOM_CORPUS in t and CONTROL_CORPUS in t:
        plans.append((RANDOM_CORPUS, "copy-specific mass (repeated - control)", specific,
                      {"duplicate_copy_specific": specific, "duplicate": dup(RANDOM_CORPUS),
                       "control_duplicate": dup(CONTROL_CORPUS)}))
    return plans


def _sources(arrays: dict[str, np.ndarray], kind: str) -> list[str]:
    """The raw sites / head weightings stored in :func:`collect`'s arrays, in stored order."""
    return list(dict.fromkeys(k.split("|")[1] for k in arrays if k.startswith(f"{kind}|")))


def _ratio(tallies: Tallies, weights: torch.Tensor) -> torch.Tensor:
    value, null, *_ = metric_draws(tallies, "duplicate", weights)
    return value / null


def _type_balanced(rows: QueryRows, n_sentences: int, *, n_boot: int, seed: int) -> pd.DataFrame:
    """Rows (head index, metric duplicate_type_balanced, value, CI, uniform null, ratio) like summarize's."""
    value, null = type_balanced_draws(rows, boot_weights(n_sentences, n_boot=n_boot, seed=seed))
    ratio = value / null[:, None]
    q = torch.tensor([0.025, 0.975], dtype=torch.float64)
    low, high = torch.nanquantile(value[1:], q, dim=0)
    r_low, r_high = torch.nanquantile(ratio[1:], q, dim=0)
    return pd.DataFrame({
        "head": np.arange(value.shape[1]), "metric": "duplicate_type_balanced", "value": value[0].numpy(),
        "ci_low": low.numpy(), "ci_high": high.numpy(), "null": float(null[0]), "null_kind": "uniform",
        "ratio": ratio[0].numpy(), "ratio_ci_low": r_low.numpy(), "ratio_ci_high": r_high.numpy(),
        "null_uniform": float(null[0]), "ratio_uniform": ratio[0].numpy(),
        "n_queries": len(rows.sentence), "n_sentences": n_sentences,
    })


def _label(t: pd.DataFrame, **columns: Any) -> pd.DataFrame:
    """Put the identifying columns first, in the results' order."""
    t = t.drop(columns="head")
    ident = pd.DataFrame(columns, index=t.index)
    return pd.concat([ident, t], axis=1)


def _self_preference(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [token, d]: per token, whether its own key scores highest (ties count) and the share of
    other keys scoring strictly below it -> (top1 [token], percentile [token]) as float64."""
    scores = (q @ k.T).double()
    own = scores.diagonal()[:, None]
    others = ~torch.eye(len(q), dtype=torch.bool, device=q.device)
    above = ((scores > own) & others).sum(-1)
    below = ((scores < own) & others).sum(-1)
    return (above == 0).double().cpu(), (below.double() / (len(q) - 1)).cpu()


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
