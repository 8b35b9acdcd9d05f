"""Training structural probes in one batched pass: every site, both kinds and every rank at once.

A *probe* here is one ``(kind, rank)`` pair (``ProbeSpec``); ``fit_probes`` trains each of them at every site of
``Sentences`` (``[n_sites, n_words, d]`` word vectors). Each probe holds one parameter ``[n_sites, d, k]``, so one
step of a probe is one batched matrix product ``[sites, words, d] x [sites, d, k]`` over the sites it still trains
at, and its transpose for the gradient (written out: `Batch.loss_grad`). Each probe's gradient, Adam moments,
learning rate and early stopping are its own at every site: each probe is exactly the one it would be trained
alone with the same seed (tested).

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

    def layout(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """For the sentences ``rows``: their words' indices ``[n_batch_words]``; for each sentence and position
        the row of that word among them (``[batch, n_max]``, ``n_batch_words`` = padding); and for each of the
        words its place in the flattened ``[batch * n_max]`` padded grid (the inverse of the previous map)."""
        lengths = self.lengths[rows]
        n_max = int(lengths.max())
        flat = np.concatenate([np.arange(self.offsets[i], self.offsets[i + 1]) for i in rows])
        starts = np.cumsum(lengths) - lengths
        pos = np.arange(n_max)[None, :]
        inside = pos < lengths[:, None]
        padded = np.where(inside, starts[:, None] + pos, len(flat))
        grid = np.flatnonzero(inside.ravel())  # row-major: sentence after sentence, word after word = flat order
        return (torch.as_tensor(flat, device=self.device), torch.as_tensor(padded, device=self.device),
                torch.as_tensor(grid, device=self.device), n_max)

    def take(self, flat: torch.Tensor, sites: torch.Tensor | None) -> torch.Tensor:
        """The word vectors ``flat`` at ``sites`` (None: all): ``[n_sites, n_flat, d]``."""
        return self.words[:, flat] if sites is None else self.words[sites[:, None], flat[None, :]]


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
    ``weight``: ``[sites, d, C]``, the probes side by side in the column ``blocks``.

    Distance: ``sum_ij |d_pred - d_gold| / n^2``; depth: ``sum_i |n_pred - n_gold| / n`` (``loss.py``)."""
    batch = Batch(sent, rows)
    (x,) = _at(sites, batch.x)
    return torch.stack([batch.loss_grad(x, weight[..., blk], spec.kind, grad=False)[0]
                        for spec, blk in zip(specs, _check_blocks(blocks, weight), strict=True)], dim=-1)


