"""Dependency syntax in word-level attention maps (Clark et al. 2019, section 4), on plain tensors.

A head "predicts" the head word of a dependent ``d`` by an argmax, as in Clark et al.'s analysis code
(``attn_head_predictor`` in clarkkev/attention-analysis): in direction ``dep->head`` the argmax of row ``d``
(the word ``d`` attends to most); in direction ``head->dep`` (their ``mode="transpose"``) the argmax of row
``d`` of the TRANSPOSED map, i.e. ``argmax_j A[j, d]``: the word that attends most to ``d``. In both, the
diagonal (the word itself) is excluded before the argmax, and [CLS]/[SEP] are not words, so they are already
gone from word-level maps (``experiments.corpus.word_attention``: sum over the pieces attended to, mean over the
pieces attending from, as Clark's ``bpe_utils``). Root arcs (gold head 0) are not scored: an argmax over words
can never name the root (Clark's "all" counts them as misses; here they are left out of every denominator).
Relation subtypes (``nmod:poss``) are kept apart unless ``collapse_subtypes``. The baseline predicts the head at
a fixed offset ``d + k`` (``k`` in -3..+3 except 0) and takes the best offset per relation.

Choosing the best of ``layers * heads * 2`` candidates on the same arcs flatters the winner; the headline table
therefore reports held-out scores: candidates (and the baseline offset) are chosen on one half of the sentences
and scored on the other, both ways round, with sentence-bootstrap intervals (``selection = "held-out"``).
``punct`` (and ``root``) are left out of the headline table (Clark et al.'s Table 1 convention) but stay in the
long table.
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
HEADLINE_EXCLUDED = ("punct", "root")  # out of the headline table and figure (Clark et al.'s Table 1)


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
    collapse_subtypes: bool = False,
) -> ArcHits:
    """Score every non-root arc of one sentence against every head of every layer.

    Args:
        word_maps: ``[layer, head, n_words, n_words]`` word-level attention (from-word rows, to-word columns).
        gold_heads: ``[n_words]`` CoNLL-U heads (1-based, 0 = root).
        deprels: ``[n_words]`` relation labels; ``nmod:poss`` counts as ``nmod`` when ``collapse_subtypes``.
        sentence: index stored with each arc.

    Hits: ``dep->head`` when ``argmax_{j != d} A[d, j]`` is the gold head of ``d``; ``head->dep`` when
    ``argmax_{j != d} A[j, d]`` is (the transposed map; a head word with several dependents can hit them all).
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
    top = _argmax_excluding_self(word_maps)  # [layer, head, n_words]: word each word attends to most
    top_t = _argmax_excluding_self(word_maps.transpose(-1, -2))  # [layer, head, n_words]: word attending most to it
    dep_t, head_t = torch.as_tensor(dep), torch.as_tensor(head)
    to_head = top[..., dep_t] == head_t  # [layer, head, arc]
    to_dep = top_t[..., dep_t] == head_t
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


def syntax_table(
    hits: ArcHits,
    *,
    min_arcs: int = 1,
    exclude: Sequence[str] = HEADLINE_EXCLUDED,
    seed: int = 0,
    n_boot: int = 1000,
    ci: float = 0.95,
) -> pd.DataFrame:
    """Headline table: per relation, the best head and direction against the best fixed-offset baseline.

    The candidate (layer, head, direction) and the baseline offset are chosen on one half of the sentences and
    scored on the other, both ways round (arcs of both halves pooled): ``heldout_*`` columns, with percentile
    intervals from a bootstrap over sentences (the selection held fixed), and ``selection = "held-out"``.
    ``layer, head, direction, accuracy, baseline_offset, baseline_accuracy, gain`` describe the candidate chosen
    on ALL sentences and its in-sample score (flattered by the choice; for reference only).

    Relations with fewer than ``min_arcs`` arcs and those in ``exclude`` (``punct``, ``root``) are left out.
    Two overall rows close the table: ``ALL`` (one head and one offset for every non-root arc, ``punct``
    included as in Clark et al.'s "all") and ``PER-RELATION`` (each reported relation scored by its own
    held-out choice, arcs pooled; layer/head/direction are then empty).
    """
    folds = _sentence_folds(hits.sentences, seed)
    table = _table(hits, folds, (0, 1), np.ones(len(folds), dtype=bool), min_arcs=min_arcs, exclude=exclude,
                   seed=seed, n_boot=n_boot, ci=ci)  # fmt: skip
    table["selection"] = "held-out"
    return table


