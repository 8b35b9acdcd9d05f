"""Dependency syntax in word-level attention maps (Clark et al. 2019, section 4), on plain tensors.

A head "predicts" the head word of a dependent ``d`` by its argmax: in direction ``dep->head`` the argmax of
row ``d``, in direction ``head->dep`` (the transposed reading) the argmax of the gold head's row, which must
then be ``d``. The query word itself is excluded before the argmax; [CLS] and [SEP] are not words, so they are
already gone from word-level maps (``experiments.corpus.word_attention``). The baseline predicts the head at a
fixed offset ``d + k`` (``k`` in -3..+3 except 0) and takes the best offset per relation.

Choosing the best of ``layers * heads * 2`` candidates on the same arcs flatters the winner; the table therefore
also reports a held-out score: candidates (and the baseline offset) are chosen on one half of the sentences and
scored on the other, both ways round.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

DIRECTIONS = ("dep->head", "head->dep")
BASELINE_OFFSETS = (-3, -2, -1, 1, 2, 3)
ALL_RELATIONS = "ALL"  # one head and one offset for every arc
PER_RELATION = "PER-RELATION"  # each relation its own best head / offset, arcs pooled


@dataclass
class ArcHits:
    """Which candidates got each gold arc right, over a corpus.

    ``head_hits``: ``[arc, layer, head, direction]`` bool; ``offset_hits``: ``[arc, offset]`` bool for
    ``BASELINE_OFFSETS``; ``relations``: ``[arc]`` str; ``sentences``: ``[arc]`` int sentence index.
    """

    head_hits: np.ndarray
    offset_hits: np.ndarray
    relations: np.ndarray
    sentences: np.ndarray

    @classmethod
    def concat(cls, parts: Sequence[ArcHits]) -> ArcHits:
        if not parts:
            raise ValueError("ArcHits.concat needs at least one part (no sentence had a scorable arc)")
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in cls.__dataclass_fields__))


def sentence_arc_hits(
    word_maps: torch.Tensor,
    gold_heads: Sequence[int],
    deprels: Sequence[str],
    sentence: int = 0,
    *,
    collapse_subtypes: bool = True,
) -> ArcHits:
    """Score every non-root arc of one sentence against every head of every layer.

    Args:
        word_maps: ``[layer, head, n_words, n_words]`` word-level attention (from-word rows, to-word columns).
        gold_heads: ``[n_words]`` CoNLL-U heads (1-based, 0 = root).
        deprels: ``[n_words]`` relation labels; ``nmod:poss`` counts as ``nmod`` when ``collapse_subtypes``.
        sentence: index stored with each arc.
    """
    if word_maps.ndim != 4 or word_maps.shape[-1] != word_maps.shape[-2]:
        raise ValueError(f"word_maps must be [layer, head, n_words, n_words], got {tuple(word_maps.shape)}")
    n = word_maps.shape[-1]
    if len(gold_heads) != n or len(deprels) != n:
        raise ValueError(
            f"sentence {sentence}: {n} words in the attention map but {len(gold_heads)} gold heads and "
            f"{len(deprels)} relations; the word segmentation of the map and of the corpus must agree"
        )
    heads = np.asarray(gold_heads, dtype=np.int64)
    if heads.min(initial=0) < 0 or heads.max(initial=0) > n:
        raise ValueError(f"sentence {sentence}: gold heads must lie in 0..{n} (CoNLL-U, 0 = root), got {list(heads)}")
    dep = np.flatnonzero(heads > 0)
    head = heads[dep] - 1
    top = _argmax_excluding_self(word_maps)  # [layer, head, n_words]
    dep_t, head_t = torch.as_tensor(dep), torch.as_tensor(head)
    to_head = top[..., dep_t] == head_t  # [layer, head, arc]
    to_dep = top[..., head_t] == dep_t
    head_hits = torch.stack([to_head, to_dep], dim=-1).permute(2, 0, 1, 3).numpy()  # [arc, layer, head, dir]
    offset_hits = head[:, None] == dep[:, None] + np.asarray(BASELINE_OFFSETS)[None, :]
    rel = np.asarray([_relation(deprels[d], collapse_subtypes) for d in dep], dtype=object)
    return ArcHits(head_hits, offset_hits, rel, np.full(len(dep), sentence, dtype=np.int64))


def head_relation_accuracy(hits: ArcHits) -> pd.DataFrame:
    """Accuracy of every (layer, head, direction) on every relation and on all arcs.

    Returns a long table: ``relation, layer, head, direction, accuracy, n`` plus, per relation, the best
    baseline offset's accuracy in ``baseline_accuracy``.
    """
    _, n_layers, n_heads, _ = hits.head_hits.shape
    rows = []
    for rel, sel in _relation_groups(hits):
        acc = hits.head_hits[sel].mean(0)  # [layer, head, dir]
        base = hits.offset_hits[sel].mean(0).max()
        layer, head, direction = np.meshgrid(np.arange(n_layers), np.arange(n_heads), np.arange(2), indexing="ij")
        rows.append(
            pd.DataFrame(
                {
                    "relation": rel,
                    "layer": layer.ravel(),
                    "head": head.ravel(),
                    "direction": np.asarray(DIRECTIONS)[direction.ravel()],
                    "accuracy": acc.ravel(),
                    "n": int(sel.sum()),
                    "baseline_accuracy": base,
                }
            )
        )
    return pd.concat(rows, ignore_index=True)


def syntax_table(hits: ArcHits, *, min_arcs: int = 1, seed: int = 0) -> pd.DataFrame:
    """Per relation: best head and direction against the best fixed-offset baseline, plus overall scores.

    Columns: ``relation, n, n_sentences, layer, head, direction, accuracy, baseline_offset,
    baseline_accuracy, gain, heldout_accuracy, heldout_baseline_accuracy, heldout_gain``. Accuracies are
    fractions of arcs. Relations with fewer than ``min_arcs`` arcs are left out. Two overall rows close the
    table: ``ALL`` (one head and one offset for every arc) and ``PER-RELATION`` (each relation scored by its
    own best head and best offset, arcs pooled; layer/head/direction are then empty).
    """
    folds = _sentence_folds(hits.sentences, seed)
    rows = []
    per_relation_hits = {"head": [], "base": [], "heldout_head": [], "heldout_base": []}
    for rel, sel in _relation_groups(hits):
        if rel == ALL_RELATIONS or sel.sum() < min_arcs:
            continue
        row, parts = _relation_row(rel, hits, sel, folds)
        rows.append(row)
        for key, value in parts.items():
            per_relation_hits[key].append(value)
    all_sel = np.ones(len(hits.relations), dtype=bool)
    if rows:
        rows.append(_relation_row(ALL_RELATIONS, hits, all_sel, folds)[0])
        pooled = {k: np.concatenate(v) for k, v in per_relation_hits.items()}
        rows.append(
            {
                "relation": PER_RELATION,
                "n": len(pooled["head"]),
                "n_sentences": len(np.unique(hits.sentences)),
                "layer": pd.NA,
                "head": pd.NA,
                "direction": None,
                "accuracy": pooled["head"].mean(),
                "baseline_offset": pd.NA,
                "baseline_accuracy": pooled["base"].mean(),
                "gain": pooled["head"].mean() - pooled["base"].mean(),
                "heldout_accuracy": _nanmean(pooled["heldout_head"]),
                "heldout_baseline_accuracy": _nanmean(pooled["heldout_base"]),
                "heldout_gain": _nanmean(pooled["heldout_head"]) - _nanmean(pooled["heldout_base"]),
            }
        )
    table = pd.DataFrame(rows, columns=_TABLE_COLUMNS)
    for col in ("layer", "head", "baseline_offset"):
        table[col] = table[col].astype("Int64")
    return table


# ----------------------------------------------------------------------------------------------- helpers

_TABLE_COLUMNS = [
    "relation",
    "n",
    "n_sentences",
    "layer",
    "head",
    "direction",
    "accuracy",
    "baseline_offset",
    "baseline_accuracy",
    "gain",
    "heldout_accuracy",
    "heldout_baseline_accuracy",
    "heldout_gain",
]


def _argmax_excluding_self(word_maps: torch.Tensor) -> torch.Tensor:
    """Argmax over keys with the query word itself removed -> ``[..., n_words]`` (ties: lowest index)."""
    n = word_maps.shape[-1]
    eye = torch.eye(n, dtype=torch.bool, device=word_maps.device)
    masked = word_maps.detach().to(torch.float64).masked_fill(eye, float("-inf"))
    if n == 1:  # a one-word sentence has no arc; any answer will do
        return torch.zeros(word_maps.shape[:-1], dtype=torch.long)
    return masked.argmax(-1).cpu()


def _relation(label: str, collapse_subtypes: bool) -> str:
    label = str(label).strip().lower()
    return label.split(":")[0] if collapse_subtypes else label


def _relation_groups(hits: ArcHits) -> list[tuple[str, np.ndarray]]:
    """``(relation, arc mask)`` for every relation (sorted) and for all arcs."""
    groups = [(rel, hits.relations == rel) for rel in sorted(set(hits.relations.tolist()))]
    return [*groups, (ALL_RELATIONS, np.ones(len(hits.relations), dtype=bool))]


def _sentence_folds(sentences: np.ndarray, seed: int) -> np.ndarray:
    """Fold 0/1 of each arc, by a seeded split of its sentences into halves -> ``[arc]``."""
    unique = np.unique(sentences)
    order = np.random.default_rng(seed).permutation(len(unique))
    fold_of = dict(zip(unique[order].tolist(), (np.arange(len(unique)) % 2).tolist(), strict=True))
    return np.asarray([fold_of[s] for s in sentences.tolist()], dtype=np.int64)


def _relation_row(rel: str, hits: ArcHits, sel: np.ndarray, folds: np.ndarray) -> tuple[dict, dict]:
    head_hits = hits.head_hits[sel]  # [arc, layer, head, dir]
    offset_hits = hits.offset_hits[sel]  # [arc, offset]
    flat = head_hits.reshape(len(head_hits), -1)
    best = int(np.argmax(flat.mean(0)))  # ties: first in (layer, head, direction) order
    layer, head, direction = np.unravel_index(best, head_hits.shape[1:])
    best_offset = int(np.argmax(offset_hits.mean(0)))
    fold = folds[sel]
    heldout_head = np.full(len(flat), np.nan)
    heldout_base = np.full(len(flat), np.nan)
    for f in (0, 1):
        train, test = fold != f, fold == f
        if train.any() and test.any():
            heldout_head[test] = flat[test, int(np.argmax(flat[train].mean(0)))]
            heldout_base[test] = offset_hits[test, int(np.argmax(offset_hits[train].mean(0)))]
    acc = flat[:, best].mean()
    base = offset_hits[:, best_offset].mean()
    row = {
        "relation": rel,
        "n": int(sel.sum()),
        "n_sentences": len(np.unique(hits.sentences[sel])),
        "layer": int(layer),
        "head": int(head),
        "direction": DIRECTIONS[int(direction)],
        "accuracy": acc,
        "baseline_offset": BASELINE_OFFSETS[best_offset],
        "baseline_accuracy": base,
        "gain": acc - base,
        "heldout_accuracy": _nanmean(heldout_head),
        "heldout_baseline_accuracy": _nanmean(heldout_base),
        "heldout_gain": _nanmean(heldout_head) - _nanmean(heldout_base),
    }
    parts = {
        "head": flat[:, best].astype(np.float64),
        "base": offset_hits[:, best_offset].astype(np.float64),
        "heldout_head": heldout_head,
        "heldout_base": heldout_base,
    }
    return row, parts


def _nanmean(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=np.float64)
    return float(np.nanmean(x)) if np.isfinite(x).any() else float("nan")
