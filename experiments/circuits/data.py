"""What the circuits experiment reads from the corpus and the task (the template's ``data`` role): the TFC1 pairs
cut from the corpus's sentences and the injected token's positions; plain values in and out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from bertscope.hooks import circuits


def tfc1_pairs(sentences: Sequence[Sequence[str]], tokenizer: Any, *, filler: str = "the", max_pairs: int = 32,
               max_tokens: int = 32, seed: int = 0, query_pieces: int = 1) -> list[dict[str, Any]]:
    """The TFC1 term-frequency task after Chen et al. (2024): from each sentence s (its words), a query term w
    that occurs once in s, is alphabetic, is not the filler and, appended to s, adds ``query_pieces`` word pieces
    (1, as in TFC1; counted in context, so that a byte-level BPE's "Ġw" counts as the one piece it is), drawn with
    ``seed``; ``clean = s + " " + w``, ``corrupted = s + " " + filler`` (the filler must add as many pieces);
    ``query = w``. Sentences whose clean text is over ``max_tokens`` word pieces, or with no such word, are
    skipped; at most ``max_pairs`` pairs."""
    rng = np.random.default_rng(seed)

    def n_pieces(text: str) -> int:
        return len(tokenizer(text)["input_ids"])

    pairs = []
    for i, words in enumerate(sentences):
        text = " ".join(words)
        base = n_pieces(text)
        if n_pieces(f"{text} {filler}") != base + query_pieces:
            continue
        lowered = [w.lower() for w in words]
        candidates = sorted({w for w in lowered if w.isalpha() and w != filler and lowered.count(w) == 1})
        candidates = [w for w in candidates if n_pieces(f"{text} {w}") == base + query_pieces]
        if not candidates:
            continue
        w = candidates[int(rng.integers(len(candidates)))]
        clean, corrupted = f"{text} {w}", f"{text} {filler}"
        if base + query_pieces > max_tokens:
            continue
        pairs.append({"clean": clean, "corrupted": corrupted, "query": w, "sentence": i})
        if len(pairs) >= max_pairs:
            break
    return pairs


def injected_positions(task: circuits.Task) -> torch.Tensor:
    """``[n_pairs]``: the position of the last real token before the final special token (the TFC1 term's last
    piece)."""
    return task.mask.sum(1) - 2
