"""Containers for corpora: `Sentence` (words plus optional gold annotations) and `Corpus`.

Annotations follow CoNLL-U: `upos` are Universal POS tags, `heads` are 1-based indices of each word's head
(0 = the root), `deprels` are Universal Dependencies relations (subtypes such as `nmod:poss` kept).
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import overload

import pandas as pd

#: Unicode categories with no visible glyph: control, format (zero-width space/joiners, BOM, word joiner), surrogate,
#: and separators. A word made only of these gives no word piece with BERT-family tokenizers (their normaliser
#: drops control and format characters), so it cannot be a word of a corpus.
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zs", "Zl", "Zp"})


def invisible_word(word: str) -> bool:
    """True when ``word`` is empty or made only of invisible characters (see `INVISIBLE_CATEGORIES`), e.g.
    ``"\u200b\u200b"``; a visible word with a zero-width joiner inside is not."""
    return all(unicodedata.category(c) in INVISIBLE_CATEGORIES for c in word)


def invisible_problem(words: tuple[str, ...] | list[str]) -> str | None:
    """What is wrong with the first invisible word of ``words`` (see `invisible_word`), or ``None``."""
    for i, word in enumerate(words):
        if isinstance(word, str) and word and invisible_word(word):
            codes = " ".join(f"U+{ord(c):04X}" for c in word[:8]) + (" ..." if len(word) > 8 else "")
            return (f"word {i + 1} ({codes}) has only invisible characters (zero-width, format or control) and "
                    "gives no word piece; remove it from the corpus")
    return None


class CorpusError(ValueError):
    """A corpus could not be read, built or encoded; the message says where (file, line) and what to do."""


class CorpusFileNotFoundError(CorpusError, FileNotFoundError):
    """The corpus file does not exist."""


@dataclass(frozen=True)
class Sentence:
    """One segment of text split into words, with optional gold annotations (one entry per word).

    `heads` and `deprels` come together or not at all; when given, they must form one tree
    (exactly one word with head 0, every head in 0..len(words), no cycles), else `ValueError`.

    `words` are syntactic words (what annotations index). `multiword` lists the surface tokens that hold several
    of them, as CoNLL-U's `1-2` ranges do: `(first, last, form)` with 0-based inclusive word indices, e.g.
    `(3, 4, "don't")` for the words `do` `n't`; the model reads the surface form and each syntactic word gets the
    pieces of its part of it (see `encoding.encode`). `xpos` are language-specific tags (PTB for English).
    """

    id: str
    words: tuple[str, ...]
    text: str
    upos: tuple[str, ...] | None = None
    heads: tuple[int, ...] | None = None
    deprels: tuple[str, ...] | None = None
    multiword: tuple[tuple[int, int, str], ...] = ()
    xpos: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("words", "upos", "heads", "deprels", "xpos"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        object.__setattr__(self, "multiword", tuple(tuple(m) for m in self.multiword))
        if not self.words:
            raise ValueError(f"sentence {self.id!r} has no words")
        bad = [i for i, w in enumerate(self.words) if not isinstance(w, str) or not w or w.isspace()]
        if bad:
            raise ValueError(f"sentence {self.id!r}: word {bad[0] + 1} is empty or whitespace")
        problem = invisible_problem(self.words)
        if problem:
            raise ValueError(f"sentence {self.id!r}: {problem}")
        self._check_multiword()
        for name in ("upos", "heads", "deprels", "xpos"):
            value = getattr(self, name)
            if value is not None and len(value) != len(self.words):
                raise ValueError(
                    f"sentence {self.id!r}: {len(value)} {name} for {len(self.words)} words; "
                    "give one entry per word"
                )
        if (self.heads is None) != (self.deprels is None):
            raise ValueError(f"sentence {self.id!r}: give both heads and deprels, or neither")
        if self.heads is not None:
            problems = tree_problems(self.heads)
            if problems:
                raise ValueError(f"sentence {self.id!r}: not a dependency tree: {'; '.join(problems)}")

    def __len__(self) -> int:
        return len(self.words)

    def _check_multiword(self) -> None:
        end = -1
        for first, last, form in self.multiword:
            if not (isinstance(first, int) and isinstance(last, int) and end < first < last < len(self.words)):
                raise ValueError(f"sentence {self.id!r}: multiword token {(first, last, form)!r} must span two or more "
                                 f"words in 0..{len(self.words) - 1}, in order, without overlap")
            if not isinstance(form, str) or not form.strip():
                raise ValueError(f"sentence {self.id!r}: multiword token {first}-{last} has an empty form")
            end = last

    def surface_tokens(self) -> list[tuple[str, list[int]]]:
        """The surface tokens in order, each with the syntactic words it holds: `[("I", [0]), ("don't", [1, 2])]`."""
        starts = {first: (last, form) for first, last, form in self.multiword}
        out, i = [], 0
        while i < len(self.words):
            if i in starts:
                last, form = starts[i]
                out.append((form, list(range(i, last + 1))))
                i = last + 1
            else:
                out.append((self.words[i], [i]))
                i += 1
        return out


@dataclass
class Corpus:
    """A named list of sentences. `source` says where it came from (a path, or a generator and its seed);
    `meta` holds generator parameters (e.g. `m` for `repeated-random`)."""

    name: str
    source: str
    sentences: list[Sentence]
    meta: dict = field(default_factory=dict)

    @property
    def sha256(self) -> str:
        """Hash of the content (ids, words, text and annotations, in order); independent of name/source."""
        rows = [[s.id, s.words, s.text, s.upos, s.heads, s.deprels]
                + ([s.multiword] if s.multiword else []) + ([s.xpos] if s.xpos else []) for s in self.sentences]
        payload = json.dumps(rows, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    @property
    def has_syntax(self) -> bool:
        """True when every sentence has gold heads and relations (and the corpus is not empty)."""
        return bool(self.sentences) and all(s.heads is not None for s in self.sentences)

    @property
    def has_upos(self) -> bool:
        """True when every sentence has gold UPOS tags (and the corpus is not empty)."""
        return bool(self.sentences) and all(s.upos is not None for s in self.sentences)

    @property
    def has_xpos(self) -> bool:
        """True when every sentence has language-specific (XPOS) tags (and the corpus is not empty)."""
        return bool(self.sentences) and all(s.xpos is not None for s in self.sentences)

    @property
    def n_words(self) -> int:
        return sum(len(s.words) for s in self.sentences)

    def __len__(self) -> int:
        return len(self.sentences)

    def __iter__(self) -> Iterator[Sentence]:
        return iter(self.sentences)

    @overload
    def __getitem__(self, index: int) -> Sentence: ...
    @overload
    def __getitem__(self, index: slice) -> Corpus: ...
    def __getitem__(self, index: int | slice) -> Sentence | Corpus:
        """An int gives a `Sentence`; a slice gives a `Corpus` with the same name, source and meta."""
        if isinstance(index, slice):
            return Corpus(self.name, self.source, self.sentences[index], dict(self.meta))
        return self.sentences[index]

    def words_frame(self) -> pd.DataFrame:
        """Long table, one row per word: sentence_index, sentence_id, word_index (0-based), word,
        upos, head (1-based, 0 = root), deprel (None where the corpus has no such annotation)."""
        rows = []
        for si, s in enumerate(self.sentences):
            for wi, word in enumerate(s.words):
                rows.append(
                    (
                        si,
                        s.id,
                        wi,
                        word,
                        s.upos[wi] if s.upos else None,
                        s.heads[wi] if s.heads else None,
                        s.deprels[wi] if s.deprels else None,
                    )
                )
        columns = ["sentence_index", "sentence_id", "word_index", "word", "upos", "head", "deprel"]
        return pd.DataFrame(rows, columns=columns)


def tree_problems(heads: tuple[int, ...] | list[int]) -> list[str]:
    """What keeps `heads` (1-based, 0 = root) from being one dependency tree; empty when it is one.

    Checks: heads are ints in 0..n, exactly one root, and every word reaches the root (no cycles).
    """
    n = len(heads)
    problems = []
    out_of_range = [i + 1 for i, h in enumerate(heads) if not isinstance(h, int) or not 0 <= h <= n]
    if out_of_range:
        return [f"head of word {out_of_range[0]} is {heads[out_of_range[0] - 1]!r}, not in 0..{n}"]
    roots = [i + 1 for i, h in enumerate(heads) if h == 0]
    if len(roots) != 1:
        problems.append(f"{len(roots)} roots (words {roots}), expected exactly 1")
    self_loops = [i + 1 for i, h in enumerate(heads) if h == i + 1]
    if self_loops:
        problems.append(f"word {self_loops[0]} is its own head")
    reaches_root = {0}
    for start in range(1, n + 1):
        path: list[int] = []
        node = start
        while node not in reaches_root and node not in path:
            path.append(node)
            node = heads[node - 1]
        if node in reaches_root:
            reaches_root.update(path)
        elif not self_loops:
            problems.append(f"cycle through words {sorted(path[path.index(node):])}")
            break
    return problems
