"""Measures of the erasure experiment, on arrays: word-level labels, activation collection under hooks, probe
accuracy with paired sentence-bootstrap intervals, structural-probe UUAS/DSpr, sentence-embedding change.

Every interval is a group bootstrap over evaluation sentences (`bertscope.probes.bootstrap`): it covers the
choice of sentences, not the training of the probes or erasers (fixed once, on the training sentences).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from bertscope.probes import control_labels
from bertscope.probes.bootstrap import group_bootstrap, ratio_of_sums
from bertscope.probes.structural import length_macro_mean, spearman_parts, tree_depths, uuas_counts

#: Concepts a word carries, as labels per word (position and depth capped: see `word_labels`).
CONCEPTS = ("position", "upos", "xpos", "deprel", "depth")


def word_labels(sentences: Sequence[Any], concept: str, *, max_position: int, max_depth: int) -> np.ndarray:
    """Per word of the sentences, flat [n_words] strings: "position" (0-based word index, ``>= max_position``
    pooled), "upos", "xpos", "deprel" (universal relation: subtypes such as ``nmod:poss`` -> ``nmod``), "depth"
    (edges to the root, ``>= max_depth`` pooled)."""
    out: list[str] = []
    for s in sentences:
        if concept == "position":
            out += [str(min(i, max_position)) for i in range(len(s))]
        elif concept == "depth":
            out += [str(min(int(d), max_depth)) for d in tree_depths(s.heads)]
        elif concept == "deprel":
            out += [r.split(":")[0] for r in s.deprels]
        elif concept in ("upos", "xpos"):
            tags = getattr(s, concept)
            if tags is None:
                raise ValueError(f"sentence {s.id!r} has no {concept.upper()} tags")
            out += list(tags)
        else:
            raise ValueError(f"unknown concept {concept!r}; choose from {CONCEPTS}")
    return np.asarray(out)


def label_ids(train: np.ndarray, other: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Integer ids from the training labels' classes; labels unseen in training get id ``k`` (never predicted,
    so they count as errors). Returns (train ids, other ids, k)."""
    classes = {c: i for i, c in enumerate(np.unique(train))}
    k = len(classes)
    return (np.array([classes[c] for c in train]), np.array([classes.get(c, k) for c in other]), k)


# ------------------------------------------------------------------------------------------------ collection
@dataclass
class Activations:
    """What one pass over the sentences leaves: word vectors per site ``{site: [n_words, d]}`` (corpus order,
    mean of each word's pieces), piece vectors at some sites ``{site: [n_pieces, d]}`` with the flat word index of
    each piece ``piece_word`` [n_pieces], the pooled sentence embedding [n_sent, d] (mean of the last hidden state
    over real tokens, sentence-transformers' pooling), and masked-LM hits/counts per sentence (or None)."""

    words: dict[str, np.ndarray]
    pieces: dict[str, np.ndarray]
    piece_word: np.ndarray
    embedding: np.ndarray
    mlm: tuple[np.ndarray, np.ndarray] | None


