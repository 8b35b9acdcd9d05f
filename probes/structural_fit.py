"""Training structural probes in one batched pass: every site, both kinds and every rank at once.

A *probe* here is one ``(kind, rank)`` pair (``ProbeSpec``); ``fit_probes`` trains each of them at every site of
``Sentences`` (``[n_sites, n_words, d]`` word vectors). The parameters of all probes of a site sit side by side in
one matrix ``W`` (``[n_sites, d, C]``, ``C`` = the sum of the ranks), so one step is one batched matrix product
``[sites, words, d] x [sites, d, C]`` and its transpose. The loss is the sum of the probes' losses and Adam is
element-wise, so each probe's gradient, moments, learning rate and early stopping are its own: each probe is
exactly the one it would be trained alone with the same seed (tested).

Regimen (john-hewitt/structural-probes, ``regimen.py`` and the configs): ``B ~ U(-0.05, 0.05)``; Adam lr 1e-3;
batches of 20 sentences shuffled each epoch; after each epoch the learning rate is multiplied by 0.1 when the
dev loss did not improve (``ReduceLROnPlateau(factor=0.1, patience=0)``, relative threshold 1e-4); the
parameters of the best dev epoch are kept (an improvement must exceed ``tol``) and training stops when the best
epoch is more than ``patience`` epochs old, or at ``max_epochs``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from einops import einsum

KINDS = ("distance", "depth")


@dataclass(frozen=True)
class ProbeSpec:
    """One probe trained at every site: ``kind`` (``"distance"`` or ``"depth"``) and ``rank`` (None: full)."""

    kind: str = "distance"
    rank: int | None = None


@dataclass(frozen=True)
class Regimen:
    """The training regimen (defaults: the paper's, except ``max_epochs``, set high enough that probes stop
    early; the paper's configs have 40)."""

    lr: float = 1e-3
    batch_size: int = 20
    max_epochs: int = 100
    patience: int = 4
    lr_decay: float = 0.1
    tol: float = 1e-4
    init_scale: float = 0.05
    seed: int = 0


@dataclass
class FitResult:
    """One probe's result at every site: ``proj`` ``[n_sites, d, k]`` (best dev epoch), ``best_epoch``,
    ``n_epochs`` (epochs trained before it stopped), ``early_stopped`` (False: ``max_epochs`` reached first),
    ``dev_loss`` (best), each ``[n_sites]``, and ``history`` (per epoch: ``[n_sites]`` train and dev loss)."""

    spec: ProbeSpec
    proj: torch.Tensor
    best_epoch: np.ndarray
    n_epochs: np.ndarray
    early_stopped: np.ndarray
    dev_loss: np.ndarray
    history: list[dict[str, np.ndarray]]


# ----------------------------------------------------------------------------------------------- sentences


def tree_distances(heads: Sequence[int]) -> np.ndarray:
    """``[n, n]`` number of edges between every two words: ``depth_i + depth_j - 2 depth_lca``. ``heads``:
    CoNLL-U heads (1-based, 0 = root), one per word, forming one tree."""
    anc = ancestors(heads)
    depth = anc.sum(1) - 1
    common = anc @ anc.T  # ancestors shared = depth of the lowest common ancestor + 1
    return depth[:, None] + depth[None, :] - 2 * (common - 1)


def tree_depths(heads: Sequence[int]) -> np.ndarray:
    """``[n]`` edges from each word to the root word (the root word has depth 0)."""
    return ancestors(heads).sum(1) - 1


def ancestors(heads: Sequence[int]) -> np.ndarray:
    """``[n, n]`` 0/1: ``A[i, a] = 1`` when word ``a`` is word ``i`` or one of its ancestors."""
    heads = np.asarray(heads, dtype=np.int64)
    n = len(heads)
    anc = np.eye(n, dtype=np.int64)
    cur = np.arange(n)
    for _ in range(n):  # walk every word up one step at a time
        nxt = np.where(cur >= 0, heads[cur.clip(0)] - 1, -1)
        live = nxt >= 0
        if not live.any():
            break
        anc[np.flatnonzero(live), nxt[live]] = 1
        cur = nxt
    return anc


class Sentences:
    """Sentences packed once for training and prediction: ``words`` ``[n_sites, n_words_total, d]`` (float32,
    sentence after sentence), ``lengths`` ``[n_sent]``, and the gold targets computed once and padded:
    ``distances`` ``[n_sent, n_max, n_max]``, ``depths`` ``[n_sent, n_max]`` (-1 = padding)."""

    def __init__(self, words: Any, lengths: Sequence[int], trees: Sequence[Sequence[int]] | None,
                 device: torch.device | str = "cpu") -> None:
        self.words = torch.as_tensor(words, dtype=torch.float32).to(device)
        if self.words.ndim != 3:
            raise ValueError(f"words must be [n_sites, n_words_total, d], got {tuple(self.words.shape)}")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)])
        if self.offsets[-1] != self.words.shape[1]:
            raise ValueError(f"{self.words.shape[1]} word vectors but the lengths add up to {self.offsets[-1]}")
        self.n_sent, self.n_sites, self.d = len(self.lengths), self.words.shape[0], self.words.shape[2]
        self.device = self.words.device
        if trees is None:
            return
        if len(trees) != self.n_sent:
            raise ValueError(f"{self.n_sent} sentences of vectors but {len(trees)} trees")
        n_max = int(self.lengths.max(initial=1))
        dist = np.full((self.n_sent, n_max, n_max), -1.0, dtype=np.float32)
        depth = np.full((self.n_sent, n_max), -1.0, dtype=np.float32)
        for i, h in enumerate(trees):
            n = len(h)
            if n != self.lengths[i]:
                raise ValueError(f"sentence {i}: {self.lengths[i]} word vectors do not match its {n} heads")
            dist[i, :n, :n] = tree_distances(h)
            depth[i, :n] = tree_depths(h)
        self.distances = torch.as_tensor(dist, device=self.device)
        self.depths = torch.as_tensor(depth, device=self.device)

    @classmethod
    def from_list(cls, X: Sequence[Any], trees: Sequence[Sequence[int]] | None,
                  device: torch.device | str = "cpu") -> Sentences:
        """From per-sentence ``[n_words, d]`` (one site) or ``[n_sites, n_words, d]`` arrays."""
        if not len(X):
            raise ValueError("no sentences")
        mats = [torch.as_tensor(x, dtype=torch.float32) for x in X]
        mats = [m[None] if m.ndim == 2 else m for m in mats]
        if any(m.ndim != 3 or m.shape[0] != mats[0].shape[0] or m.shape[2] != mats[0].shape[2] for m in mats):
            raise ValueError("give every sentence as [n_words, d] or [n_sites, n_words, d] with the same sites "
                             "and dimension")
        return cls(torch.cat(mats, dim=1), [m.shape[1] for m in mats], trees, device)

    def layout(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, int]:
        """For the sentences ``rows``: their words' indices ``[n_batch_words]`` and, for each sentence and
        position, the row of that word among them (``[batch, n_max]``, ``n_batch_words`` = padding)."""
        lengths = self.lengths[rows]
        n_max = int(lengths.max())
        flat = np.concatenate([np.arange(self.offsets[i], self.offsets[i + 1]) for i in rows])
        starts = np.cumsum(lengths) - lengths
        pos = np.arange(n_max)[None, :]
        padded = np.where(pos < lengths[:, None], starts[:, None] + pos, len(flat))
        return (torch.as_tensor(flat, device=self.device), torch.as_tensor(padded, device=self.device), n_max)

    def project(self, rows: np.ndarray, weight: torch.Tensor, sites: torch.Tensor | None) -> torch.Tensor:
        """``B^T h`` for the words of ``rows`` at ``sites`` (None: all), padded: ``[sites, batch, n_max, C]``
        (zeros at padding). ``weight``: ``[sites, d, C]``."""
        flat, padded, _ = self.layout(rows)
        x = self.words[:, flat] if sites is None else self.words[sites[:, None], flat[None, :]]
        t = torch.bmm(x, weight)  # [sites, batch words, C]
        t = torch.cat([t, t.new_zeros(t.shape[0], 1, t.shape[2])], dim=1)
        return t[:, padded]


