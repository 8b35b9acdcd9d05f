"""`repeated-random`: m random vocabulary tokens, then the same m tokens again.

Each sequence draws m distinct tokens, so every token occurs exactly twice and each copy sits exactly m
positions after the original, in words and in word pieces alike (every token is one whole-word piece).
Used by the same-token experiment to find heads that attend to earlier copies of the current token.
"""

from __future__ import annotations

import random
import re
import weakref

from .base import Corpus, CorpusError, Sentence

REPEATED_RANDOM_SIZE = 500  # sequences in the default repeated-random corpus
DEFAULT_M = 20  # tokens per half
_WORD = re.compile(r"[A-Za-z]{2,}")
_POOLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> single_piece_words (~2 s to build)


def repeated_random(tokenizer, n_sentences: int = REPEATED_RANDOM_SIZE, *, m: int = DEFAULT_M,
                    seed: int = 0) -> Corpus:
    """`n_sentences` sequences of 2*m words: m distinct random vocabulary tokens repeated once.

    Tokens are whole-word, alphabetic (ASCII letters, 2+ characters) vocabulary entries that the tokenizer
    maps back to exactly one piece, never special tokens. Deterministic per `seed` and tokenizer vocabulary.
    `meta["m"]` is the copy offset, in words and in pieces.
    """
    if tokenizer is None:
        raise CorpusError("the repeated-random corpus is drawn from a tokenizer's vocabulary; pass tokenizer= "
                          "(e.g. model.tokenizer)")
    if not isinstance(m, int) or m < 1:
        raise ValueError(f"m (tokens per half) must be a positive integer, got {m!r}")
    if not isinstance(n_sentences, int) or n_sentences < 1:
        raise ValueError(f"n_sentences must be a positive integer, got {n_sentences!r}")
    pool = single_piece_words(tokenizer)
    if len(pool) < m:
        raise CorpusError(f"the tokenizer has only {len(pool)} single-piece alphabetic words; m={m} needs {m}")
    rng = random.Random(f"bertscope-repeated-random/{seed}/{m}")
    sentences = []
    for i in range(n_sentences):
        half = rng.sample(pool, m)
        words = tuple(half + half)
        sentences.append(Sentence(id=f"repeated-random/{seed}/{i}", words=words, text=" ".join(words)))
    meta = {"m": m, "seed": seed, "n_sentences": n_sentences, "pool_size": len(pool)}
    return Corpus(name="repeated-random", source=f"repeated-random (m={m}, seed={seed})", sentences=sentences,
                  meta=meta)


def single_piece_words(tokenizer) -> list[str]:
    """Vocabulary entries that are alphabetic whole words (not `##` continuations, not special tokens)
    and that the tokenizer encodes as exactly themselves, one piece; sorted by token id. Cached per tokenizer."""
    try:
        return list(_POOLS[tokenizer])
    except (KeyError, TypeError):  # TypeError: an object that cannot be weakly referenced
        pass
    from .encoding import _word_prefix

    vocab = tokenizer.get_vocab()
    special = set(tokenizer.all_special_tokens)
    # a word-start marker (SentencePiece "▁", byte-level BPE "Ġ") is not part of the word
    candidates = sorted((i, t.removeprefix("▁").removeprefix("Ġ")) for t, i in vocab.items() if t not in special)
    candidates = [(i, w) for i, w in candidates if _WORD.fullmatch(w)]
    if not candidates:
        return []
    prefix = _word_prefix(tokenizer)  # encoded as corpus words are (see encoding.encode)
    encoded = _encode_words([[prefix + w] for _, w in candidates], tokenizer)
    pool = list(dict.fromkeys(w for (i, w), ids in zip(candidates, encoded, strict=True) if ids == [i]))
    try:
        _POOLS[tokenizer] = tuple(pool)
    except TypeError:
        pass
    return pool


def _encode_words(words: list[list[str]], tokenizer) -> list[list[int]]:
    """Piece ids of pre-split ``words`` without special tokens, as ``tokenizer(words, is_split_into_words=True,
    add_special_tokens=False)`` gives them. A fast tokenizer's backend is called directly: transformers' per-item
    conversion costs ~4x the encoding itself (a 250k-piece vocabulary: seconds)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return tokenizer(words, is_split_into_words=True, add_special_tokens=False)["input_ids"]
    if backend.truncation is not None:  # what transformers does for truncation=False, padding=False
        backend.no_truncation()
    if backend.padding is not None:
        backend.no_padding()
    return [e.ids for e in backend.encode_batch(words, is_pretokenized=True, add_special_tokens=False)]