@torch.no_grad()
def collect(model: Any, encoded: Any, sites: Sequence[str], n_words: Sequence[int], *,
            hooks: Sequence[tuple[str, Callable]] = (), pieces_at: Sequence[str] = (),
            mlm_every: int = 0, corpus: Sequence[Any] | None = None, capture: Any = None) -> Activations:
    """Run ``model`` over ``encoded``'s batches with ``hooks`` in place (e.g. an erasure) and keep word vectors at
    ``sites`` and piece vectors at ``pieces_at``. ``n_words``: words per sentence (truncated sentences must have
    been left out). ``mlm_every`` > 0 and a masked-LM head: every ``mlm_every``-th word piece is masked in a
    second pass (same hooks) and the head's top-1 accuracy on those pieces is kept per sentence.

    Activations come through the activations stage (`experiments.activations.batch_activations`): a forward of
    ``model`` with ``hooks`` in place, or, for a clean pass (no hooks), ``capture`` (a `CaptureSource`, e.g.
    ``--activations``; ``corpus``: the sentences ``encoded`` encodes). The pooled embedding is the last block's
    output (through the final LayerNorm of pre-LN models), as the forward's own output."""
    from bertscope.experiments.activations import batch_activations, pool_words

    if capture is not None and hooks:
        raise ValueError("a capture holds clean activations: an intervention's run needs the forward (capture=None)")
    device = next(model.parameters()).device
    offsets = np.concatenate([[0], np.cumsum(n_words)]).astype(np.int64)
    sites = list(dict.fromkeys([*sites, *pieces_at]))
    last_site = f"blocks.{model.config.n_layers - 1}.hook_resid_post"
    final_norm = getattr(model, "ln_final", None)
    d = model.config.d_model
    words = torch.zeros(len(sites), int(offsets[-1]), d, dtype=torch.float32, device=device)
    pieces: dict[str, list[np.ndarray]] = {s: [] for s in pieces_at}
    piece_word: list[np.ndarray] = []
    embedding = np.zeros((len(n_words), d), dtype=np.float32)
    mlm_hits, mlm_count = np.zeros(len(n_words)), np.zeros(len(n_words))
    use_mlm = mlm_every > 0 and getattr(model, "mlm_head", None) is not None
    with model.hooks(list(hooks)):
        for batch in encoded:
            if any(batch.n_words[r] != n_words[si] for r, si in enumerate(batch.sentence_index)):
                raise ValueError("a sentence was truncated; leave truncated sentences out")
            ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)
            cache = batch_activations(model, batch, list(dict.fromkeys([*sites, last_site])), corpus=corpus,
                                      capture=capture, device=device, stop_early=False)
            last = cache[last_site] if final_norm is None else final_norm(cache[last_site])
            real = mask.unsqueeze(-1).float()
            embedding[batch.sentence_index] = ((last.float() * real).sum(1) / real.sum(1)).cpu().numpy()
            wid = batch.word_ids.to(device)
            start = torch.as_tensor(offsets[batch.sentence_index], device=device)[:, None]
            keep = (wid >= 0).reshape(-1)
            flat_word = (start + wid).reshape(-1)[keep]  # global word index of every word piece
            stacked = torch.stack([cache[s] for s in sites]).float().reshape(len(sites), -1, d)[:, keep]
            pooled = pool_words({s: cache[s].float() for s in sites}, batch)  # the stage's word pooling
            for r, si in enumerate(batch.sentence_index):
                n = int(n_words[si])
                words[:, offsets[si] : offsets[si] + n] = torch.stack([pooled[s][r, :n] for s in sites])
            for s in pieces_at:
                pieces[s].append(stacked[sites.index(s)].cpu().numpy())
            if pieces_at:
                piece_word.append(flat_word.cpu().numpy())
            if use_mlm:
                _mlm(model, batch, ids, mask, mlm_every, mlm_hits, mlm_count)
    mean = words.cpu().numpy()
    return Activations(
        words={s: mean[i] for i, s in enumerate(sites)},
        pieces={s: np.concatenate(v) for s, v in pieces.items()},
        piece_word=np.concatenate(piece_word) if piece_word else np.zeros(0, dtype=np.int64),
        embedding=embedding,
        mlm=(mlm_hits, mlm_count) if use_mlm else None,
    )


def _mlm(model: Any, batch: Any, ids: torch.Tensor, mask: torch.Tensor, every: int, hits: np.ndarray,
         count: np.ndarray) -> None:
    """Mask every ``every``-th word piece of each row (the same pieces in every run), add the head's top-1 hits."""
    word = batch.word_ids.to(ids.device) >= 0
    rank = torch.cumsum(word.long(), dim=1)
    chosen = word & (rank % every == 0)
    masked = torch.where(chosen, torch.full_like(ids, model.tokenizer.mask_token_id), ids)
    logits = model.mlm_logits(model(masked, mask))
    right = (logits.argmax(-1) == ids) & chosen
    hits[batch.sentence_index] += right.sum(1).cpu().numpy()
    count[batch.sentence_index] += chosen.sum(1).cpu().numpy()


# ------------------------------------------------------------------------------------------------ probes
class RidgeProbe:
    """Linear probe for classes in closed form: ridge regression of the one-hot labels on the standardised vectors
    (``(XᵀX + α n I)⁻¹ Xᵀ Y``, an intercept unpenalised), predicting the arg-max. Chosen over a logistic probe for
    its cost (one solve per site for every concept); its coefficients are ``Σ_xx⁻¹ Σ_xz``, so after LEACE
    (``Σ_xz = 0``) it predicts the training majority class everywhere, exactly."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha

    def fit(self, x: np.ndarray, y: np.ndarray) -> RidgeProbe:
        """Fit on ``x`` [n, d] and integer labels ``y`` [n] (classes 0..max)."""
        return fit_probes(x, [y], alpha=self.alpha)[0]

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Class ids [n]."""
        xs = (np.asarray(x, dtype=np.float64) - self.mean_) / self.scale_
        return np.argmax(xs @ self.coef_ + self.intercept_, axis=1)


def fit_probes(x: np.ndarray, ys: Sequence[np.ndarray], *, alpha: float) -> list[RidgeProbe]:
    """One `RidgeProbe` per label vector in ``ys``, all on ``x`` [n, d]: one factorisation serves them all."""
    x = np.asarray(x, dtype=np.float64)
    mean, scale = x.mean(0), x.std(0)
    scale[scale < 1e-12] = 1.0
    xs = (x - mean) / scale
    chol = np.linalg.cholesky(xs.T @ xs + alpha * len(x) * np.eye(x.shape[1]))
    out = []
    for y in ys:
        onehot = np.eye(int(np.max(y)) + 1)[y]
        rhs = xs.T @ (onehot - onehot.mean(0))
        probe = RidgeProbe(alpha)
        probe.mean_, probe.scale_, probe.intercept_ = mean, scale, onehot.mean(0)
        probe.coef_ = np.linalg.solve(chol.T, np.linalg.solve(chol, rhs))
        out.append(probe)
    return out


