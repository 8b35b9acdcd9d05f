"""Inputs of the structure experiment: the probed sites, the sentence split, and word vectors per site.

Word vectors are the mean of each word's pieces (as Hewitt & Manning average BERT's subword vectors), with the
word boundaries the corpus encoder gets from each tokenizer (`experiments.corpus.encode`), so any architecture
``models.load`` supports works. Sentences cut by ``--max-length`` lose words and therefore their tree; they are
left out (and counted in the manifest).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from bertscope.experiments.corpus import word_pool

BLOCK_COMPONENTS = ("attn_out", "resid_mid", "mlp_out", "resid_post")
_BLOCK_SITE = re.compile(r"^blocks\.(\d+)\.hook_(attn_out|resid_mid|mlp_out|resid_post)$")
EMBED_SITE = "embed.hook_out"


def residual_sites(n_layers: int) -> list[str]:
    """The embedding output (layer 0, non-contextual) and every block's output (layer L + 1)."""
    return [EMBED_SITE] + [f"blocks.{layer}.hook_resid_post" for layer in range(n_layers)]


def sublayer_sites(n_layers: int) -> list[str]:
    """Inside every block: ``hook_attn_out``, ``hook_resid_mid``, ``hook_mlp_out``."""
    return [f"blocks.{layer}.hook_{c}" for layer in range(n_layers) for c in BLOCK_COMPONENTS[:3]]


def site_layer(site: str) -> tuple[int, str]:
    """``(layer, component)``: layer 0 is the embedding output, layer L + 1 every site inside block L (so
    ``resid_post`` at layer k is ``hidden_states[k]``, the paper's "layer k")."""
    if site == EMBED_SITE:
        return 0, "embed"
    m = _BLOCK_SITE.match(site)
    if not m:
        raise ValueError(f"{site!r} is not a structure site")
    return int(m.group(1)) + 1, m.group(2)


@dataclass(frozen=True)
class Split:
    """Sentence indices (into the corpus) of the train, dev (early stopping) and test sets."""

    train: np.ndarray
    dev: np.ndarray
    test: np.ndarray

    def all(self) -> np.ndarray:
        """Every chosen sentence, train then dev then test."""
        return np.concatenate([self.train, self.dev, self.test])


def split_sentences(n_available: int, n_train: int, n_dev: int, n_test: int, rng: np.random.Generator) -> Split:
    """A seeded split by sentence. With fewer sentences than asked for, each part shrinks in proportion (at
    least 2 sentences each); fewer than 6 sentences raise ``ValueError``."""
    if n_available < 6:
        raise ValueError(f"the corpus has {n_available} usable sentences with trees; the structural probe needs "
                         "at least 6 (train, dev and test)")
    want = n_train + n_dev + n_test
    scale = min(1.0, n_available / want)
    sizes = [max(2, int(n * scale)) for n in (n_train, n_dev, n_test)]
    while sum(sizes) > n_available:
        sizes[int(np.argmax(sizes))] -= 1
    order = rng.permutation(n_available)
    a, b = sizes[0], sizes[0] + sizes[1]
    return Split(np.sort(order[:a]), np.sort(order[a:b]), np.sort(order[b : b + sizes[2]]))


@dataclass
class WordVectors:
    """Word vectors of some sentences at some sites: ``per_sentence[i]`` is ``[n_sites, n_words, d]`` (float32)
    for corpus sentence ``sentence_index[i]``."""

    sites: list[str]
    sentence_index: np.ndarray
    per_sentence: list[np.ndarray]


def collect(model: Any, encoded: Any, sites: Sequence[str],
            n_words: Sequence[int]) -> tuple[dict[int, np.ndarray], list[int]]:
    """Run ``model`` over the batches of ``encoded`` and mean-pool pieces into words at ``sites``.

    Returns ``{corpus sentence index: [n_sites, n_words, d]}`` and the indices of truncated sentences (left
    out). ``n_words``: the corpus's word count per sentence index (to detect truncation)."""
    device = next(model.parameters()).device
    out: dict[int, np.ndarray] = {}
    truncated: list[int] = []
    with torch.no_grad():
        for batch in encoded:
            _, cache = model.run_with_cache(batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device),
                                            names_filter=list(sites))  # fmt: skip
            stacked = torch.stack([cache[s] for s in sites], dim=1).float()  # [batch, site, pos, d]
            for r, si in enumerate(batch.sentence_index):
                if batch.n_words[r] != n_words[si]:
                    truncated.append(si)
                    continue
                out[si] = word_pool(stacked[r], batch.word_ids[r].to(stacked.device)).cpu().numpy()
    return out, truncated


def gather(vectors: dict[int, np.ndarray], index: np.ndarray,
           site_index: Sequence[int] | None = None) -> list[np.ndarray]:
    """``[n_sites, n_words, d]`` per sentence of ``index`` (optionally only the sites ``site_index``)."""
    if site_index is None:
        return [vectors[int(i)] for i in index]
    return [vectors[int(i)][list(site_index)] for i in index]


def punct_masks(sentences: Sequence[Any]) -> list[np.ndarray]:
    """Per sentence ``[n_words]`` bool: UPOS ``PUNCT`` (the reporter's punctuation classes); all False when
    the corpus has no UPOS."""
    return [np.array([u == "PUNCT" for u in s.upos], dtype=bool) if s.upos is not None
            else np.zeros(len(s), dtype=bool) for s in sentences]


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """``(fn(), seconds)``."""
    import time

    t0 = time.perf_counter()
    return fn(), time.perf_counter() - t0
