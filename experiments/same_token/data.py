"""The same-token model pass and its tables: per-sentence tallies of every raw site and learned head.

:func:`collect` runs the model once over a corpus and keeps only what the statistics need, as flat arrays the
step cache can store: per raw site and per head weighting the :class:`~.measures.Tallies` (keys
``raw|{site}|...`` and ``head|{weighting}|...``) and, per head weighting, the per-query duplicate masses behind
the type-balanced average (``rows|{weighting}|...``). :func:`tables` turns them into the long results table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from bertscope.experiments.activations import CaptureSource, batch_activations
from bertscope.experiments.attention import value_norms
from bertscope.experiments.same_token.balance import QueryRows, type_balanced_table
from bertscope.experiments.same_token.control import shadow_ids
from bertscope.experiments.same_token.measures import (
    Positions,
    QueryMetric,
    Tallies,
    attention_masses,
    logit_metrics,
    norm_weighted,
    raw_attention,
    summarize,
    tally,
)
from bertscope.hooks.sites import block_layer
from einops import rearrange

WEIGHTINGS = ("attention", "norm")  # learned heads: plain pattern, Kobayashi norm-weighted pattern
Progress = Callable[[Iterable[Any], int], Iterable[Any]]


def collect(
    model: Any,
    encoded: Iterable[Any],
    *,
    progress: Progress | None = None,
    shadow_m: int | None = None,
    raw: bool = True,
    corpus: Sequence[Any] | None = None,
    capture: CaptureSource | None = None,
) -> dict[str, np.ndarray]:
    """The model pass: per-sentence tallies of every raw site and every head (plain and norm-weighted), and
    the per-query duplicate masses that the type-balanced average needs, as flat arrays (step-cacheable).

    encoded: the batches of ``corpus.encode`` (input_ids, attention_mask, token_type_ids, special_mask
    [batch, pos]). shadow_m: for the non-repeating control ([CLS] w_1..w_2m [SEP]), position i + m counts as
    the "copy" of position i, as in repeated-random (:func:`.control.shadow_ids`). raw: False skips raw
    attention (the control needs only the learned heads). The activations come from the activations stage
    (`experiments.activations`): a forward, or ``capture`` (then ``corpus``, what ``encoded`` encodes, finds
    the rows).
    """
    batches = list(encoded)
    if not batches:
        raise ValueError("the corpus encoded to no batches; give it at least one sentence")
    n_layers, tok = model.config.n_layers, model.tokenizer
    special_ids = {"cls": tok.cls_token_id, "sep": tok.sep_token_id}
    names = sites(n_layers, raw=raw)
    raw_sites = [s for s in names if ".attn." not in s]
    W_O = [b.attn.W_O.float() for b in model.blocks]
    max_length = max(b.input_ids.shape[1] for b in batches)
    device = model.device

    raw_parts: dict[str, list[Tallies]] = {site: [] for site in raw_sites}
    head_parts: dict[str, list[Tallies]] = {w: [] for w in WEIGHTINGS}
    row_parts: dict[str, list[QueryRows]] = {w: [] for w in WEIGHTINGS}
    first = 0
    with torch.no_grad():
        for batch in progress(batches, len(batches)) if progress is not None else batches:
            ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)
            cache = batch_activations(model, batch, names, corpus=corpus, capture=capture, device=device).tensors
            special = batch.special_mask.to(device)
            pos = Positions.from_batch(shadow_ids(ids, mask, shadow_m), mask, special, special_ids)
            for site in raw_sites:
                raw_parts[site].append(_raw_tallies(cache[site].float(), mask, pos, max_length))
            patterns = [cache[f"blocks.{i}.attn.hook_pattern"] for i in range(n_layers)]
            values = [cache[f"blocks.{i}.attn.hook_v"] for i in range(n_layers)]
            for weighting, (t, dup) in _head_tallies(patterns, values, W_O, pos, max_length).items():
                head_parts[weighting].append(t)
                row_parts[weighting].append(QueryRows.from_metric(dup, pos.input_ids, first))
            first += ids.shape[0]

    arrays: dict[str, np.ndarray] = {"n_heads": np.array(model.config.n_heads)}
    for site, parts in raw_parts.items():
        arrays.update(Tallies.concat(parts).to_arrays(f"raw|{site}|"))
    for weighting in WEIGHTINGS:
        arrays.update(Tallies.concat(head_parts[weighting]).to_arrays(f"head|{weighting}|"))
        arrays.update(QueryRows.concat(row_parts[weighting]).to_arrays(f"rows|{weighting}|"))
    return arrays


def sites(n_layers: int, *, raw: bool = True) -> list[str]:
    """The sites :func:`collect` reads: the raw sites (``embed.hook_word``, ``embed.hook_out``, every
    ``hook_resid_post``; ``raw=False`` leaves them out), then each layer's ``attn.hook_pattern``, ``attn.hook_v``."""
    raw_sites = ["embed.hook_word", "embed.hook_out", *(f"blocks.{i}.hook_resid_post" for i in range(n_layers))]
    heads = [f"blocks.{i}.attn.{h}" for i in range(n_layers) for h in ("hook_pattern", "hook_v")]
    return [*(raw_sites if raw else []), *heads]