def fit_probe(x: np.ndarray, y: np.ndarray, *, alpha: float, seed: int = 0) -> RidgeProbe:
    """The experiment's word-level probe (`RidgeProbe`) at a fixed ``alpha`` (nothing is selected on the
    evaluation sentences). ``seed`` is unused (the fit is deterministic)."""
    return RidgeProbe(alpha).fit(x, y)


def sentence_hits(pred: np.ndarray, y: np.ndarray, sentence_of_word: np.ndarray, n_sent: int) -> np.ndarray:
    """Correct predictions per sentence [n_sent]."""
    return np.bincount(sentence_of_word, weights=(pred == y).astype(np.float64), minlength=n_sent)


def accuracy_with_change(hits: np.ndarray, clean_hits: np.ndarray, n_words: np.ndarray, *, n_boot: int,
                         seed: int, level: float) -> dict[str, float]:
    """Accuracy (hits / words) and its change from the clean run, each with a paired group-bootstrap interval
    over sentences (the same resamples for both)."""
    acc = ratio_of_sums(hits, n_words, n_boot=n_boot, level=level, seed=seed)
    delta = ratio_of_sums(hits - clean_hits, n_words, n_boot=n_boot, level=level, seed=seed)
    return {"value": float(acc.value), "ci_low": float(acc.low), "ci_high": float(acc.high),
            "delta": float(delta.value), "delta_ci_low": float(delta.low), "delta_ci_high": float(delta.high)}


def control_task(types_train: np.ndarray, types_eval: np.ndarray, y_train: np.ndarray, *, seed: int,
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Hewitt & Liang control labels for the training and evaluation words: one fixed random label per word
    type (lower-cased form) of either split, drawn from the training label distribution. Returns (train labels,
    eval labels)."""
    types = np.concatenate([types_train, types_eval])
    rng = np.random.default_rng(seed)
    y = np.concatenate([y_train, rng.choice(y_train, len(types_eval))])  # the training distribution, both splits
    control = control_labels(types, y, seed=seed)
    return control[: len(types_train)], control[len(types_train):]


# ------------------------------------------------------------------------------------------------ structure
def split_words(x: np.ndarray, lengths: Sequence[int]) -> list[np.ndarray]:
    """Flat word rows [n_words, ...] -> per sentence [n_i, ...]."""
    return np.split(x, np.cumsum(lengths)[:-1])


def structural_scores(pred: list[np.ndarray], heads: list, punct: list, *, n_boot: int, seed: int,
                      level: float) -> dict[str, tuple[float, float, float]]:
    """UUAS (micro, punctuation excluded) and DSpr (per length 5-50, macro) of predicted squared distances
    ``pred`` (per sentence [..., n, n]), each ``(value, low, high)`` over a sentence bootstrap."""
    correct, total = uuas_counts(pred, heads, punct)
    u = ratio_of_sums(np.moveaxis(np.atleast_2d(correct), -1, 0), total[:, None], n_boot=n_boot, level=level,
                      seed=seed)
    t, c, length = spearman_parts(pred, heads, "distance")
    t = np.atleast_2d(t)
    d = group_bootstrap(lambda w: np.moveaxis(length_macro_mean(t, c, length, weights=w), -1, 0),
                        len(heads), n_boot=n_boot, level=level, seed=seed)
    return {"uuas": (u.value, u.low, u.high), "dspr": (d.value, d.low, d.high)}


# ------------------------------------------------------------------------------------------------ embeddings
def embedding_change(clean: np.ndarray, erased: np.ndarray, *, n_boot: int, seed: int, level: float,
                     ) -> dict[str, tuple[float, float, float]]:
    """Cosine of each sentence's erased embedding to its clean one (mean over sentences), and the Spearman
    correlation between the clean and erased pairwise cosine similarities of the sentences (over all pairs;
    the bootstrap resamples sentences and scores the pairs of distinct resampled sentences)."""
    def unit(a: np.ndarray) -> np.ndarray:
        return a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)

    cu, eu = unit(clean.astype(np.float64)), unit(erased.astype(np.float64))
    cos = (cu * eu).sum(1)
    c = ratio_of_sums(cos, np.ones_like(cos), n_boot=n_boot, level=level, seed=seed)
    sim_c, sim_e = cu @ cu.T, eu @ eu.T
    n = len(cos)
    iu = np.triu_indices(n, 1)
    rng = np.random.default_rng(seed)
    value = _spearman(sim_c[iu], sim_e[iu])
    reps = []
    for _ in range(min(n_boot, 200)):  # a [n, n] matrix per resample: fewer resamples than the cheap measures
        pick = np.unique(rng.integers(0, n, n))
        a, b = np.triu_indices(len(pick), 1)
        reps.append(_spearman(sim_c[pick[a], pick[b]], sim_e[pick[a], pick[b]]))
    lo, hi = (np.nanquantile(reps, [(1 - level) / 2, (1 + level) / 2]) if reps else (np.nan, np.nan))
    return {"embedding_cosine": (float(c.value), float(c.low), float(c.high)),
            "similarity_spearman": (float(value), float(lo), float(hi))}


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic) if len(a) > 2 else float("nan")