def syntax_table_eval(
    select: ArcHits,
    evaluate: ArcHits,
    *,
    min_arcs: int = 1,
    exclude: Sequence[str] = HEADLINE_EXCLUDED,
    seed: int = 0,
    n_boot: int = 1000,
    ci: float = 0.95,
    select_name: str = "select",
    eval_name: str = "eval",
) -> pd.DataFrame:
    """`syntax_table` with a separate evaluation corpus: per relation, the best (layer, head, direction) and the
    baseline offset are chosen on ALL arcs of ``select`` (``--corpus``) and scored on ``evaluate``
    (``--eval-corpus``) only: ``heldout_*`` columns (sentence-bootstrap intervals over the evaluation sentences,
    the choice held fixed), ``n`` / ``n_sentences`` the evaluation arcs and sentences. The reported relations
    are those with at least ``min_arcs`` arcs in ``select`` (a relation absent from ``evaluate`` gets NaN
    scores), so no choice, not even which relations are listed, depends on the evaluation sentences.
    ``accuracy, baseline_accuracy, gain`` are the chosen candidate's in-sample scores on ``select``;
    ``n_select`` its arcs there; ``selection`` names both corpora, ``selection_corpus`` / ``eval_corpus`` too."""
    hits, folds = _stacked(select, evaluate)
    table = _table(hits, folds, (0,), folds == 1, min_arcs=min_arcs, exclude=exclude, seed=seed, n_boot=n_boot,
                   ci=ci)  # fmt: skip
    table["selection"] = f"chosen on {select_name}, scored on {eval_name}"
    table["selection_corpus"], table["eval_corpus"] = select_name, eval_name
    return table


def _stacked(select: ArcHits, evaluate: ArcHits) -> tuple[ArcHits, np.ndarray]:
    """``select`` and ``evaluate`` as one `ArcHits` (evaluation sentence ids shifted past the selection ones) and
    the fold of each arc: 1 = selection, 0 = evaluation (the fold a held-out choice is scored on)."""
    shift = int(select.sentences.max(initial=-1)) + 1
    moved = ArcHits(evaluate.head_hits, evaluate.offset_hits, evaluate.relations, evaluate.sentences + shift)
    folds = np.concatenate([np.ones(len(select.relations), dtype=np.int64),
                            np.zeros(len(evaluate.relations), dtype=np.int64)])  # fmt: skip
    return ArcHits.concat([select, moved]), folds


def _table(hits: ArcHits, folds: np.ndarray, scored_folds: tuple[int, ...], insample: np.ndarray, *,
           min_arcs: int, exclude: Sequence[str], seed: int, n_boot: int, ci: float) -> pd.DataFrame:
    """The headline table: each fold in ``scored_folds`` scored by the choice made on the other arcs;
    ``insample [arc]`` marks the arcs the in-sample columns and the ``min_arcs`` filter read."""
    rows = []
    pooled: dict[str, list[np.ndarray]] = {"head": [], "base": [], "sent": []}
    eval_mode = scored_folds != (0, 1)
    for rel, sel in _relation_groups(hits):
        if rel == ALL_RELATIONS or rel in exclude or (sel & insample).sum() < min_arcs:
            continue
        row, parts = _relation_row(rel, hits, sel, folds, n_boot=n_boot, ci=ci, seed=seed, scored_folds=scored_folds,
                                   insample=insample)  # fmt: skip
        rows.append(row)
        for key, value in parts.items():
            pooled[key].append(value)
    if rows:
        all_sel = np.ones(len(hits.relations), dtype=bool)
        rows.append(_relation_row(ALL_RELATIONS, hits, all_sel, folds, n_boot=n_boot, ci=ci, seed=seed,
                                  scored_folds=scored_folds, insample=insample)[0])  # fmt: skip
        head, base, sent = (np.concatenate(pooled[k]) for k in ("head", "base", "sent"))
        summary = _heldout_summary(head, base, sent, n_boot=n_boot, ci=ci, seed=seed)
        rows.append({"relation": PER_RELATION, "n": len(head), "n_sentences": len(np.unique(sent)), **summary})
    columns = [*_TABLE_COLUMNS, "n_select"] if eval_mode else _TABLE_COLUMNS
    table = pd.DataFrame(rows).reindex(columns=columns)
    for col in ("layer", "head", "baseline_offset"):
        table[col] = table[col].astype("Int64")
    return table


