"""Known variables per word piece, as binary concepts: what the features experiment labels latents with.

Every concept is a boolean column over token rows (word pieces and the special tokens of each sentence, in the
activations stage's row order) and belongs to one family:

- ``position``: absolute position bins of the word pieces (``position=1`` is the first piece after [CLS], ...
  ``position=20+``) and distance to the sentence's [SEP] (``to_sep=1`` the last piece, ... ``to_sep=11+``). Only
  word pieces carry them: [CLS] is always at position 0 and [SEP] at distance 0, so a position 0 / distance 0 bin
  would be the special token itself (token identity, counted in ``special``), not position;
- ``duplicate``: ``repeats_earlier`` (the piece's id occurred earlier in the sentence) and ``earlier_copy`` (it
  occurs again later in the sentence); special tokens are never either;
- ``syntax``: ``upos=X``, ``deprel=X`` (universal relation, subtypes dropped) and ``depth=d`` (edges to the root,
  ``5+`` pooled), every piece of a word carrying its word's label (only with gold trees);
- ``special``: the special tokens ``cls`` ([CLS]) and ``sep`` ([SEP]), and ``punct`` (a punctuation piece).

``MEANINGS`` says what every label means in words (the feature browser shows it).
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Concept family -> the variables it holds (prefix of the concept names).
FAMILIES = {"position": ("position", "to_sep"), "duplicate": ("repeats_earlier", "earlier_copy"),
            "syntax": ("upos", "deprel", "depth"), "special": ("cls", "sep", "punct")}
POSITION_BINS = ((1, 1), (2, 2), (3, 3), (4, 4), (5, 7), (8, 11), (12, 19), (20, 10_000))  # word pieces only
SEP_BINS = ((1, 1), (2, 2), (3, 5), (6, 10), (11, 10_000))  # word pieces only ([SEP] itself is ``sep``)

#: What each variable of a label means, in words (``{v}``: the label's value).
MEANINGS = {
    "position": "a word piece at token position {v} of its sentence ([CLS] is position 0 and is never a position "
                "label: it is 'cls')",
    "to_sep": "a word piece {v} tokens before the sentence's [SEP] ([SEP] itself is 'sep')",
    "repeats_earlier": "a word piece whose token occurred earlier in the sentence",
    "earlier_copy": "a word piece whose token occurs again later in the sentence",
    "upos": "a piece of a word with universal part of speech {v} (gold annotation)",
    "deprel": "a piece of a word attached to its head by the relation {v} (gold annotation)",
    "depth": "a piece of a word {v} edges below the root of the gold tree",
    "cls": "the [CLS] special token (token identity, not position)",
    "sep": "the [SEP] special token (token identity, not position)",
    "punct": "a punctuation piece",
}
MAX_DEPTH = 5


def family_of(concept: str) -> str:
    """The family a concept name belongs to (``upos=NOUN`` -> ``syntax``)."""
    variable = concept.split("=", 1)[0]
    for family, variables in FAMILIES.items():
        if variable in variables:
            return family
    raise KeyError(f"unknown concept {concept!r}")


def meaning(concept: str) -> str:
    """A label in words (``position=5-7`` -> "a word piece at token position 5-7 of its sentence ..."; see
    ``MEANINGS``)."""
    variable, _, value = concept.partition("=")
    return MEANINGS[variable].format(v=value) if variable in MEANINGS else concept


def variable_of(concept: str) -> str:
    """The variable of a concept name (``upos=NOUN`` -> ``upos``)."""
    return concept.split("=", 1)[0]


def _bin_name(value: int, bins: Sequence[tuple[int, int]]) -> str:
    for lo, hi in bins:
        if lo <= value <= hi:
            return str(lo) if lo == hi else (f"{lo}+" if hi >= 10_000 else f"{lo}-{hi}")
    raise ValueError(value)


@dataclass
class TokenRows:
    """The token rows of a list of sentences: ``sentence`` (index into the list) and ``position`` (piece index,
    0 = [CLS]) per row, ``token_id``, ``word`` (word index, -1 for special tokens) and ``is_cls`` / ``is_sep``."""

    sentence: np.ndarray
    position: np.ndarray
    token_id: np.ndarray
    word: np.ndarray
    is_cls: np.ndarray
    is_sep: np.ndarray

    def __len__(self) -> int:
        return len(self.sentence)


def concept_matrix(rows: TokenRows, sentences: Sequence[Any], tokens: Sequence[str], *,
                   syntax: bool = True) -> tuple[np.ndarray, list[str]]:
    """Boolean concepts ``[n_rows, n_concepts]`` and their names (see the module docstring). ``tokens``: the
    piece string of every vocabulary id (for punctuation); ``syntax``: include UPOS / relation / depth (needs
    gold trees and UPOS on every sentence)."""
    from bertscope.probes.structural import tree_depths

    n = len(rows)
    values: dict[str, list[str | None]] = {"position": [None] * n, "to_sep": [None] * n}
    punct = set(string.punctuation)
    order = np.lexsort((rows.position, rows.sentence))
    sep_at: dict[int, int] = {}
    for r in np.flatnonzero(rows.is_sep):
        sep_at.setdefault(int(rows.sentence[r]), int(rows.position[r]))
    last = {}
    for r in order:
        last[int(rows.sentence[r])] = max(last.get(int(rows.sentence[r]), 0), int(rows.position[r]))
    for r in range(n):
        s, p = int(rows.sentence[r]), int(rows.position[r])
        if rows.is_cls[r] or rows.is_sep[r] or rows.word[r] < 0:
            continue  # special tokens are token identities ("cls", "sep"), never a position
        values["position"][r] = _bin_name(p, POSITION_BINS) if p >= 1 else None
        to_sep = sep_at.get(s, last[s] + 1) - p
        values["to_sep"][r] = _bin_name(to_sep, SEP_BINS) if to_sep >= 1 else None
    repeats, earlier = np.zeros(n, bool), np.zeros(n, bool)
    real = (~rows.is_cls) & (~rows.is_sep) & (rows.word >= 0)
    seen: dict[tuple[int, int], list[int]] = {}
    for r in order:
        if not real[r]:
            continue
        key = (int(rows.sentence[r]), int(rows.token_id[r]))
        if key in seen:
            repeats[r] = True
            earlier[seen[key]] = True
        seen.setdefault(key, []).append(r)
    ispunct = np.array([bool(t) and all(ch in punct for ch in t) for t in tokens])
    columns: dict[str, np.ndarray] = {}
    for var in ("position", "to_sep"):
        arr = np.asarray(values[var], dtype=object)
        for lo, hi in (POSITION_BINS if var == "position" else SEP_BINS):
            name = _bin_name(lo, ((lo, hi),))
            columns[f"{var}={name}"] = arr == name
    columns["repeats_earlier"], columns["earlier_copy"] = repeats, earlier
    if syntax:
        upos, deprel, depth = (np.full(n, "", dtype=object) for _ in range(3))
        depths = [tree_depths(s.heads) for s in sentences]
        for r in np.flatnonzero(real):
            s, w = int(rows.sentence[r]), int(rows.word[r])
            sent = sentences[s]
            upos[r] = sent.upos[w]
            deprel[r] = sent.deprels[w].split(":")[0]
            depth[r] = str(min(int(depths[s][w]), MAX_DEPTH)) + ("+" if int(depths[s][w]) >= MAX_DEPTH else "")
        for var, arr in (("upos", upos), ("deprel", deprel), ("depth", depth)):
            for value in sorted(set(arr) - {""}):
                columns[f"{var}={value}"] = arr == value
    columns["cls"], columns["sep"] = rows.is_cls.astype(bool), rows.is_sep.astype(bool)
    columns["punct"] = real & ispunct[rows.token_id]
    names = list(columns)
    return np.stack([columns[c] for c in names], axis=1), names


def has_syntax(sentences: Sequence[Any]) -> bool:
    """Whether every sentence has gold heads, relations and UPOS."""
    return bool(sentences) and all(s.heads is not None and s.upos is not None and s.deprels is not None
                                   for s in sentences)