def tables(
    arrays: dict[str, np.ndarray], *, corpus: str, n_boot: int = 1000, seed: int = 0, level: float = 0.95
) -> pd.DataFrame:
    """The long results table of one corpus from :func:`collect`'s arrays: every metric of every raw site and
    head, plus ``duplicate_type_balanced`` per head (mean over token types of the per-type mean duplicate mass;
    uniform null) beside the pooled ``duplicate``. Intervals: percentile group bootstrap over sentences."""
    n_heads = int(arrays["n_heads"])
    frames = []
    for site in stored(arrays, "raw"):
        t = summarize(Tallies.from_arrays(arrays, f"raw|{site}|"), n_boot=n_boot, seed=seed, ci=level)
        layer = b if (b := block_layer(site)) is not None else -1
        frames.append(label(t, source="raw", site=site, layer=layer, head=-1, weighting="attention"))
    for weighting in stored(arrays, "head"):
        tallies = Tallies.from_arrays(arrays, f"head|{weighting}|")
        rows = QueryRows.from_arrays(arrays, f"rows|{weighting}|")
        t = pd.concat([
            summarize(tallies, n_boot=n_boot, seed=seed, ci=level),
            type_balanced_table(rows, tallies.n_sentences, n_boot=n_boot, seed=seed, level=level),
        ], ignore_index=True)  # fmt: skip
        layer, head = t["head"] // n_heads, t["head"] % n_heads
        site = "blocks." + layer.astype(str) + ".attn.hook_pattern"
        frames.append(label(t, source="head", site=site, layer=layer, head=head, weighting=weighting))
    out = pd.concat(frames, ignore_index=True)
    out.insert(0, "corpus", corpus)
    return out


def stored(arrays: dict[str, np.ndarray], kind: str) -> list[str]:
    """The raw sites (``kind="raw"``) or head weightings (``"head"``) in :func:`collect`'s arrays, in order."""
    return list(dict.fromkeys(k.split("|")[1] for k in arrays if k.startswith(f"{kind}|")))


def label(t: pd.DataFrame, **columns: Any) -> pd.DataFrame:
    """Replace the tallies' head index by the identifying columns, put first in the results' order."""
    t = t.drop(columns="head")
    ident = pd.DataFrame(columns, index=t.index)
    return pd.concat([ident, t], axis=1)


def _raw_tallies(x: torch.Tensor, mask: torch.Tensor, pos: Positions, max_length: int) -> Tallies:
    """Tallies of raw attention ``softmax(x x^T / sqrt(d))`` on one site's vectors ``x [batch, pos, d]``."""
    logits, pattern = raw_attention(x, mask)
    per_query = {**attention_masses(pattern[:, None], pos), **logit_metrics(logits, pos)}
    return tally(per_query, pattern[:, None], pos, max_length)


def _head_tallies(
    patterns: list[torch.Tensor], values: list[torch.Tensor], W_O: list[torch.Tensor], pos: Positions, max_length: int
) -> dict[str, tuple[Tallies, QueryMetric]]:
    """Per weighting (``attention``, ``norm``): the tallies of every learned head and its per-query
    ``duplicate`` masses.

    patterns per layer ``[batch, head, q, k]``; values per layer ``[batch, pos, head, d_head]`` (``hook_v``);
    W_O per layer ``[head, d_head, d_model]``. Heads are flattened layer-major: index ``layer * n_heads + head``.
    """
    pattern = rearrange(torch.stack(patterns).float(), "layer b h q k -> b (layer h) q k")
    norms = torch.stack([value_norms(v.float(), w) for v, w in zip(values, W_O, strict=True)])
    weighted = norm_weighted(pattern, rearrange(norms, "layer b h k -> b (layer h) k"))
    out = {}
    for weighting, p in zip(WEIGHTINGS, (pattern, weighted), strict=True):
        masses = attention_masses(p, pos)
        out[weighting] = (tally(masses, p, pos, max_length), masses["duplicate"])
    return out
