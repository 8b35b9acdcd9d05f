"""Example attention maps of the same-token experiment: one repeated sentence per corpus, for the figures.

Panels: raw attention on the word embeddings, the embedding output and the last layer's output; then the
learned heads with the largest in-sample duplicate ratio and self ratio on that corpus (illustrations only:
the held-out choice is in ``held_out``).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch
from bertscope.experiments.same_token.measures import raw_attention


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
    """The panels of one corpus' example map: three raw sites, then the top in-sample duplicate and self heads."""
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
