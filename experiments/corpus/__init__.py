"""Corpora for bertscope: readers, the `builtin` and `repeated-random` generators, tokenisation with word
alignment, and word-level attention maps.

    corpus = load_corpus("builtin", max_sentences=200)          # or "repeated-random", or a file path
    encoded = encode(corpus, model.tokenizer, max_length=128, batch_size=32)
    for batch in encoded:                                      # batch.input_ids [batch, pos], ...
        ...
        maps = word_attention(pattern[b], batch.word_ids[b])    # [..., n_words, n_words]
"""

from __future__ import annotations

import re
from pathlib import Path

from bertscope.hooks.lazy import lazy_names

from .base import Corpus, CorpusError, CorpusFileNotFoundError, Sentence, tree_problems
from .builtin import BUILTIN_SIZE, generate_builtin
from .readers import SUFFIXES, read_conllu, read_corpus_file, read_jsonl, read_text, write_conllu
from .repeated import DEFAULT_M, REPEATED_RANDOM_SIZE, repeated_random, single_piece_words

# The encoding names import torch: loaded on first use, so reading a corpus or a pairs file (`pairs`) for a usage
# check stays torch-free.
_LAZY = {name: "bertscope.experiments.corpus.encoding"
         for name in ("Batch", "Encoded", "encode", "unencodable", "word_attention", "word_pool")}
__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY)

__all__ = [
    "BUILTIN_SIZE", "DEFAULT_M", "REPEATED_RANDOM_SIZE", "SUFFIXES", "Batch", "Corpus", "CorpusError",
    "CorpusFileNotFoundError", "Encoded", "Sentence", "encode", "generate_builtin", "load_corpus",
    "read_conllu", "read_corpus_file", "read_jsonl", "read_text", "repeated_random", "single_piece_words",
    "tree_problems", "unencodable", "word_attention", "word_pool", "write_conllu",
]

CORPUS_NAMES = ("builtin", "repeated-random", "repeated-random:m=<int>")
_REPEATED = re.compile(r"repeated-random(?::m=(\d+))?")


def load_corpus(spec: str | Path = "builtin", *, tokenizer=None, max_sentences: int | None = None,
                seed: int = 0, m: int | None = None) -> Corpus:
    """A corpus by name or path.

    spec: "builtin" (BUILTIN_SIZE generated sentences with gold UPOS and dependencies), "repeated-random"
    (REPEATED_RANDOM_SIZE sequences of m random tokens repeated twice; needs `tokenizer`; m from the
    `m` argument, or the spec "repeated-random:m=30", default DEFAULT_M), or the path of a .txt, .conllu
    or .jsonl file. max_sentences keeps the first N sentences (a generated corpus's first N are the same
    whatever N is). seed drives the generators; files ignore it.
    """
    if max_sentences is not None and (not isinstance(max_sentences, int) or max_sentences < 1):
        raise ValueError(f"max_sentences must be a positive integer or None, got {max_sentences!r}")
    text = str(spec)
    if text == "builtin":
        return generate_builtin(min(max_sentences or BUILTIN_SIZE, BUILTIN_SIZE), seed=seed)
    repeated = _REPEATED.fullmatch(text)
    if repeated:
        if repeated.group(1) and m is not None and int(repeated.group(1)) != m:
            raise ValueError(f"corpus {text!r} and m={m} disagree; give m once")
        m = int(repeated.group(1)) if repeated.group(1) else m or DEFAULT_M
        n = min(max_sentences or REPEATED_RANDOM_SIZE, REPEATED_RANDOM_SIZE)
        return repeated_random(tokenizer, n, m=m, seed=seed)
    path = Path(spec)
    if not path.exists() and path.suffix.lower() not in SUFFIXES:
        raise CorpusFileNotFoundError(
            f"corpus {text!r} is neither a known corpus ({', '.join(CORPUS_NAMES)}) nor an existing file; "
            "give one of those names or the path of a .txt, .conllu or .jsonl file"
        )
    return read_corpus_file(path, max_sentences=max_sentences)
