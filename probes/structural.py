"""Structural probes (Hewitt & Manning 2019, "A Structural Probe for Finding Syntax in Word Representations").

A *distance* probe learns ``B`` ([d, k]) so that the squared distance ``||B^T (h_i - h_j)||^2`` between word
vectors approximates the number of edges between words i and j in the dependency tree; a *depth* probe learns
``B`` so that the squared norm ``||B^T h_i||^2`` approximates the depth of word i (root = 0).

Conventions pinned to the authors' code (john-hewitt/structural-probes: probe.py, loss.py, regimen.py,
reporter.py, task.py):

- **Loss**: L1 between predicted *squared* distances (or squared norms) and tree distances (depths), summed
  over the sentence's word pairs (words), divided by ``n_words ** 2`` (``n_words``) and averaged over the
  sentences of a batch (``L1DistanceLoss`` / ``L1DepthLoss``). Every word, punctuation included, is trained.
- **Training**: ``B`` initialised uniform(-0.05, 0.05); Adam, lr 0.001; batches of 20 sentences, shuffled each
  epoch; after each epoch the learning rate is multiplied by 0.1 when the dev loss did not improve
  (``ReduceLROnPlateau(factor=0.1, patience=0)``); the parameters with the lowest dev loss are kept (an
  improvement must exceed 1e-4) and training stops when the best epoch is more than ``patience`` (4) epochs old
  or after ``max_epochs`` (40).
- **Metrics** (`uuas`, `distance_spearman`, `root_accuracy`, `norm_spearman`): see their docstrings.

Several probes (one per layer/site) are trained in one batched pass: give each sentence as
``[n_sites, n_words, d]``; the parameter is ``[n_sites, d, k]``, the loss is summed over sites (Adam is
element-wise, each site has its own learning rate and early stopping), so every site's probe is exactly the
one it would get alone.

>>> probe = StructuralProbe("distance").fit(train_vectors, train_heads)      # vectors: list of [n, d]
>>> pred = probe.predict(test_vectors)                                         # list of [n, n]
>>> uuas(pred, test_heads, punct=test_punct)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from einops import einsum
from scipy.sparse.csgraph import minimum_spanning_tree
from scipy.stats import rankdata

KINDS = ("distance", "depth")
#: Sentence lengths (in words, punctuation included) over which the reporter macro-averages Spearman.
SPEARMAN_LENGTHS = (5, 50)

# ------------------------------------------------------------------------------------------- gold targets


def ancestors(heads: Sequence[int]) -> np.ndarray:
    """``[n, n]`` 0/1: ``A[i, a] = 1`` when word ``a`` is word ``i`` or one of its ancestors. ``heads``: CoNLL-U
    heads (1-based, 0 = root), one per word, forming one tree."""
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


def tree_distances(heads: Sequence[int]) -> np.ndarray:
    """``[n, n]`` number of edges between every two words of a tree: ``depth_i + depth_j - 2 depth_lca``.
    ``heads``: CoNLL-U heads (1-based, 0 = root), one per word."""
    anc = ancestors(heads)
    depth = anc.sum(1) - 1
    common = anc @ anc.T  # ancestors shared = depth of the lowest common ancestor + 1
    return depth[:, None] + depth[None, :] - 2 * (common - 1)


def tree_depths(heads: Sequence[int]) -> np.ndarray:
    """``[n]`` edges from each word to the root word (the root word has depth 0)."""
    return ancestors(heads).sum(1) - 1


def linear_chain_distances(n: int) -> np.ndarray:
    """``[n, n]`` distances of the linear-order (right-branching) tree: ``|i - j|``, each word attached to the
    next one."""
    idx = np.arange(n)
    return np.abs(idx[:, None] - idx[None, :])


# ------------------------------------------------------------------------------------------------ metrics


def mst_edges(distances: np.ndarray, keep: np.ndarray | None = None) -> set[tuple[int, int]]:
    """Undirected edges ``(i, j)``, ``i < j``, of the minimum spanning tree of ``distances`` ([n, n]) over the
    words where ``keep`` ([n] bool) is True (the reporter never lets punctuation into the tree).

    scipy reads a 0 entry as "no edge", so off-diagonal distances <= 0 are raised to the smallest positive
    float (ties stay ties)."""
    distances = np.asarray(distances, dtype=np.float64)
    idx = np.arange(len(distances)) if keep is None else np.flatnonzero(keep)
    if len(idx) < 2:
        return set()
    sub = distances[np.ix_(idx, idx)]
    sub = (sub + sub.T) / 2
    sub = np.where(sub > 0, sub, np.finfo(np.float64).tiny)
    np.fill_diagonal(sub, 0.0)
    tree = minimum_spanning_tree(sub).tocoo()
    return {(int(min(idx[a], idx[b])), int(max(idx[a], idx[b]))) for a, b in zip(tree.row, tree.col, strict=True)}


def uuas_counts(pred: Sequence[np.ndarray], heads: Sequence[Sequence[int]],
                punct: Sequence[np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per sentence: ``(correct, total)`` undirected edges, ``[n_sent]`` each, as the reporter counts them: the
    MST of the predicted distances against the MST of the gold tree distances, both over non-punctuation words
    (``total`` = non-punctuation words - 1). ``pred``: ``[n, n]`` per sentence; ``punct``: ``[n]`` bool per
    sentence (None: no word is punctuation)."""
    correct, total = np.zeros(len(pred)), np.zeros(len(pred))
    for s, (p, h) in enumerate(zip(pred, heads, strict=True)):
        keep = None if punct is None else ~np.asarray(punct[s], dtype=bool)
        gold = mst_edges(tree_distances(h), keep)
        correct[s] = len(gold & mst_edges(p, keep))
        total[s] = len(gold)
    return correct, total