def skipped_relations(hits: ArcHits, min_arcs: int) -> dict[str, int]:
    """``{relation: arcs}`` for relations with fewer than ``min_arcs`` arcs (left out of the headline table)."""
    rel, counts = np.unique(hits.relations.astype(str), return_counts=True)
    return {str(r): int(c) for r, c in zip(rel, counts, strict=True) if c < min_arcs}


def heldout_head_gains(
    hits: ArcHits,
    *,
    min_arcs: int = 1,
    exclude: Sequence[str] = HEADLINE_EXCLUDED,
    threshold: float = 0.0,
    seed: int = 0,
    n_boot: int = 1000,
    ci: float = 0.95,
) -> pd.DataFrame:
    """Held-out gain of every head on every relation over the relation's best offset baseline.

    For each (layer, head, relation): the direction and the baseline offset are chosen on one half of the
    sentences, the per-arc gain (head hit - baseline hit) is scored on the other, both ways round. Intervals and
    a standard error come from a bootstrap over sentences; ``p_value`` tests ``gain <= threshold`` one-sided
    with the bootstrap standard error (normal approximation), for a multiple-testing correction over all rows.

    Returns a long table ``layer, head, relation, n, n_sentences, heldout_accuracy, heldout_baseline_accuracy,
    heldout_gain, ci_low, ci_high, se, p_value, selection``.
    """
    folds = _sentence_folds(hits.sentences, seed)
    out = _gains(hits, folds, (0, 1), np.ones(len(folds), dtype=bool), min_arcs=min_arcs, exclude=exclude,
                 threshold=threshold, seed=seed, n_boot=n_boot, ci=ci)  # fmt: skip
    out["selection"] = "held-out"
    return out


def heldout_head_gains_eval(
    select: ArcHits,
    evaluate: ArcHits,
    *,
    min_arcs: int = 1,
    exclude: Sequence[str] = HEADLINE_EXCLUDED,
    threshold: float = 0.0,
    seed: int = 0,
    n_boot: int = 1000,
    ci: float = 0.95,
    select_name: str = "select",
    eval_name: str = "eval",
) -> pd.DataFrame:
    """`heldout_head_gains` with a separate evaluation corpus: each head's direction and each relation's
    baseline offset chosen on ``select``, the gain (and its p-value) scored on ``evaluate`` only; relations
    kept when ``select`` has ``min_arcs`` arcs of them."""
    hits, folds = _stacked(select, evaluate)
    out = _gains(hits, folds, (0,), folds == 1, min_arcs=min_arcs, exclude=exclude, threshold=threshold, seed=seed,
                 n_boot=n_boot, ci=ci)  # fmt: skip
    out["selection"] = f"chosen on {select_name}, scored on {eval_name}"
    return out