def batch_loss_grad(sent: Sentences, rows: np.ndarray, weight: torch.Tensor, sites: torch.Tensor | None,
                    specs: Sequence[ProbeSpec], blocks: Sequence[slice]) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch_loss` ``[sites, n_probes]`` and the gradient of its sum with respect to ``weight``
    (``[sites, d, C]``), in closed form (`Batch.loss_grad`)."""
    batch = Batch(sent, rows)
    (x,) = _at(sites, batch.x)
    out = [batch.loss_grad(x, weight[..., blk], spec.kind, grad=True)
           for spec, blk in zip(specs, _check_blocks(blocks, weight), strict=True)]
    return torch.stack([o[0] for o in out], dim=-1), torch.cat([o[1] for o in out], dim=-1)


def _check_blocks(blocks: Sequence[slice], weight: torch.Tensor) -> Sequence[slice]:
    sizes = [b.stop - b.start for b in blocks]
    if blocks[0].start != 0 or sum(sizes) != weight.shape[-1]:
        raise ValueError("blocks must cover the parameter's columns in order")
    return blocks


class Batch:
    """One batch of sentences ``rows`` of ``sent``, laid out once for every probe and site: ``x`` the words at
    every site ``[n_sites, n_words, d]``, the padded layout, and the gold distances and depths with their masks
    and length normalisers."""

    def __init__(self, sent: Sentences, rows: np.ndarray) -> None:
        flat, padded, self.grid, self.n = sent.layout(rows)
        self.b = len(rows)
        self.x = sent.take(flat, None)
        self.padded = padded.clamp_max(len(flat) - 1).flatten()  # padding copies a real row; the masks zero it
        lengths = torch.as_tensor(sent.lengths[rows], dtype=torch.float32, device=sent.device)
        n = self.n
        self.gold_d, self.gold_n = sent.distances[rows, :n, :n], sent.depths[rows, :n]
        self.mask_d, self.mask_n = self.gold_d >= 0, self.gold_n >= 0
        self.scale_d, self.scale_n = 1 / lengths[:, None, None] ** 2, 1 / lengths[:, None]

    def loss_grad(self, x: torch.Tensor, weight: torch.Tensor, kind: str,
                  grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One probe's mean loss ``[sites]`` and (``grad``) its gradient ``[sites, d, k]`` with respect to
        ``weight`` (``[sites, d, k]``), ``x`` being ``self.x`` at the same sites.

        With ``T = H B`` a sentence's projected words and ``G = dL/dD`` the loss's (sub)gradient with respect to
        the predicted squared distances ``D_ij = |t_i - t_j|^2`` (``sign(D - D_gold) / (n^2 batch)``),
        ``dL/dT = 2 (diag(S 1) - S) T`` with ``S = G + G^T``; for depths ``N_i = |t_i|^2``,
        ``dL/dt_i = 2 g_i t_i``; then ``dL/dB = H^T dL/dT``. Autograd computes the same (tested) but pays for
        scattering the padded layout back and for every intermediate: here each word's row is gathered once."""
        t = torch.bmm(x, weight).index_select(1, self.padded).unflatten(1, (self.b, self.n))  # [s, b, n, k]
        if kind == "distance":
            gram = t @ t.transpose(-1, -2)  # [s, b, n, n]
            sq = gram.diagonal(dim1=-2, dim2=-1)
            diff = ((sq[..., :, None] + sq[..., None, :] - 2 * gram).clamp_min_(0) - self.gold_d) * self.mask_d
            loss = (diff.abs() * self.scale_d).sum((-1, -2)).mean(-1)
            if not grad:
                return loss, None
            g = diff.sign_().mul_(self.scale_d * (2 / self.b))
            g = g + g.transpose(-1, -2)  # 2 S
            dt = (torch.diag_embed(g.sum(-1)) - g) @ t
        else:
            diff = ((t * t).sum(-1) - self.gold_n) * self.mask_n  # [s, b, n]
            loss = (diff.abs() * self.scale_n).sum(-1).mean(-1)
            if not grad:
                return loss, None
            dt = diff.sign_().mul_(self.scale_n * (2 / self.b))[..., None] * t
        dt = dt.flatten(1, 2).index_select(1, self.grid)  # [s, words, k], the words in x's order
        return loss, torch.bmm(x.transpose(1, 2), dt)


# ------------------------------------------------------------------------------------------------- fitting


def fit_probes(train: Sentences, dev: Sentences, specs: Sequence[ProbeSpec],
               regimen: Regimen = Regimen()) -> list[FitResult]:
    """Train every probe of ``specs`` at every site of ``train`` in one pass, early-stopped on ``dev``;
    returns one `FitResult` per spec (in order). Each step computes only the (site, probe) pairs still
    training: a probe's sites are one batched product, and a pair that stopped costs nothing. (Longer than 60
    lines: the epoch loop and its per-probe bookkeeping read best as one.)"""
    if dev.n_sites != train.n_sites or dev.d != train.d:
        raise ValueError("dev vectors must have the training vectors' sites and dimension")
    if train.n_sent < 1 or dev.n_sent < 1:
        raise ValueError("need at least one training and one dev sentence")
    for spec in specs:
        if spec.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {spec.kind!r}")
    S, d, P, reg = train.n_sites, train.d, len(specs), regimen
    ranks = [d if s.rank is None else s.rank for s in specs]
    weights = [((torch.rand(d, k, generator=torch.Generator().manual_seed(int(reg.seed))) * 2 - 1)
                * reg.init_scale).expand(S, -1, -1).contiguous().to(train.device)
               for k in ranks]  # [S, d, k] per probe: each starts as it would alone, the same at every site
    adams = [_Adam(w) for w in weights]
    best = [w.clone() for w in weights]
    lr = np.full((S, P), reg.lr)
    best_loss, best_epoch = np.full((S, P), np.inf), np.full((S, P), -1)
    sched_best, active = np.full((S, P), np.inf), np.ones((S, P), dtype=bool)
    n_epochs = np.zeros((S, P), dtype=np.int64)
    history: list[dict[str, np.ndarray]] = []
    order_gen = torch.Generator().manual_seed(int(reg.seed) + 1)
    for epoch in range(reg.max_epochs):
        groups = _groups(active, train.device)
        perm = torch.randperm(train.n_sent, generator=order_gen).numpy()
        train_loss = np.zeros((S, P))
        for start in range(0, train.n_sent, reg.batch_size):
            batch = Batch(train, perm[start : start + reg.batch_size])
            for p, sites, live in groups:
                loss, grad = batch.loss_grad(*_at(sites, batch.x, weights[p]), specs[p].kind, grad=True)
                adams[p].step(live, grad, lr[live, p])
                train_loss[live, p] += loss.cpu().numpy() * batch.b
        dev_sum = np.zeros((S, P))
        with torch.no_grad():
            for start in range(0, dev.n_sent, 40):
                batch = Batch(dev, np.arange(start, min(start + 40, dev.n_sent)))
                for p, sites, live in groups:
                    loss = batch.loss_grad(*_at(sites, batch.x, weights[p]), specs[p].kind, grad=False)[0]
                    dev_sum[live, p] += loss.cpu().numpy() * batch.b
        dev_loss = np.where(active, dev_sum / dev.n_sent, np.nan)
        n_epochs[active] = epoch + 1
        history.append({"train_loss": train_loss / train.n_sent, "dev_loss": dev_loss, "active": active.copy()})
        improved_sched = active & (dev_loss < sched_best * (1 - reg.tol))  # ReduceLROnPlateau(patience=0)
        sched_best = np.where(improved_sched, dev_loss, sched_best)
        lr = np.where(active & ~improved_sched, lr * reg.lr_decay, lr)
        improved = active & (dev_loss < best_loss - reg.tol)
        best_loss = np.where(improved, dev_loss, best_loss)
        best_epoch = np.where(improved, epoch, best_epoch)
        for p in np.flatnonzero(improved.any(0)):
            keep = torch.as_tensor(np.flatnonzero(improved[:, p]), device=train.device)
            best[p][keep] = weights[p][keep]
        active &= ~(~improved & (best_epoch < epoch - reg.patience))
        if not active.any():
            break
    return [FitResult(spec, best[p], best_epoch[:, p], n_epochs[:, p], n_epochs[:, p] < reg.max_epochs,
                      best_loss[:, p], [{k: h[k][:, p] for k in ("train_loss", "dev_loss")} for h in history])
            for p, spec in enumerate(specs)]


def _at(sites: torch.Tensor | None, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each of ``tensors`` (``[n_sites, ...]``) at ``sites`` (None: all, without a copy)."""
    return tensors if sites is None else tuple(t[sites] for t in tensors)


def _groups(active: np.ndarray, device: torch.device) -> list[tuple[int, torch.Tensor | None, np.ndarray]]:
    """Per probe still training somewhere: ``(probe, sites, live)``, ``live`` its active sites ``[n]`` and
    ``sites`` the same as a tensor (None: all sites)."""
    out = []
    for p in np.flatnonzero(active.any(0)):
        live = np.flatnonzero(active[:, p])
        out.append((int(p), None if len(live) == active.shape[0] else torch.as_tensor(live, device=device), live))
    return out


def project_all(sent: Sentences, proj: torch.Tensor) -> list[torch.Tensor]:
    """Per sentence ``[n_sites, n_words, k]``: every word projected by ``proj`` (``[n_sites, d, k]``) in one
    product."""
    t = torch.bmm(sent.words, proj.to(sent.device, torch.float32))
    return list(torch.split(t, sent.lengths.tolist(), dim=1))


class _Adam:
    """Adam (torch's defaults: betas 0.9, 0.999, eps 1e-8) on one probe's ``param`` ``[n_sites, d, k]`` with a
    learning rate per site; ``step(sites, grad, lr)`` updates the given sites in place, through torch's fused
    Adam kernel on each site's ``[d, k]`` slice (one call per distinct rate), so a subset of sites costs no
    gather or scatter. Written out rather than ``torch.optim.Adam`` for the per-site rates and site subsets."""

    def __init__(self, param: torch.Tensor, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.param, self.betas, self.eps = param, betas, eps
        self.m, self.v = torch.zeros_like(param), torch.zeros_like(param)
        self.t = torch.zeros((), dtype=torch.float32, device=param.device)  # the step count the kernel reads

    @torch.no_grad()
    def step(self, sites: np.ndarray, grad: torch.Tensor, lr: np.ndarray) -> None:
        """One update of ``param[sites]`` with ``grad`` (``[len(sites), d, k]``) and per-site rates ``lr``
        (``[len(sites)]``). Every site stepped shares the step count (a site left out has stopped for good)."""
        self.t += 1
        for rate in np.unique(lr):
            idx = np.flatnonzero(lr == rate)
            at = [int(sites[i]) for i in idx]
            torch._fused_adam_([self.param[s] for s in at], [grad[i] for i in idx], [self.m[s] for s in at],
                               [self.v[s] for s in at], [], [self.t] * len(at), lr=float(rate),
                               beta1=self.betas[0], beta2=self.betas[1], weight_decay=0.0, eps=self.eps,
                               amsgrad=False, maximize=False)


__all__ = ["Batch", "FitResult", "ProbeSpec", "Regimen", "Sentences", "batch_loss", "batch_loss_grad",
           "fit_probes", "project_all", "squared", "tree_depths", "tree_distances"]