def uuas(pred: Sequence[np.ndarray], heads: Sequence[Sequence[int]],
         punct: Sequence[np.ndarray] | None = None) -> float:
    """Undirected unlabelled attachment score: gold edges recovered by the predicted MST, over all gold edges of
    all sentences (micro-average, as ``report_uuas_and_tikz``); punctuation excluded from both trees."""
    correct, total = uuas_counts(pred, heads, punct)
    return float(correct.sum() / total.sum()) if total.sum() else float("nan")


def row_spearman(pred: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Spearman correlation of each row of ``pred`` with the same row of ``gold`` (``[..., m]`` -> ``[...]``):
    average ranks for ties, NaN for a constant row (as ``scipy.stats.spearmanr``)."""
    rp = rankdata(pred, axis=-1)
    rg = rankdata(gold, axis=-1)
    rp = rp - rp.mean(-1, keepdims=True)
    rg = rg - rg.mean(-1, keepdims=True)
    denom = np.sqrt((rp**2).sum(-1) * (rg**2).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, (rp * rg).sum(-1) / np.where(denom > 0, denom, 1), np.nan)


def spearman_parts(pred: Sequence[np.ndarray], heads: Sequence[Sequence[int]], kind: str) -> tuple[np.ndarray, ...]:
    """Per sentence: ``(sum of Spearman correlations, number of correlations, length)``. Distance: one
    correlation per word (its row of predicted vs gold distances, the word itself included, punctuation
    included, as ``WordPairReporter.report_spearmanr``); depth: one per sentence (``WordReporter``)."""
    total, count, length = np.zeros(len(pred)), np.zeros(len(pred)), np.zeros(len(pred), dtype=np.int64)
    for s, (p, h) in enumerate(zip(pred, heads, strict=True)):
        gold = tree_distances(h) if kind == "distance" else tree_depths(h)
        rho = np.atleast_1d(row_spearman(np.asarray(p, dtype=np.float64), gold.astype(np.float64)))
        total[s], count[s], length[s] = rho.sum(), rho.size, len(h)
    return total, count, length


def length_macro_mean(total: np.ndarray, count: np.ndarray, length: np.ndarray,
                      weights: np.ndarray | None = None, lengths: tuple[int, int] = SPEARMAN_LENGTHS) -> np.ndarray:
    """Mean of the per-length means of the correlations, over the lengths in ``lengths`` (inclusive) that
    occur. ``weights``: ``[m, n_sent]`` sentence multiplicities (bootstrap counts) -> ``[m]``; None -> scalar."""
    w = np.ones((1, len(total))) if weights is None else np.asarray(weights, dtype=np.float64)
    lo, hi = lengths
    values = np.arange(lo, hi + 1)
    onehot = (length[:, None] == values[None, :]).astype(np.float64)  # [n_sent, n_lengths]
    sums = w @ (onehot * total[:, None])
    counts = w @ (onehot * count[:, None])
    with np.errstate(invalid="ignore", divide="ignore"):
        per_length = np.where(counts > 0, sums / np.where(counts > 0, counts, 1), np.nan)
        present = counts > 0
        out = np.where(present.any(-1), np.nansum(np.where(present, per_length, 0), -1) / present.sum(-1), np.nan)
    return out if weights is not None else out[0]


def distance_spearman(pred: Sequence[np.ndarray], heads: Sequence[Sequence[int]],
                      lengths: tuple[int, int] = SPEARMAN_LENGTHS) -> float:
    """DSpr: per word, Spearman between its predicted and gold distances to every word of its sentence;
    averaged over all words of all sentences of one length, then over lengths 5-50 (``report_spearmanr``)."""
    total, count, length = spearman_parts(pred, heads, "distance")
    return float(length_macro_mean(total, count, length, lengths=lengths))


def norm_spearman(pred: Sequence[np.ndarray], heads: Sequence[Sequence[int]],
                  lengths: tuple[int, int] = SPEARMAN_LENGTHS) -> float:
    """NSpr: per sentence, Spearman between predicted and gold depths; averaged over the sentences of one
    length, then over lengths 5-50."""
    total, count, length = spearman_parts(pred, heads, "depth")
    return float(length_macro_mean(total, count, length, lengths=lengths))


def root_hits(pred: Sequence[np.ndarray], heads: Sequence[Sequence[int]],
              punct: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """``[n_sent]`` 1.0 where the shallowest non-punctuation word (argmin of predicted depth, first on ties)
    is the gold root (``report_root_acc`` with ``get_nopunct_argmin``), else 0.0."""
    hits = np.zeros(len(pred))
    for s, (p, h) in enumerate(zip(pred, heads, strict=True)):
        p = np.asarray(p, dtype=np.float64)
        if punct is not None and not np.asarray(punct[s], dtype=bool).all():
            p = np.where(np.asarray(punct[s], dtype=bool), np.inf, p)
        hits[s] = float(int(np.argmin(p)) == list(h).index(0))
    return hits


def root_accuracy(pred: Sequence[np.ndarray], heads: Sequence[Sequence[int]],
                  punct: Sequence[np.ndarray] | None = None) -> float:
    """Share of sentences whose predicted shallowest non-punctuation word is the gold root."""
    return float(root_hits(pred, heads, punct).mean())


# -------------------------------------------------------------------------------------------------- probe


class StructuralProbe:
    """Hewitt & Manning's structural probe (scikit-learn conventions, torch inside).

    kind: ``"distance"`` (squared distances ~ tree distances) or ``"depth"`` (squared norms ~ depths).
    rank: ``k``, the columns of ``B`` (None: full rank, ``k = d``). lr, batch_size, max_epochs, patience,
    lr_decay, tol: the training regimen (defaults: the paper's, see the module docstring). dev_fraction: share
    of the training sentences held out (seeded, whole sentences) for early stopping when ``fit`` gets no dev
    set. seed: initialisation, dev split and batch order. device: torch device (None: the input's when it is a
    tensor, else CPU).

    Fitted attributes: ``proj_`` (``[d, k]``, or ``[n_sites, d, k]`` for 3-D inputs), ``best_epoch_``,
    ``dev_loss_`` (best dev loss, per site), ``n_epochs_`` (epochs run), ``history_`` (per epoch: train and
    dev loss per site).
    """

    def __init__(self, kind: str = "distance", rank: int | None = None, *, lr: float = 1e-3, batch_size: int = 20,
                 max_epochs: int = 40, patience: int = 4, lr_decay: float = 0.1, tol: float = 1e-4,
                 dev_fraction: float = 0.1, init_scale: float = 0.05, seed: int = 0,
                 device: str | torch.device | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if rank is not None and (not isinstance(rank, int) or rank < 1):
            raise ValueError(f"rank must be a positive integer or None (full rank), got {rank!r}")
        if batch_size < 1 or max_epochs < 1 or patience < 0:
            raise ValueError("batch_size and max_epochs must be >= 1 and patience >= 0")
        if not 0 < dev_fraction < 1:
            raise ValueError(f"dev_fraction must be in (0, 1), got {dev_fraction}")
        self.kind, self.rank, self.lr, self.batch_size = kind, rank, lr, batch_size
        self.max_epochs, self.patience, self.lr_decay, self.tol = max_epochs, patience, lr_decay, tol
        self.dev_fraction, self.init_scale, self.seed, self.device = dev_fraction, init_scale, seed, device

    # -- scikit-learn conventions
    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor arguments."""
        names = ("kind", "rank", "lr", "batch_size", "max_epochs", "patience", "lr_decay", "tol", "dev_fraction",
                 "init_scale", "seed", "device")
        return {n: getattr(self, n) for n in names}

    def set_params(self, **params: Any) -> StructuralProbe:
        """Set constructor arguments; returns self."""
        for k, v in params.items():
            if k not in self.get_params():
                raise ValueError(f"unknown parameter {k!r}")
            setattr(self, k, v)
        return self

    @classmethod
    def from_projection(cls, proj: Any, kind: str = "distance", **params: Any) -> StructuralProbe:
        """A fitted probe from a saved ``proj_`` (``[d, k]`` or ``[n_sites, d, k]``), e.g. one cached to disk."""
        probe = cls(kind, **params)
        proj = torch.as_tensor(np.asarray(proj), dtype=torch.float32)
        if proj.ndim not in (2, 3):
            raise ValueError(f"proj must be [d, k] or [n_sites, d, k], got {tuple(proj.shape)}")
        probe.proj_ = proj.to(probe._device([]))
        probe._squeeze = proj.ndim == 2
        probe.n_features_in_ = proj.shape[-2]
        return probe

    # -- fitting
    def fit(self, X: Sequence[Any], trees: Sequence[Sequence[int]], X_dev: Sequence[Any] | None = None,
            trees_dev: Sequence[Sequence[int]] | None = None) -> StructuralProbe:
        """Train on sentences. ``X``: per sentence ``[n_words, d]`` (or ``[n_sites, n_words, d]`` to train one
        probe per site at once); ``trees``: per sentence its CoNLL-U heads (1-based, 0 = root). ``X_dev`` /
        ``trees_dev``: the early-stopping set (default: ``dev_fraction`` of the sentences, seeded)."""
        device = self._device(X)
        if len(X) != len(trees):
            raise ValueError(f"{len(X)} sentences of vectors but {len(trees)} trees")
        if (X_dev is None) != (trees_dev is None):
            raise ValueError("give both X_dev and trees_dev, or neither")
        if X_dev is None:
            if len(X) < 2:
                raise ValueError("need at least 2 sentences to hold out a dev set")
            order = np.random.default_rng([self.seed, 1]).permutation(len(X))
            n_dev = max(1, int(round(self.dev_fraction * len(X))))
            dev_idx, train_idx = np.sort(order[:n_dev]), np.sort(order[n_dev:])
            X_dev, trees_dev = [X[i] for i in dev_idx], [trees[i] for i in dev_idx]
            X, trees = [X[i] for i in train_idx], [trees[i] for i in train_idx]
        train = _Packed(X, trees, self.kind, device)
        dev = _Packed(X_dev, trees_dev, self.kind, device)
        if dev.d != train.d or dev.n_sites != train.n_sites:
            raise ValueError("dev vectors must have the training vectors' shape per word")
        self._squeeze = train.squeeze
        k = train.d if self.rank is None else self.rank
        gen = torch.Generator().manual_seed(int(self.seed))
        S = train.n_sites
        init = (torch.rand(train.d, k, generator=gen) * 2 - 1) * self.init_scale  # the same start at every site
        proj = init.expand(S, -1, -1).contiguous().to(device)
        adam = _Adam(proj, self.lr)
        best = proj.clone()
        best_loss, best_epoch = np.full(S, np.inf), np.full(S, -1)
        sched_best = np.full(S, np.inf)
        active = np.ones(S, dtype=bool)
        history = []
        batch_gen = torch.Generator().manual_seed(int(self.seed) + 1)
        epoch = -1
        for epoch in range(self.max_epochs):
            sites = torch.as_tensor(np.flatnonzero(active), device=device)
            perm = torch.randperm(train.n_sent, generator=batch_gen).numpy()
            train_loss = np.zeros(S)
            for start in range(0, train.n_sent, self.batch_size):
                rows = perm[start : start + self.batch_size]
                sub = proj[sites].requires_grad_(True)
                loss = train.loss(rows, sub, sites)  # [active sites]
                (grad,) = torch.autograd.grad(loss.sum(), sub)
                adam.step(sites, grad)
                train_loss[active] += loss.detach().cpu().numpy() * len(rows)
            with torch.no_grad():
                dev_loss = dev.mean_loss(proj, self.batch_size * 4)
            history.append({"epoch": epoch, "train_loss": train_loss / train.n_sent, "dev_loss": dev_loss,
                            "active": active.copy()})
            for s in np.flatnonzero(active):
                if dev_loss[s] < sched_best[s] * (1 - self.tol):  # ReduceLROnPlateau(patience=0), relative 1e-4
                    sched_best[s] = dev_loss[s]
                else:
                    adam.lr[s] *= self.lr_decay
                if dev_loss[s] < best_loss[s] - self.tol:
                    best_loss[s], best_epoch[s] = dev_loss[s], epoch
                    best[s] = proj[s]
                elif best_epoch[s] < epoch - self.patience:
                    active[s] = False
            if not active.any():
                break
        self.proj_ = best[0] if self._squeeze else best
        self.best_epoch_ = best_epoch
        self.dev_loss_ = best_loss
        self.n_epochs_ = epoch + 1
        self.history_ = history
        self.n_features_in_ = train.d
        return self

    # -- prediction
    def transform(self, X: Sequence[Any]) -> list[np.ndarray]:
        """Per sentence ``B^T h`` for each word: ``[n_words, k]`` (``[n_sites, n_words, k]``)."""
        self._check_fitted()
        out = []
        proj = self._proj3()
        for x in X:
            t = self._as_sites(x, proj.device)
            out.append(self._maybe_squeeze(einsum(t, proj, "s n d, s d k -> s n k").cpu().numpy()))
        return out

    def predict(self, X: Sequence[Any]) -> list[np.ndarray]:
        """Per sentence: predicted squared distances ``[n_words, n_words]`` (kind ``distance``) or squared norms
        ``[n_words]`` (kind ``depth``); with a leading ``[n_sites]`` axis for 3-D inputs."""
        self._check_fitted()
        proj = self._proj3()
        out = []
        with torch.no_grad():
            for x in X:
                t = einsum(self._as_sites(x, proj.device), proj, "s n d, s d k -> s n k")
                out.append(self._maybe_squeeze(_squared(t, self.kind).double().cpu().numpy()))
        return out

    def score(self, X: Sequence[Any], trees: Sequence[Sequence[int]],
              punct: Sequence[np.ndarray] | None = None) -> float | np.ndarray:
        """UUAS (distance) or root accuracy (depth) on these sentences (per site for 3-D inputs)."""
        pred = self.predict(X)
        metric = uuas if self.kind == "distance" else root_accuracy
        if self._squeeze:
            return metric(pred, trees, punct)
        return np.array([metric([p[s] for p in pred], trees, punct) for s in range(pred[0].shape[0])])

    # -- helpers
    def _device(self, X: Sequence[Any]) -> torch.device:
        if self.device is not None:
            return torch.device(self.device)
        if len(X) and isinstance(X[0], torch.Tensor):
            return X[0].device
        return torch.device("cpu")

    def _proj3(self) -> torch.Tensor:
        return self.proj_[None] if self._squeeze else self.proj_

    def _as_sites(self, x: Any, device: torch.device) -> torch.Tensor:
        t = torch.as_tensor(x).to(device=device, dtype=torch.float32)
        if t.ndim == 2:
            t = t[None]
        if t.ndim != 3 or t.shape[-1] != self.n_features_in_ or t.shape[0] != self._proj3().shape[0]:
            raise ValueError(f"expected [n_words, {self.n_features_in_}] (or [n_sites, n_words, d]) per sentence, "
                             f"got {tuple(t.shape)}")
        return t

    def _maybe_squeeze(self, a: np.ndarray) -> np.ndarray:
        return a[0] if self._squeeze else a

    def _check_fitted(self) -> None:
        if not hasattr(self, "proj_"):
            raise RuntimeError("this StructuralProbe is not fitted yet; call fit(X, trees) first")


def _squared(t: torch.Tensor, kind: str) -> torch.Tensor:
    """``t``: ``[..., n, k]`` projected words -> squared distances ``[..., n, n]`` or squared norms ``[..., n]``."""
    sq = (t**2).sum(-1)
    if kind == "depth":
        return sq
    gram = einsum(t, t, "... i k, ... j k -> ... i j")
    return (sq[..., :, None] + sq[..., None, :] - 2 * gram).clamp_min(0)


class _Adam:
    """Adam (torch's defaults: betas 0.9, 0.999, eps 1e-8) on ``param`` ``[n_sites, ...]`` with a learning rate
    and a step count per site; ``step(sites, grad)`` updates only the given sites (written out rather than
    ``torch.optim.Adam``, which imports torch's compiler on first use: seconds on a loaded machine)."""

    def __init__(self, param: torch.Tensor, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.param, self.betas, self.eps = param, betas, eps
        self.lr = np.full(param.shape[0], lr, dtype=np.float64)
        self.m, self.v = torch.zeros_like(param), torch.zeros_like(param)
        self.t = np.zeros(param.shape[0], dtype=np.int64)

    @torch.no_grad()
    def step(self, sites: torch.Tensor, grad: torch.Tensor) -> None:
        """One Adam update of ``param[sites]`` with ``grad`` (``[len(sites), ...]``)."""
        b1, b2 = self.betas
        idx = sites.cpu().numpy()
        self.t[idx] += 1
        m = self.m[sites].mul_(b1).add_(grad, alpha=1 - b1)
        v = self.v[sites].mul_(b2).addcmul_(grad, grad, value=1 - b2)
        self.m[sites], self.v[sites] = m, v
        shape = (-1,) + (1,) * (grad.ndim - 1)
        bc1 = torch.as_tensor(1 - b1 ** self.t[idx], dtype=grad.dtype, device=grad.device).view(shape)
        bc2 = torch.as_tensor(1 - b2 ** self.t[idx], dtype=grad.dtype, device=grad.device).view(shape)
        lr = torch.as_tensor(self.lr[idx], dtype=grad.dtype, device=grad.device).view(shape)
        self.param[sites] -= lr * (m / bc1) / ((v / bc2).sqrt() + self.eps)


class _Packed:
    """Sentences packed for batched training: all words in one tensor ``[n_words_total + 1, n_sites, d]`` (the
    last row is zeros, used as padding), gold targets padded with -1."""

    def __init__(self, X: Sequence[Any], trees: Sequence[Sequence[int]], kind: str, device: torch.device) -> None:
        if not len(X):
            raise ValueError("no sentences to train on")
        mats = []
        for i, (x, h) in enumerate(zip(X, trees, strict=True)):
            t = torch.as_tensor(x, dtype=torch.float32)
            t = t[None] if t.ndim == 2 else t
            if t.ndim != 3 or t.shape[1] != len(h):
                raise ValueError(f"sentence {i}: vectors {tuple(t.shape)} do not match its {len(h)} heads "
                                 "(give [n_words, d] or [n_sites, n_words, d])")
            mats.append(t)
        self.squeeze = torch.as_tensor(X[0]).ndim == 2
        self.n_sites, self.d = mats[0].shape[0], mats[0].shape[2]
        if any(m.shape[0] != self.n_sites or m.shape[2] != self.d for m in mats):
            raise ValueError("every sentence needs the same number of sites and the same dimension")
        self.kind = kind
        self.n_sent = len(mats)
        self.lengths = np.array([m.shape[1] for m in mats])
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)])
        words = torch.cat([m.permute(1, 0, 2) for m in mats] + [torch.zeros(1, self.n_sites, self.d)])
        self.words = words.to(device)  # [n_words_total + 1, n_sites, d]
        self.pad = len(words) - 1
        self.targets = [tree_distances(h) if kind == "distance" else tree_depths(h) for h in trees]
        self.device = device

    def batch(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Index ``[batch, n_max]`` into ``words``, gold ``[batch, n_max(, n_max)]`` (-1 = padding), lengths."""
        n_max = int(self.lengths[rows].max())
        index = np.full((len(rows), n_max), self.pad)
        shape = (len(rows), n_max, n_max) if self.kind == "distance" else (len(rows), n_max)
        gold = np.full(shape, -1.0, dtype=np.float32)
        for r, i in enumerate(rows):
            n = self.lengths[i]
            index[r, :n] = np.arange(self.offsets[i], self.offsets[i] + n)
            if self.kind == "distance":
                gold[r, :n, :n] = self.targets[i]
            else:
                gold[r, :n] = self.targets[i]
        return (torch.as_tensor(index, device=self.device), torch.as_tensor(gold, device=self.device),
                torch.as_tensor(self.lengths[rows], dtype=torch.float32, device=self.device))

    def loss(self, rows: np.ndarray, proj: torch.Tensor, sites: torch.Tensor) -> torch.Tensor:
        """Mean over the batch's sentences of the length-normalised L1 loss, per site: ``[n_sites_given]``.
        ``proj``: ``[n_sites_given, d, k]`` for the sites ``sites`` of ``words``."""
        index, gold, lengths = self.batch(rows)
        x = self.words[index][:, :, sites]  # [batch, n, sites, d]
        t = einsum(x, proj, "b n s d, s d k -> s b n k")
        pred = _squared(t, self.kind)  # [s, b, n(, n)]
        mask = (gold != -1).to(pred.dtype)
        err = ((pred - gold) * mask).abs()
        if self.kind == "distance":
            per_sent = err.sum((-1, -2)) / lengths**2
        else:
            per_sent = err.sum(-1) / lengths
        return per_sent.mean(-1)

    def mean_loss(self, proj: torch.Tensor, batch_size: int) -> np.ndarray:
        """``[n_sites]`` mean normalised loss over all sentences."""
        sites = torch.arange(self.n_sites, device=proj.device)
        total = torch.zeros(self.n_sites, device=proj.device)
        for start in range(0, self.n_sent, batch_size):
            rows = np.arange(start, min(start + batch_size, self.n_sent))
            total += self.loss(rows, proj, sites) * len(rows)
        return (total / self.n_sent).cpu().numpy()
