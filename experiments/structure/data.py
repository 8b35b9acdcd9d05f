"""Inputs of the structure experiment: the probed sites, the sentence split, and word vectors per site.

Word vectors are the mean of each word's pieces (as Hewitt & Manning average BERT's subword vectors), with the
word boundaries the corpus encoder gets from each tokenizer (`experiments.corpus.encode`), so any architecture
``models.load`` supports works. Sentences cut by ``--max-length`` lose words and therefore their tree; they are
left out (and counted in the manifest).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from bertscope.experiments.activations import CaptureSource, batch_activations
from bertscope.hooks.sites import BLOCK_COMPONENTS, site_layer  # noqa: F401 (one vocabulary; re-exported)

EMBED_SITE = "embed.hook_out"


def residual_sites(n_layers: int) -> list[str]:
    """The embedding output (layer 0, non-contextual) and every block's output (layer L + 1)."""
    return [EMBED_SITE] + [f"blocks.{layer}.hook_resid_post" for layer in range(n_layers)]


def sublayer_sites(n_layers: int, components: Sequence[str] = BLOCK_COMPONENTS[:3]) -> list[str]:
    """Inside every block: ``hook_attn_out``, ``hook_resid_mid``, ``hook_mlp_out`` (or the ``components`` named)."""
    return [f"blocks.{layer}.hook_{c}" for layer in range(n_layers) for c in BLOCK_COMPONENTS[:3] if c in components]


def trained_sites(n_layers: int, sublayers: bool | Sequence[str]) -> list[str]:
    """The trained model's probed sites: every residual site, then the sublayer sites of ``Settings.sublayers``
    (True: ``attn_out``, ``resid_mid``, ``mlp_out``; False: none; else those components)."""
    components = (BLOCK_COMPONENTS[:3] if sublayers is True else () if sublayers is False else tuple(sublayers))
    return residual_sites(n_layers) + sublayer_sites(n_layers, components)


@dataclass(frozen=True)
class Split:
    """Sentence indices (into the corpus) of the train, dev (early stopping) and test sets."""

    train: np.ndarray
    dev: np.ndarray
    test: np.ndarray

    def all(self) -> np.ndarray:
        """Every chosen sentence, train then dev then test."""
        return np.concatenate([self.train, self.dev, self.test])


def split_sentences(n_available: int, n_train: int, n_dev: int, n_test: int, rng: np.random.Generator, *,
                    n_eval_available: int | None = None) -> Split:
    """A seeded split by sentence. With fewer sentences than asked for, each part shrinks in proportion (at
    least 2 sentences each); fewer than 6 sentences raise ``ValueError``. ``n_eval_available`` (an evaluation
    corpus, --eval-corpus): train and dev come from the ``n_available`` sentences and ``test`` indexes the
    evaluation corpus (a seeded choice of ``n_test`` of its sentences)."""
    if n_eval_available is not None:
        if n_available < 4 or n_eval_available < 2:
            raise ValueError(f"the structural probe needs at least 4 training sentences (train and dev) and 2 "
                             f"evaluation sentences, got {n_available} and {n_eval_available}")
        scale = min(1.0, n_available / (n_train + n_dev))
        sizes = [max(2, int(n * scale)) for n in (n_train, n_dev)]
        while sum(sizes) > n_available:
            sizes[int(np.argmax(sizes))] -= 1
        order = rng.permutation(n_available)
        train, dev = np.sort(order[: sizes[0]]), np.sort(order[sizes[0] : sum(sizes)])
        test = np.sort(rng.permutation(n_eval_available)[: min(n_test, n_eval_available)])
        return Split(train, dev, test)
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
    """Word vectors of the chosen sentences at some sites, packed: ``words`` ``[n_sites, n_words_total, d]``
    (float32, sentence after sentence), ``lengths`` ``[n_sent]`` (0 for a sentence left out)."""

    words: np.ndarray
    lengths: np.ndarray

    def take(self, rows: np.ndarray, site_index: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(words [n_sites, n_words_of_rows, d], lengths [len(rows)])`` of the sentences ``rows``."""
        offsets = np.concatenate([[0], np.cumsum(self.lengths)])
        flat = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in rows])
        words = self.words[:, flat] if site_index is None else self.words[np.asarray(site_index)[:, None], flat]
        return words, self.lengths[rows]


def collect(model: Any, encoded: Any, sites: Sequence[str], n_words: Sequence[int], *,
            corpus: Sequence[Any] | None = None, capture: CaptureSource | None = None,
            progress: Any = None) -> tuple[WordVectors, list[int]]:
    """The activations of ``encoded``'s batches at ``sites`` (the activations stage: a forward of ``model``, or
    ``capture``, then ``corpus`` is what ``encoded`` encodes), pieces mean-pooled into words by the stage
    (``pool="word"``). ``progress``
    optionally wraps the batches (e.g. ``lambda it: ctx.progress(it, "word vectors", total=len(encoded))``).

    Returns the packed `WordVectors` of the sentences in corpus order (``n_words``: the chosen sentences' word
    counts) and the indices of truncated sentences (left out: length 0)."""
    device = next(model.parameters()).device
    pooled: dict[int, np.ndarray] = {}
    truncated: list[int] = []
    with torch.no_grad():
        for batch in encoded if progress is None else progress(encoded):
            words = batch_activations(model, batch, list(sites), corpus=corpus, capture=capture, device=device,
                                      stop_early=False, pool="word")  # [batch, word, d] per site
            for r, si in enumerate(batch.sentence_index):
                if batch.n_words[r] != n_words[si]:
                    truncated.append(si)
                    continue
                pooled[si] = torch.stack([words[s][r, : n_words[si]] for s in sites]).float().cpu().numpy()
    lengths = np.array([pooled[i].shape[1] if i in pooled else 0 for i in range(len(n_words))], dtype=np.int64)
    words = np.concatenate([pooled[i] for i in range(len(n_words)) if i in pooled], axis=1)
    return WordVectors(words, lengths), sorted(truncated)


def punct_masks(sentences: Sequence[Any]) -> list[np.ndarray]:
    """Per sentence ``[n_words]`` bool: UPOS ``PUNCT`` (the reporter's punctuation classes); all False when
    the corpus has no UPOS."""
    return [np.array([u == "PUNCT" for u in s.upos], dtype=bool) if s.upos is not None
            else np.zeros(len(s), dtype=bool) for s in sentences]
