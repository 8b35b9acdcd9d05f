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
    """The residual-stream site of layer number ``layer``: 0 = the embedding output, k = block k-1's output
    (``blocks.{k-1}.hook_resid_post``), as the structure experiment numbers layers."""
    return "embed.hook_out" if layer == 0 else f"blocks.{layer - 1}.hook_resid_post"


def usable(corpus: Any, min_words: int, max_words: int) -> list:
    """Sentences with gold trees and UPOS whose length is in [min_words, max_words]."""
    return [s for s in corpus if s.heads is not None and s.upos is not None and min_words <= len(s) <= max_words]


def choose_sentences(ctx: Any, settings: Any) -> Split:
    """Training and evaluation sentences: --corpus / --eval-corpus; else EWT train / dev (``source="auto"``, run
    corpus ``builtin``, EWT found); else a seeded split of the run's corpus by sentence."""
    from bertscope.experiments.options import UsageError

    lo, hi = settings.min_words, settings.max_words
    eval_corpus = getattr(ctx.inputs, "eval_corpus", None)
    if eval_corpus is not None:
        train, evaluate = usable(ctx.corpus, lo, hi), usable(eval_corpus, lo, hi)
        names = (ctx.corpus_id, str(eval_corpus.name))
    else:
        ewt = _ewt_pair(settings) if settings.source == "auto" and ctx.corpus_id == "builtin" else None
        if ewt is not None:
            (train_c, eval_c) = ewt
            train, evaluate = usable(train_c, lo, hi), usable(eval_c, lo, hi)
            names = (train_c.name, eval_c.name)
        else:
            pool = usable(ctx.corpus, lo, hi)
            order = ctx.rng("split").permutation(len(pool))
            n_eval = min(settings.n_eval, len(pool) // 3)
            evaluate = [pool[i] for i in order[:n_eval]]
            train = [pool[i] for i in order[n_eval:]]
            names = (f"{ctx.corpus_id}:train-part", f"{ctx.corpus_id}:eval-part")
    cap = ctx.options.max_sentences or max(settings.n_train, settings.n_eval)  # --max-sentences caps both
    n_train, n_eval = min(settings.n_train, cap), min(settings.n_eval, cap)
    train, evaluate = _fits(ctx, train[: 3 * n_train + 20])[:n_train], _fits(ctx, evaluate[: 3 * n_eval + 20])[:n_eval]
    if len(train) < 2 or len(evaluate) < 2:
        raise UsageError(f"erasure needs sentences with gold trees and UPOS of {lo}-{hi} words: found {len(train)} "
                         f"for training and {len(evaluate)} for evaluation; use --corpus builtin or a .conllu file")
    return Split(train, evaluate, names[0], names[1])


def _fits(ctx: Any, sentences: list) -> list:
    """The sentences that fit --max-length whole (the others are left out and counted in the manifest)."""
    import warnings

    from bertscope.experiments.corpus import encode

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        enc = encode(sentences, ctx.model.tokenizer, max_length=ctx.options.max_length, batch_size=64)
    if not enc.n_truncated:
        return sentences
    cut = set(enc.truncated_ids)
    ctx.note("n_left_out_too_long", ctx.notes.get("n_left_out_too_long", 0) + len(cut))
    return [s for s in sentences if s.id not in cut]


def _ewt_pair(settings: Any) -> tuple[Any, Any] | None:
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