def _gains(hits: ArcHits, folds: np.ndarray, scored_folds: tuple[int, ...], insample: np.ndarray, *, min_arcs: int,
           exclude: Sequence[str], threshold: float, seed: int, n_boot: int, ci: float) -> pd.DataFrame:
    frames = []
    for rel, sel in _relation_groups(hits):
        if rel == ALL_RELATIONS or rel in exclude or (sel & insample).sum() < min_arcs:
            continue
        frame = _relation_gains(hits.head_hits[sel], hits.offset_hits[sel], folds[sel], hits.sentences[sel],
                                threshold=threshold, n_boot=n_boot, ci=ci, seed=seed,
                                scored_folds=scored_folds)  # fmt: skip
        if frame is not None:
            frames.append(frame.assign(relation=rel))
    columns = ["layer", "head", "relation", "n", "n_sentences", "heldout_accuracy", "heldout_baseline_accuracy",
               "heldout_gain", "ci_low", "ci_high", "se", "p_value"]  # fmt: skip
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def benjamini_hochberg(p_values: np.ndarray, q: float = 0.05) -> np.ndarray:
    """Which hypotheses the Benjamini-Hochberg step-up procedure rejects at false-discovery rate ``q``."""
    p = np.asarray(p_values, dtype=np.float64)
    m = len(p)
    if m == 0:
        return np.zeros(0, dtype=bool)
    order = np.argsort(p, kind="stable")
    passed = p[order] <= q * np.arange(1, m + 1) / m
    rejected = np.zeros(m, dtype=bool)
    if passed.any():
        rejected[order[: int(np.flatnonzero(passed).max()) + 1]] = True
    return rejected


