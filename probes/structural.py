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
  (the paper's configs also cap it at 40 epochs; ``max_epochs`` here defaults to 100 so that probes stop early).
- **Metrics** (`uuas`, `distance_spearman`, `root_accuracy`, `norm_spearman`): see their docstrings.

Several probes (one per layer/site) are trained in one batched pass: give each sentence as
``[n_sites, n_words, d]``; the parameter is ``[n_sites, d, k]``, the loss is summed over sites (Adam is
element-wise, each site has its own learning rate and early stopping), so every site's probe is exactly the
one it would get alone. `bertscope.probes.structural_fit.fit_probes` goes further and trains several kinds and
ranks at every site in the same pass. The metrics take ``[..., n, n]`` / ``[..., n]`` predictions per sentence
(leading axes: probes, sites) and score them all at once.

>>> probe = StructuralProbe("distance").fit(train_vectors, train_heads)      # vectors: list of [n, d]
>>> pred = probe.predict(test_vectors)                                         # list of [n, n]
>>> uuas(pred, test_heads, punct=test_punct)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import minimum_spanning_tree
from scipy.stats import rankdata

from .structural_fit import KINDS, ProbeSpec, Regimen, Sentences, fit_probes, project_all, squared
from .structural_fit import tree_depths as tree_depths
from .structural_fit import tree_distances as tree_distances

#: Sentence lengths (in words, punctuation included) over which the reporter macro-averages Spearman.
SPEARMAN_LENGTHS = (5, 50)

# ------------------------------------------------------------------------------------------- gold targets


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


def mst_forest(distances: np.ndarray, keep: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """Minimum spanning trees of many predictions of one sentence in one scipy call: ``distances``
    ``[m, n, n]`` -> the edges ``(tree, i, j)`` (``i < j``, word indices) of each tree over the ``keep`` words
    (the graphs are the blocks of one block-diagonal graph, whose minimum spanning forest is the trees)."""
    distances = np.asarray(distances, dtype=np.float64)
    m, n = distances.shape[0], distances.shape[-1]
    idx = np.arange(n) if keep is None else np.flatnonzero(keep)
    k = len(idx)
    if k < 2 or m == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    sub = distances[:, idx][:, :, idx]
    sub = (sub + np.swapaxes(sub, 1, 2)) / 2
    sub = np.where(sub > 0, sub, np.finfo(np.float64).tiny)
    a, b = np.nonzero(~np.eye(k, dtype=bool))
    tree = np.repeat(np.arange(m), len(a))
    rows, cols = tree * k + np.tile(a, m), tree * k + np.tile(b, m)
    graph = coo_matrix((sub[:, a, b].ravel(), (rows, cols)), shape=(m * k, m * k)).tocsr()
    forest = minimum_spanning_tree(graph).tocoo()
    i, j = idx[forest.row % k], idx[forest.col % k]
    return forest.row // k, np.minimum(i, j), np.maximum(i, j)


def uuas_counts(pred: Sequence[np.ndarray], heads: Sequence[Sequence[int]],
                punct: Sequence[np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per sentence: ``(correct, total)`` undirected edges as the reporter counts them: the MST of the
    predicted distances against the MST of the gold tree distances, both over non-punctuation words (``total``
    = non-punctuation words - 1). ``pred``: per sentence ``[..., n, n]`` (leading axes: several predictions,
    e.g. sites, scored at once) -> ``correct`` ``[..., n_sent]``, ``total`` ``[n_sent]``. ``punct``: ``[n]``
    bool per sentence (None: no word is punctuation)."""
    lead = np.shape(pred[0])[:-2] if len(pred) else ()
    correct, total = np.zeros((int(np.prod(lead)), len(pred))), np.zeros(len(pred))
    for s, (p, h) in enumerate(zip(pred, heads, strict=True)):
        keep = None if punct is None else ~np.asarray(punct[s], dtype=bool)
        n = len(h)
        gold = np.zeros((n, n), dtype=bool)
        for i, j in mst_edges(tree_distances(h), keep):
            gold[i, j] = True
        tree, i, j = mst_forest(np.asarray(p).reshape(-1, n, n), keep)
        correct[:, s] = np.bincount(tree, weights=gold[i, j], minlength=correct.shape[0])
        total[s] = gold.sum()
    return correct.reshape(*lead, len(pred)), total


def uuas(pred: Sequence[np.ndarray], heads: Sequence[Sequence[int]],
         punct: Sequence[np.ndarray] | None = None) -> float:
    """Undirected unlabelled attachment score: gold edges recovered by the predicted MST, over all gold edges of
    all sentences (micro-average, as ``report_uuas_and_tikz``); punctuation excluded from both trees."""
    correct, total = uuas_counts(pred, heads, punct)
    if not total.sum():
        return float("nan")
    ratio = correct.sum(-1) / total.sum()
    return float(ratio) if np.ndim(ratio) == 0 else ratio


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
    """Per sentence: ``(sum of Spearman correlations [..., n_sent], number of correlations [n_sent], length
    [n_sent])``. Distance: one correlation per word (its row of predicted vs gold distances, the word itself
    included, punctuation included, as ``WordPairReporter.report_spearmanr``); depth: one per sentence
    (``WordReporter``). ``pred``: per sentence ``[..., n, n]`` or ``[..., n]`` (leading axes scored at once)."""
    tail = 2 if kind == "distance" else 1
    lead = np.shape(pred[0])[:-tail] if len(pred) else ()
    total = np.zeros((*lead, len(pred)))
    count, length = np.zeros(len(pred)), np.zeros(len(pred), dtype=np.int64)
    for s, (p, h) in enumerate(zip(pred, heads, strict=True)):
        gold = (tree_distances(h) if kind == "distance" else tree_depths(h)).astype(np.float64)
        rho = row_spearman(np.asarray(p, dtype=np.float64), gold)  # [..., n] or [...]
        total[..., s] = rho.sum(-1) if kind == "distance" else rho
        count[s], length[s] = (len(h) if kind == "distance" else 1), len(h)
    return total, count, length


def length_macro_mean(total: np.ndarray, count: np.ndarray, length: np.ndarray,
                      weights: np.ndarray | None = None, lengths: tuple[int, int] = SPEARMAN_LENGTHS) -> np.ndarray:
    """Mean of the per-length means of the correlations, over the lengths in ``lengths`` (inclusive) that
    occur. ``total``: ``[..., n_sent]``; ``weights``: ``[m, n_sent]`` sentence multiplicities (bootstrap
    counts) -> ``[..., m]``; None -> ``[...]`` (a scalar for 1-D ``total``)."""
    w = np.ones((1, len(count))) if weights is None else np.asarray(weights, dtype=np.float64)
    lo, hi = lengths
    values = np.arange(lo, hi + 1)
    onehot = (length[:, None] == values[None, :]).astype(np.float64)  # [n_sent, n_lengths]
    # sentences outside ``lengths`` are left out, also when their correlation is undefined (one word: NaN),
    # which the product below would otherwise spread to every length (NaN * 0 = NaN)
    total = np.where(onehot.any(-1), np.asarray(total, dtype=np.float64), 0.0)
    sums = np.einsum("mn,...n,nl->...ml", w, total, onehot)
    counts = (w @ (onehot * count[:, None]))  # [m, n_lengths]
    with np.errstate(invalid="ignore", divide="ignore"):
        per_length = np.where(counts > 0, sums / np.where(counts > 0, counts, 1), np.nan)
        present = counts > 0
        out = np.where(present.any(-1), np.where(present, per_length, 0).sum(-1) / present.sum(-1), np.nan)
    return out if weights is not None else out[..., 0]


def distance_spearman(pred: Sequence[np.ndarray], heads: Sequence[Sequence[int]],
                      lengths: tuple[int, int] = SPEARMAN_LENGTHS) -> float:
    """DSpr: per word, Spearman between its predicted and gold distances to every word of its sentence;
    averaged over all words of all sentences of one length, then over lengths 5-50 (``report_spearmanr``)."""
    total, count, length = spearman_parts(pred, heads, "distance")
    return _scalar(length_macro_mean(total, count, length, lengths=lengths))


def norm_spearman(pred: Sequence[np.ndarray], heads: Sequence[Sequence[int]],
                  lengths: tuple[int, int] = SPEARMAN_LENGTHS) -> float:
    """NSpr: per sentence, Spearman between predicted and gold depths; averaged over the sentences of one
    length, then over lengths 5-50."""
    total, count, length = spearman_parts(pred, heads, "depth")
    return _scalar(length_macro_mean(total, count, length, lengths=lengths))


def root_hits(pred: Sequence[np.ndarray], heads: Sequence[Sequence[int]],
              punct: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """``[..., n_sent]`` 1.0 where the shallowest non-punctuation word (argmin of predicted depth, first on
    ties) is the gold root (``report_root_acc`` with ``get_nopunct_argmin``), else 0.0. ``pred``: per sentence
    ``[..., n]``."""
    lead = np.shape(pred[0])[:-1] if len(pred) else ()
    hits = np.zeros((*lead, len(pred)))
    for s, (p, h) in enumerate(zip(pred, heads, strict=True)):
        p = np.asarray(p, dtype=np.float64)
        if punct is not None and not np.asarray(punct[s], dtype=bool).all():
            p = np.where(np.asarray(punct[s], dtype=bool), np.inf, p)
        hits[..., s] = np.argmin(p, axis=-1) == list(h).index(0)
    return hits


def root_accuracy(pred: Sequence[np.ndarray], heads: Sequence[Sequence[int]],
                  punct: Sequence[np.ndarray] | None = None) -> float:
    """Share of sentences whose predicted shallowest non-punctuation word is the gold root."""
    return _scalar(root_hits(pred, heads, punct).mean(-1))


def _scalar(x: np.ndarray) -> float | np.ndarray:
    return float(x) if np.ndim(x) == 0 else x


# -------------------------------------------------------------------------------------------------- probe


class StructuralProbe:
    """Hewitt & Manning's structural probe (scikit-learn conventions, torch inside).

    kind: ``"distance"`` (squared distances ~ tree distances) or ``"depth"`` (squared norms ~ depths).
    rank: ``k``, the columns of ``B`` (None: full rank, ``k = d``). lr, batch_size, max_epochs, patience,
    lr_decay, tol, init_scale: the training regimen (`structural_fit.Regimen`; the paper's, with ``max_epochs``
    high enough that probes stop early). dev_fraction: share of the training sentences held out (seeded, whole
    sentences) for early stopping when ``fit`` gets no dev set. seed: initialisation, dev split and batch
    order. device: torch device (None: the input's when it is a tensor, else CPU).

    Fitted attributes: ``proj_`` (``[d, k]``, or ``[n_sites, d, k]`` for 3-D inputs), and per site
    (``[n_sites]``): ``best_epoch_``, ``dev_loss_`` (best dev loss), ``stopped_epoch_`` (epochs trained),
    ``early_stopped_`` (False where ``max_epochs`` came first); ``n_epochs_`` (most epochs of any site),
    ``history_`` (per epoch: train and dev loss per site).
    """

    def __init__(self, kind: str = "distance", rank: int | None = None, *, lr: float = 1e-3, batch_size: int = 20,
                 max_epochs: int = 100, patience: int = 4, lr_decay: float = 0.1, tol: float = 1e-4,
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

    def regimen(self) -> Regimen:
        """The training regimen these parameters describe."""
        return Regimen(lr=self.lr, batch_size=self.batch_size, max_epochs=self.max_epochs, patience=self.patience,
                       lr_decay=self.lr_decay, tol=self.tol, init_scale=self.init_scale, seed=int(self.seed))

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
        train = Sentences.from_list(X, trees, device)
        dev = Sentences.from_list(X_dev, trees_dev, device)
        (res,) = fit_probes(train, dev, [ProbeSpec(self.kind, self.rank)], self.regimen())
        self._squeeze = torch.as_tensor(X[0]).ndim == 2
        self.set_result(res)
        self.n_features_in_ = train.d
        return self

    def set_result(self, res: Any) -> StructuralProbe:
        """Take the fitted state from a `structural_fit.FitResult` (one probe of a batched ``fit_probes``)."""
        self.proj_ = res.proj[0] if getattr(self, "_squeeze", False) else res.proj
        self.best_epoch_, self.dev_loss_ = res.best_epoch, res.dev_loss
        self.stopped_epoch_, self.early_stopped_ = res.n_epochs, res.early_stopped
        self.n_epochs_ = int(res.n_epochs.max())
        self.history_ = res.history
        return self

    # -- prediction
    def transform(self, X: Sequence[Any]) -> list[np.ndarray]:
        """Per sentence ``B^T h`` for each word: ``[n_words, k]`` (``[n_sites, n_words, k]``)."""
        self._check_fitted()
        return [self._maybe_squeeze(t.cpu().numpy()) for t in self._project(X)]

    def predict(self, X: Sequence[Any]) -> list[np.ndarray]:
        """Per sentence: predicted squared distances ``[n_words, n_words]`` (kind ``distance``) or squared norms
        ``[n_words]`` (kind ``depth``); with a leading ``[n_sites]`` axis for 3-D inputs."""
        self._check_fitted()
        with torch.no_grad():
            return [self._maybe_squeeze(squared(t, self.kind).double().cpu().numpy()) for t in self._project(X)]

    def score(self, X: Sequence[Any], trees: Sequence[Sequence[int]],
              punct: Sequence[np.ndarray] | None = None) -> float | np.ndarray:
        """UUAS (distance) or root accuracy (depth) on these sentences (per site for 3-D inputs)."""
        metric = uuas if self.kind == "distance" else root_accuracy
        return metric(self.predict(X), trees, punct)

    # -- helpers
    def _project(self, X: Sequence[Any]) -> list[torch.Tensor]:
        proj = self.proj_[None] if self._squeeze else self.proj_
        sent = Sentences.from_list(X, None, proj.device)
        if sent.d != self.n_features_in_ or sent.n_sites != proj.shape[0]:
            raise ValueError(f"expected [n_words, {self.n_features_in_}] (or [{proj.shape[0]}, n_words, "
                             f"{self.n_features_in_}]) per sentence, got {tuple(np.shape(X[0]))}")
        return project_all(sent, proj)

    def _device(self, X: Sequence[Any]) -> torch.device:
        if self.device is not None:
            return torch.device(self.device)
        if len(X) and isinstance(X[0], torch.Tensor):
            return X[0].device
        return torch.device("cpu")

    def _maybe_squeeze(self, a: np.ndarray) -> np.ndarray:
        return a[0] if self._squeeze else a

    def _check_fitted(self) -> None:
        if not hasattr(self, "proj_"):
            raise RuntimeError("this StructuralProbe is not fitted yet; call fit(X, trees) first")