def squared(t: torch.Tensor, kind: str) -> torch.Tensor:
    """``t``: ``[..., n, k]`` projected words -> squared distances ``[..., n, n]`` or squared norms ``[..., n]``."""
    sq = (t**2).sum(-1)
    if kind == "depth":
        return sq
    gram = einsum(t, t, "... i k, ... j k -> ... i j")
    return (sq[..., :, None] + sq[..., None, :] - 2 * gram).clamp_min(0)


def batch_loss(sent: Sentences, rows: np.ndarray, weight: torch.Tensor, sites: torch.Tensor | None,
               specs: Sequence[ProbeSpec], blocks: Sequence[slice]) -> torch.Tensor:
    """Mean over the sentences ``rows`` of each probe's length-normalised L1 loss: ``[sites, n_probes]``.

    Distance: ``sum_ij |d_pred - d_gold| / n^2``; depth: ``sum_i |n_pred - n_gold| / n`` (``loss.py``)."""
    t = sent.project(rows, weight, sites)  # [s, b, n, C]
    n = t.shape[2]
    lengths = torch.as_tensor(sent.lengths[rows], dtype=t.dtype, device=t.device)
    out = []
    sizes = [b.stop - b.start for b in blocks]
    if blocks[0].start != 0 or sum(sizes) != t.shape[-1]:
        raise ValueError("blocks must cover the parameter's columns in order")
    # one split, not a slice per probe: a slice's backward fills a full-size zero tensor per probe
    for spec, part in zip(specs, t.split(sizes, dim=-1), strict=True):
        pred = squared(part, spec.kind)
        if spec.kind == "distance":
            gold = sent.distances[rows, :n, :n]
            err = ((pred - gold).abs() * (gold >= 0)).sum((-1, -2)) / lengths**2
        else:
            gold = sent.depths[rows, :n]
            err = ((pred - gold).abs() * (gold >= 0)).sum(-1) / lengths
        out.append(err.mean(-1))
    return torch.stack(out, dim=-1)


