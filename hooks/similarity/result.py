"""The result of a pairwise attribution: a token x token matrix and the accounting that says what it sums to."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

SPECIAL_MARKS = ("##", "Ġ", "▁")


@dataclass
class PairAttribution:
    """One pair explained.

    ``matrix`` ``[len(tokens_a), len(tokens_b)]`` (word pieces, or words with ``level="word"``); ``score``: the
    model's similarity of the pair; ``target``: the quantity the matrix sums to in the method's accounting, with
    its reference inputs in ``reference``; ``error``: ``matrix.sum() - target``; ``method``, ``level``.
    """

    matrix: torch.Tensor
    tokens_a: list[str]
    tokens_b: list[str]
    score: float
    target: float
    error: float
    method: str
    reference: str
    level: str = "piece"

    def top(self, k: int = 5) -> list[tuple[str, str, float]]:
        """The ``k`` token pairs of largest attribution: ``(token of a, token of b, value)``."""
        flat = self.matrix.flatten()
        idx = torch.topk(flat, min(k, flat.numel())).indices.tolist()
        nb = self.matrix.shape[1]
        return [(self.tokens_a[i // nb], self.tokens_b[i % nb], float(flat[i])) for i in idx]

    def frame(self) -> pd.DataFrame:
        """Long table: ``i``, ``token_a``, ``j``, ``token_b``, ``value``."""
        rows = [(i, ta, j, tb, float(self.matrix[i, j])) for i, ta in enumerate(self.tokens_a)
                for j, tb in enumerate(self.tokens_b)]  # fmt: skip
        return pd.DataFrame(rows, columns=["i", "token_a", "j", "token_b", "value"])


def word_groups(pieces: list[str], specials: set[str]) -> tuple[list[str], list[int]]:
    """Words of a piece list and the word index of each piece. WordPiece: ``##`` continues a word; byte-level BPE
    (``Ġ``) and SentencePiece (``▁``): a marked piece starts one; special tokens are words of their own."""
    wordpiece = any(p.startswith("##") for p in pieces)
    words: list[str] = []
    index: list[int] = []
    for n, p in enumerate(pieces):
        starts = (p in specials or n == 0 or (pieces[n - 1] in specials)
                  or (not p.startswith("##") if wordpiece else p.startswith(("Ġ", "▁"))))  # fmt: skip
        if starts or not words:
            words.append(p.lstrip("Ġ▁"))
        else:
            words[-1] += p[2:] if p.startswith("##") else p
        index.append(len(words) - 1)
    return words, index


def to_words(matrix: torch.Tensor, pieces_a: list[str], pieces_b: list[str], specials: set[str]):
    """Sum a piece matrix into a word matrix: ``(matrix [words_a, words_b], words_a, words_b)``."""
    wa, ia = word_groups(pieces_a, specials)
    wb, ib = word_groups(pieces_b, specials)
    ga = torch.zeros(len(wa), len(ia), dtype=matrix.dtype)
    ga[torch.tensor(ia), torch.arange(len(ia))] = 1
    gb = torch.zeros(len(wb), len(ib), dtype=matrix.dtype)
    gb[torch.tensor(ib), torch.arange(len(ib))] = 1
    return ga @ matrix @ gb.T, wa, wb
