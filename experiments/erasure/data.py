"""Which sentences train and which evaluate (see the experiment's docstring), and the erasure sites."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Split:
    """Training and evaluation sentences, the corpora they come from, and a content key for the step cache."""

    train: list
    eval: list
    train_name: str
    eval_name: str

    @property
    def key(self) -> str:
        rows = [[s.id, s.words, s.heads, s.deprels, s.upos] for s in self.train + self.eval]
        return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]

    @property
    def has_xpos(self) -> bool:
        return all(s.xpos is not None for s in self.train + self.eval)


def site(layer: int) -> str:
    """The residual-stream site of the tables' index ``layer`` (`naming.residual_site`: 0 = the embeddings,
    k = the stream after layer k-1, ``blocks.{k-1}.hook_resid_post``), as the structure experiment counts it."""
    from bertscope.experiments.naming import residual_site

    return residual_site(layer)


def usable(corpus: Any, min_words: int, max_words: int) -> list:
    """Sentences with gold trees and UPOS whose length is in [min_words, max_words]."""
    return [s for s in corpus if s.heads is not None and s.upos is not None and min_words <= len(s) <= max_words]


def ewt_pair(settings: Any) -> tuple[Any, Any] | None:
    from bertscope.experiments.corpus import read_conllu
    from bertscope.experiments.corpus.ewt import find_ewt

    paths = find_ewt("train"), find_ewt("dev")
    if None in paths:
        return None
    # EWT's first sentences are short fragments and headers: read enough to fill the sizes after filtering
    return (read_conllu(paths[0], max_sentences=max(200, 4 * settings.n_train)),
            read_conllu(paths[1], max_sentences=max(200, 4 * settings.n_eval)))


def flat_sentence_index(lengths: list[int]) -> np.ndarray:
    """The sentence of every flat word row."""
    return np.repeat(np.arange(len(lengths)), lengths)