# ------------------------------------------------------------------------------------------------- fitting


def fit_probes(train: Sentences, dev: Sentences, specs: Sequence[ProbeSpec],
               regimen: Regimen = Regimen()) -> list[FitResult]:
    """Train every probe of ``specs`` at every site of ``train`` in one pass, early-stopped on ``dev``;
    returns one `FitResult` per spec (in order). Each epoch trains only the sites and probe columns still
    active somewhere. (Longer than 60 lines: the epoch loop and its per-probe bookkeeping read best as one.)"""
    if dev.n_sites != train.n_sites or dev.d != train.d:
        raise ValueError("dev vectors must have the training vectors' sites and dimension")
    if train.n_sent < 1 or dev.n_sent < 1:
        raise ValueError("need at least one training and one dev sentence")
    for spec in specs:
        if spec.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {spec.kind!r}")
    S, d, P, reg = train.n_sites, train.d, len(specs), regimen
    ranks = [d if s.rank is None else s.rank for s in specs]
    edges = np.concatenate([[0], np.cumsum(ranks)])
    blocks = [slice(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    col_probe = torch.as_tensor(np.repeat(np.arange(P), ranks), device=train.device)  # probe of each column
    inits = [(torch.rand(d, k, generator=torch.Generator().manual_seed(int(reg.seed))) * 2 - 1) * reg.init_scale
             for k in ranks]  # each probe starts as it would alone, the same at every site
    weight = torch.cat(inits, dim=1).expand(S, -1, -1).contiguous().to(train.device)  # [S, d, C]
    adam = _Adam(weight, reg.lr)
    best = weight.clone()
    lr = np.full((S, P), reg.lr)
    best_loss, best_epoch = np.full((S, P), np.inf), np.full((S, P), -1)
    sched_best, active = np.full((S, P), np.inf), np.ones((S, P), dtype=bool)
    n_epochs = np.zeros((S, P), dtype=np.int64)
    history: list[dict[str, np.ndarray]] = []
    order_gen = torch.Generator().manual_seed(int(reg.seed) + 1)
    for epoch in range(reg.max_epochs):
        live = np.flatnonzero(active.any(1))  # sites still training at least one probe
        probes = np.flatnonzero(active.any(0))  # probes still training at one site at least
        sites = None if len(live) == S else torch.as_tensor(live, device=train.device)
        cols = None if len(probes) == P else torch.as_tensor(
            np.concatenate([np.arange(blocks[p].start, blocks[p].stop) for p in probes]), device=train.device)
        sub_specs = [specs[p] for p in probes]
        sub_edges = np.concatenate([[0], np.cumsum([ranks[p] for p in probes])])
        sub_blocks = [slice(int(a), int(b)) for a, b in zip(sub_edges[:-1], sub_edges[1:], strict=True)]
        adam.lr = torch.as_tensor(lr, dtype=torch.float32, device=train.device)[:, col_probe][:, None, :]
        perm = torch.randperm(train.n_sent, generator=order_gen).numpy()
        train_loss = np.zeros((S, P))
        for start in range(0, train.n_sent, reg.batch_size):
            rows = perm[start : start + reg.batch_size]
            sub = _take(weight, sites, cols).detach().requires_grad_(True)
            loss = batch_loss(train, rows, sub, sites, sub_specs, sub_blocks)
            (grad,) = torch.autograd.grad(loss.sum(), sub)
            adam.step(sites, cols, grad)
            train_loss[np.ix_(live, probes)] += loss.detach().cpu().numpy() * len(rows)
        dev_loss = np.full((S, P), np.nan)
        dev_loss[np.ix_(live, probes)] = _mean_loss(dev, _take(weight, sites, cols), sites, sub_specs, sub_blocks)
        n_epochs[active] = epoch + 1
        history.append({"train_loss": train_loss / train.n_sent, "dev_loss": dev_loss, "active": active.copy()})
        improved_sched = active & (dev_loss < sched_best * (1 - reg.tol))  # ReduceLROnPlateau(patience=0)
        sched_best = np.where(improved_sched, dev_loss, sched_best)
        lr = np.where(active & ~improved_sched, lr * reg.lr_decay, lr)
        improved = active & (dev_loss < best_loss - reg.tol)
        best_loss = np.where(improved, dev_loss, best_loss)
        best_epoch = np.where(improved, epoch, best_epoch)
        cols = torch.as_tensor(improved, device=train.device)[:, col_probe][:, None, :]
        best = torch.where(cols, weight, best)
        active &= ~(~improved & (best_epoch < epoch - reg.patience))
        if not active.any():
            break
    return [FitResult(spec, best[..., blocks[p]].clone(), best_epoch[:, p], n_epochs[:, p],
                      n_epochs[:, p] < reg.max_epochs, best_loss[:, p],
                      [{k: h[k][:, p] for k in ("train_loss", "dev_loss")} for h in history])
            for p, spec in enumerate(specs)]


def _take(weight: torch.Tensor, sites: torch.Tensor | None, cols: torch.Tensor | None) -> torch.Tensor:
    """``weight[sites][:, :, cols]`` (None: all) -> ``[n_sites_taken, d, n_cols_taken]``."""
    w = weight if sites is None else weight[sites]
    return w if cols is None else w[:, :, cols]


def _mean_loss(sent: Sentences, w: torch.Tensor, sites: torch.Tensor | None, specs: Sequence[ProbeSpec],
               blocks: Sequence[slice], chunk: int = 40) -> np.ndarray:
    """``[sites, n_probes]`` mean loss over all sentences of ``sent`` (no gradient); ``w``: the sites' and
    probes' columns of the parameter."""
    total = torch.zeros(w.shape[0], len(specs), device=w.device)
    with torch.no_grad():
        for start in range(0, sent.n_sent, chunk):
            rows = np.arange(start, min(start + chunk, sent.n_sent))
            total += batch_loss(sent, rows, w, sites, specs, blocks) * len(rows)
    return (total / sent.n_sent).cpu().numpy()


def project_all(sent: Sentences, proj: torch.Tensor) -> list[torch.Tensor]:
    """Per sentence ``[n_sites, n_words, k]``: every word projected by ``proj`` (``[n_sites, d, k]``) in one
    product."""
    t = torch.bmm(sent.words, proj.to(sent.device, torch.float32))
    return list(torch.split(t, sent.lengths.tolist(), dim=1))


class _Adam:
    """Adam (torch's defaults: betas 0.9, 0.999, eps 1e-8) on ``param`` ``[n_sites, d, C]`` with a learning
    rate per site and column (``lr``: ``[n_sites, 1, C]``); ``step(sites, grad)`` updates the given sites
    (None: all). Written out rather than ``torch.optim.Adam`` for the per-column rates and site subsets."""

    def __init__(self, param: torch.Tensor, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.param, self.betas, self.eps = param, betas, eps
        self.lr = torch.full((param.shape[0], 1, param.shape[2]), lr, dtype=param.dtype, device=param.device)
        self.m, self.v = torch.zeros_like(param), torch.zeros_like(param)
        self.t = 0

    @torch.no_grad()
    def step(self, sites: torch.Tensor | None, cols: torch.Tensor | None, grad: torch.Tensor) -> None:
        """One update of ``param[sites][:, :, cols]`` (None: all) with ``grad`` (``[n_sites, d, n_cols]``).
        Every entry stepped shares the step count (an entry left out belongs to a probe that has stopped for
        good at every site it is left out of)."""
        b1, b2 = self.betas
        self.t += 1
        bc1, bc2 = 1 - b1**self.t, 1 - b2**self.t
        if sites is None and cols is None:
            m, v, p, lr = self.m, self.v, self.param, self.lr
            m.mul_(b1).add_(grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
            p.sub_(lr * (m / bc1) / ((v / bc2).sqrt_().add_(self.eps)))
            return
        n_sites, n_cols = self.param.shape[0], self.param.shape[2]
        s = torch.arange(n_sites, device=grad.device) if sites is None else sites
        c = torch.arange(n_cols, device=grad.device) if cols is None else cols
        idx = (s[:, None], slice(None), c[None, :])  # advanced indices around a slice: [n_sites, n_cols, d]
        g = grad.permute(0, 2, 1)
        m = self.m[idx].mul_(b1).add_(g, alpha=1 - b1)
        v = self.v[idx].mul_(b2).addcmul_(g, g, value=1 - b2)
        self.m[idx], self.v[idx] = m, v
        self.param[idx] -= self.lr[idx] * (m / bc1) / ((v / bc2).sqrt() + self.eps)


__all__ = ["FitResult", "ProbeSpec", "Regimen", "Sentences", "batch_loss", "fit_probes", "project_all", "squared",
           "tree_depths", "tree_distances"]