def group_bootstrap_ratio(
    values: np.ndarray, groups: np.ndarray, *, n_boot: int = 1000, ci: float = 0.95, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean over rows of ``values [row, k]`` with a bootstrap over ``groups [row]`` (sentences) resampled whole.

    Returns ``(mean, ci_low, ci_high, se)``, each ``[k]``: the pooled mean (sum / rows) and the percentile
    interval and standard deviation of its bootstrap replicates (``statistics.ratio_with_se``: the shared
    ``probes.bootstrap`` counts).
    """
    from bertscope.experiments.heads.statistics import ratio_with_se

    _, inverse = np.unique(groups, return_inverse=True)
    n_groups = int(inverse.max()) + 1
    sums = np.zeros((n_groups, values.shape[1]))
    np.add.at(sums, inverse, values)
    rows = np.bincount(inverse, minlength=n_groups).astype(np.float64)
    return ratio_with_se(sums, rows, n_boot=n_boot, ci=ci, seed=seed)


# ----------------------------------------------------------------------------------------------- helpers

_TABLE_COLUMNS = [
    "relation",
    "n",
    "n_sentences",
    "heldout_accuracy",
    "heldout_accuracy_low",
    "heldout_accuracy_high",
    "heldout_baseline_accuracy",
    "heldout_gain",
    "heldout_gain_low",
    "heldout_gain_high",
    "layer",
    "head",
    "direction",
    "accuracy",
    "baseline_offset",
    "baseline_accuracy",
    "gain",
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


def _relation_gains(
    head_hits: np.ndarray,
    offset_hits: np.ndarray,
    fold: np.ndarray,
    sentences: np.ndarray,
    *,
    threshold: float,
    n_boot: int,
    ci: float,
    seed: int,
    scored_folds: tuple[int, ...] = (0, 1),
) -> pd.DataFrame | None:
    """Held-out gain of every head on one relation's arcs (``head_hits [arc, layer, head, dir]``, ``offset_hits
    [arc, offset]``, ``fold`` and ``sentences [arc]``); None when neither half can be scored."""
    from scipy.stats import norm

    _, n_layers, n_heads, _ = head_hits.shape
    chosen = np.zeros(head_hits.shape[:3], dtype=np.float64)  # [arc, layer, head]
    base = np.zeros(len(fold), dtype=np.float64)
    scored = np.zeros(len(fold), dtype=bool)
    for f in scored_folds:
        train, test = fold != f, fold == f
        if not (train.any() and test.any()):
            continue
        direction = head_hits[train].mean(0).argmax(-1)  # [layer, head]; ties: dep->head
        chosen[test] = np.take_along_axis(head_hits[test], direction[None, ..., None], -1)[..., 0]
        base[test] = offset_hits[test, int(np.argmax(offset_hits[train].mean(0)))]
        scored |= test
    if not scored.any():
        return None
    sent = sentences[scored]
    flat = chosen[scored].reshape(int(scored.sum()), -1)  # [arc, layer*head]
    values = np.concatenate([flat, base[scored, None], flat - base[scored, None]], axis=1)
    mean, low, high, se = group_bootstrap_ratio(values, sent, n_boot=n_boot, ci=ci, seed=seed)
    k = n_layers * n_heads
    gain, gain_se = mean[k + 1 :], se[k + 1 :]
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (gain - threshold) / gain_se
    p = np.where(gain_se > 0, norm.sf(z), np.where(gain > threshold, 0.0, 1.0))
    layer, head = np.divmod(np.arange(k), n_heads)
    return pd.DataFrame({
        "layer": layer, "head": head, "n": int(scored.sum()), "n_sentences": len(np.unique(sent)),
        "heldout_accuracy": mean[:k], "heldout_baseline_accuracy": mean[k], "heldout_gain": gain,
        "ci_low": low[k + 1 :], "ci_high": high[k + 1 :], "se": gain_se, "p_value": p,
    })  # fmt: skip


def _relation_row(
    rel: str, hits: ArcHits, sel: np.ndarray, folds: np.ndarray, *, n_boot: int, ci: float, seed: int,
    scored_folds: tuple[int, ...] = (0, 1), insample: np.ndarray | None = None,
) -> tuple[dict, dict]:
    head_hits = hits.head_hits[sel]  # [arc, layer, head, dir]
    offset_hits = hits.offset_hits[sel]  # [arc, offset]
    flat = head_hits.reshape(len(head_hits), -1)
    inside = np.ones(len(flat), dtype=bool) if insample is None else insample[sel]  # arcs the in-sample columns read
    best = int(np.argmax(flat[inside].mean(0)))  # ties: first in (layer, head, direction) order
    layer, head, direction = np.unravel_index(best, head_hits.shape[1:])
    best_offset = int(np.argmax(offset_hits[inside].mean(0)))
    fold = folds[sel]
    heldout_head = np.full(len(flat), np.nan)
    heldout_base = np.full(len(flat), np.nan)
    for f in scored_folds:
        train, test = fold != f, fold == f
        if train.any() and test.any():
            heldout_head[test] = flat[test, int(np.argmax(flat[train].mean(0)))]
            heldout_base[test] = offset_hits[test, int(np.argmax(offset_hits[train].mean(0)))]
    scored = np.isfinite(heldout_head)
    sent = hits.sentences[sel]
    summary = _heldout_summary(heldout_head[scored], heldout_base[scored], sent[scored], n_boot=n_boot, ci=ci,
                               seed=seed)  # fmt: skip
    acc = flat[inside, best].mean()
    base = offset_hits[inside, best_offset].mean()
    eval_mode = scored_folds != (0, 1)
    row = {
        "relation": rel,
        "n": int(scored.sum()) if eval_mode else int(sel.sum()),
        "n_sentences": len(np.unique(sent[scored] if eval_mode else sent)),
        **summary,
        "layer": int(layer),
        "head": int(head),
        "direction": DIRECTIONS[int(direction)],
        "accuracy": acc,
        "baseline_offset": BASELINE_OFFSETS[best_offset],
        "baseline_accuracy": base,
        "gain": acc - base,
    }
    if eval_mode:
        row["n_select"] = int(inside.sum())
    parts = {"head": heldout_head[scored], "base": heldout_base[scored], "sent": sent[scored]}
    return row, parts


def _heldout_summary(head: np.ndarray, base: np.ndarray, sent: np.ndarray, *, n_boot: int, ci: float,
                     seed: int) -> dict[str, float]:  # fmt: skip
    """Held-out accuracy, baseline and gain with sentence-bootstrap intervals (NaN when nothing was scored)."""
    keys = ("heldout_accuracy", "heldout_baseline_accuracy", "heldout_gain")
    if len(head) == 0:
        return {k: np.nan for k in (*keys, "heldout_accuracy_low", "heldout_accuracy_high", "heldout_gain_low",
                                    "heldout_gain_high")}  # fmt: skip
    values = np.stack([head, base, head - base], axis=1).astype(np.float64)
    mean, low, high, _ = group_bootstrap_ratio(values, sent, n_boot=n_boot, ci=ci, seed=seed)
    out = dict(zip(keys, mean.tolist(), strict=True))
    out.update(heldout_accuracy_low=low[0], heldout_accuracy_high=high[0], heldout_gain_low=low[2],
               heldout_gain_high=high[2])  # fmt: skip
    return out
