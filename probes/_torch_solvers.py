"""Torch solvers behind `LinearProbe(backend="torch")`: float32, any device, memory bounded by row chunks.

Objectives (MEAN over rows, so that one alpha means the same at every training-set size):

- logistic:  (1/n) sum_i CE(softmax(W x_i + b), y_i) + alpha/2 * ||W||^2   (binary: one logit, sigmoid)
- ridge:     (1/n) sum_i (y_i - w x_i - b)^2 + alpha * ||w||^2

Logistic solver (`fit_logistic`, `fit_logistic_path`), chosen to need few passes over the rows:

1. **Initialisation** (no warm start given): linear discriminant analysis, W = M S^-1 with M the class means
   and S the within-class covariance shrunk toward the identity (`_SHRINK`) + alpha I,
   b_k = -m_k S^-1 m_k / 2 + log(prior_k), then shrunk by the scalar that minimises the objective on a row
   subsample. For Gaussian classes with a shared covariance this is the logistic model itself, so the
   optimiser starts near its optimum. With few logits on many features (16 k < d) it costs more than it
   saves, and the start is the intercept-only model (`_initial_point`).
2. **L-BFGS** (history 20, Armijo backtracking) on the standardised features (not whitened: `_lbfgs`); one
   loss-and-gradient pass over the rows per iteration when the unit step is accepted, which it almost always
   is. It stops when the largest entry of the gradient of the objective above (with respect to W and b, i.e.
   scikit-learn's criterion on its mean-scaled objective) is at most `tol`.

The loss and gradient are written out by hand and accumulated over row chunks, so neither an autograd graph
nor more than a chunk of the [n, classes] logits is held. Statistics that do not depend on alpha (class
means, covariance) are computed once per training set and shared along an alpha path.

Ridge is solved in closed form from the [d, d] Gram matrix (float64); a path of alphas shares one
eigendecomposition of it (`fit_ridge_path`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Rows per chunk are chosen so one chunk's float32 logits plus features stay near this many bytes.
_CHUNK_BYTES = 64 * 2**20
# Rows used for the covariance behind the initialisation (an initial point only needs
# to be roughly right; the objective and gradient always use every row).
_COV_ROWS = 16_384
# Rows used to choose the scale of the initial point.
_SCALE_ROWS = 16_384
_HISTORY = 20
# Shrinkage of the within-class covariance toward a multiple of the identity in the initialisation
# (regularised discriminant analysis, Friedman 1989). Unshrunk, S^-1 blows up the low-variance directions of
# real encoder features and L-BFGS then needs 35% more passes than from zero (weak-L2 position probes, 32
# classes); at 0.9 it needs as few as from zero there, and as few as the unshrunk start on Gaussian classes.
_SHRINK = 0.9
# Rows used to measure the curvature behind the first step.
_SECANT_ROWS = 8_192


@dataclass
class LogisticSolution:
    weight: torch.Tensor  # [k, d] with k = 1 for binary problems, else n_classes
    bias: torch.Tensor  # [k]
    n_iter: int
    grad_max: float  # largest |gradient| entry of the (mean) objective at the solution
    converged: bool
    n_passes: int = 0  # loss-and-gradient passes over the rows


@dataclass
class _Stats:
    """Alpha-independent statistics of one training set, shared along an alpha path."""

    mean: torch.Tensor  # [d] float64
    counts: torch.Tensor  # [K] float64
    class_means: torch.Tensor  # [K, d] float64
    cov: torch.Tensor | None = None  # [d, d] float64 population covariance (up to _COV_ROWS rows), when needed


def chunk_rows(n_features: int, n_outputs: int, batch_size: int | None) -> int:
    if batch_size is not None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be a positive number of rows, got {batch_size}")
        return int(batch_size)
    return max(1024, _CHUNK_BYTES // (4 * (n_features + 2 * n_outputs)))


def column_stats(X: torch.Tensor, batch_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-column mean and population std of X [n, d] as float64, in one pass over row chunks.

    Each chunk is shifted by its float32 mean m (so the squares are of small numbers) and its exact mean and
    squared deviations follow from the shifted rows x - m: mean = m + r, M2 = sum (x - m)^2 - n r^2 with
    r = mean(x - m), which corrects m's own rounding. Chunks are combined in float64 with Chan et al.'s update
    M2 = sum_c M2_c + n_c (mean_c - mean)^2.
    """
    n, d = X.shape
    step = chunk_rows(d, 1, batch_size)
    means, m2s, counts = [], [], []
    for s in range(0, n, step):
        xc = X[s : s + step]
        shift = xc.mean(0)
        dev = xc - shift
        r = dev.mean(0).double()
        means.append(shift.double() + r)
        m2s.append(dev.square_().sum(0).double() - len(xc) * r.square())
        counts.append(len(xc))
    w = torch.tensor(counts, dtype=torch.float64, device=X.device)[:, None]
    chunk_means = torch.stack(means)
    mean = (w * chunk_means).sum(0) / n
    m2 = torch.stack(m2s).sum(0) + (w * (chunk_means - mean).square()).sum(0)
    return mean, (m2 / n).sqrt()


def fit_logistic(
    X: torch.Tensor,
    y: torch.Tensor,
    n_classes: int,
    alpha: float,
    *,
    max_iter: int,
    tol: float,
    init: tuple[torch.Tensor, torch.Tensor] | None = None,
    batch_size: int | None = None,
) -> LogisticSolution:
    """Multinomial (or binary) L2 logistic regression on the mean loss (module docstring).

    X: [n, d] float32 (already standardised if wanted); y: [n] long class indices in 0..n_classes-1.
    init: optional (weight [k, d], bias [k]) warm start; None = the discriminant-analysis initialisation.
    """
    return fit_logistic_path(X, y, n_classes, [alpha], max_iter=max_iter, tol=tol, init=init,
                             batch_size=batch_size)[0]  # fmt: skip


def fit_logistic_path(
    X: torch.Tensor,
    y: torch.Tensor,
    n_classes: int,
    alphas: Sequence[float],
    *,
    max_iter: int,
    tol: float,
    init: tuple[torch.Tensor, torch.Tensor] | None = None,
    batch_size: int | None = None,
) -> list[LogisticSolution]:
    """Solutions for every alpha (in the order given) on ONE training set.

    The statistics behind the initialisation are computed once; the alphas are solved
    from the strongest to the weakest L2, each warm-started from the previous solution on the same rows (a
    warm start never comes from another training set, which would leak its fit).
    """
    n, d = X.shape
    k = 1 if n_classes == 2 else n_classes
    stats = _stats(X, y, n_classes)
    step = chunk_rows(d, k, batch_size)
    order = sorted(range(len(alphas)), key=lambda i: -float(alphas[i]))
    out: list[LogisticSolution | None] = [None] * len(alphas)
    current = None
    if init is not None and tuple(init[0].shape) == (k, d):
        current = (init[0].to(X.device, torch.float32), init[1].to(X.device, torch.float32))
    for i in order:
        alpha = float(alphas[i])
        if current is None:
            current = _initial_point(X, y, n_classes, alpha, stats)
        sol = _lbfgs(X, y, alpha, current, stats, max_iter=max_iter, tol=tol, step=step)
        out[i] = sol
        current = (sol.weight, sol.bias)
    return out  # type: ignore[return-value]


def fit_ridge(
    X: torch.Tensor, y: torch.Tensor, alpha: float, *, batch_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form ridge on the mean loss with an unpenalised intercept. X: [n, d]; y: [n]. Returns (w [d], b [])."""
    return fit_ridge_path(X, y, [alpha], batch_size=batch_size)[0]


def fit_ridge_path(
    X: torch.Tensor, y: torch.Tensor, alphas: Sequence[float], *, batch_size: int | None = None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Ridge for every alpha from one eigendecomposition of the centred Gram matrix: (G + n alpha I) w = X'y."""
    n, d = X.shape
    step = chunk_rows(d, 1, batch_size)
    x_mean = torch.zeros(d, dtype=torch.float64, device=X.device)
    for s in range(0, n, step):
        x_mean += X[s : s + step].sum(0, dtype=torch.float64)
    x_mean /= n
    y64 = y.double()
    y_mean = y64.mean()
    yc = (y64 - y_mean).float()
    mean32 = x_mean.float()
    gram = torch.zeros(d, d, dtype=torch.float64, device=X.device)
    rhs = torch.zeros(d, dtype=torch.float64, device=X.device)
    for s in range(0, n, step):
        xc = X[s : s + step] - mean32  # centring makes the intercept drop out of the normal equations
        gram += (xc.T @ xc).double()
        rhs += (xc.T @ yc[s : s + step]).double()
    out = []
    if len(alphas) == 1:
        gram.diagonal().add_(n * float(alphas[0]))
        w = torch.linalg.solve(gram, rhs)
        return [(w, y_mean - x_mean @ w)]
    evals, evecs = torch.linalg.eigh(gram)
    proj = evecs.T @ rhs
    for alpha in alphas:
        w = evecs @ (proj / (evals.clamp_min(0) + n * float(alpha)))
        out.append((w, y_mean - x_mean @ w))
    return out


# -- logistic internals ---------------------------------------------------------------------------------------


def _stats(X: torch.Tensor, y: torch.Tensor, n_classes: int) -> _Stats:
    n, d = X.shape
    counts = torch.bincount(y, minlength=n_classes).double()
    sums = torch.zeros(n_classes, d, dtype=torch.float32, device=X.device).index_add_(0, y, X)
    class_means = sums.double() / counts.clamp_min(1)[:, None]
    mean = (sums.double().sum(0)) / n
    return _Stats(mean=mean, counts=counts, class_means=class_means)


def _covariance(X: torch.Tensor, stats: _Stats) -> torch.Tensor:
    """The population covariance [d, d] (float64) from up to _COV_ROWS evenly spaced rows, cached in stats."""
    if stats.cov is None:
        sub = X[:: max(1, len(X) // _COV_ROWS)] - stats.mean.float()
        stats.cov = (sub.T @ sub).double() / len(sub)
    return stats.cov


def _initial_point(
    X: torch.Tensor, y: torch.Tensor, n_classes: int, alpha: float, stats: _Stats
) -> tuple[torch.Tensor, torch.Tensor]:
    """Discriminant-analysis logits, shrunk by the best scalar on a row subsample. Returns (W [k, d], b [k]).

    The discriminant start costs a covariance and a solve (~n d^2 + d^3) and saves a few passes of ~4 n d k
    each, so it is taken when 16 k >= d (k logits, d features); otherwise (binary or few-class probes on wide
    features, e.g. the pair probes: 1 logit, 768 features, where it took half the fit) the start is the
    intercept-only model: W = 0, b = log prior.
    """
    n, d = X.shape
    prior = stats.counts / n
    k = 1 if n_classes == 2 else n_classes
    if 16 * k < d:
        log_prior = torch.log(prior.clamp_min(1e-12))
        b = log_prior[1:] - log_prior[:1] if n_classes == 2 else log_prior - log_prior.mean()
        return torch.zeros(k, d, dtype=torch.float32, device=X.device), b.float()
    centred = stats.class_means - stats.mean  # [K, d]
    within = _covariance(X, stats) - (centred.T * prior) @ centred
    within = 0.5 * (within + within.T)
    scale = float(within.diagonal().mean().clamp_min(1e-12))
    within = (1 - _SHRINK) * within
    within.diagonal().add_(alpha + (_SHRINK + 1e-6) * scale)
    W = torch.linalg.solve(within, centred.T).T  # [K, d] = M S^-1 (rows for absent classes are zero)
    b = -0.5 * (W * centred).sum(1) + torch.log(prior.clamp_min(1e-12)) - W @ stats.mean
    if n_classes == 2:
        W, b = W[1:] - W[:1], b[1:] - b[:1]
    else:  # logits are defined up to a shift shared by all classes; the optimum's intercepts sum to zero
        b = b - b.mean()
    W, b = W.float(), b.float()
    stride = max(1, n // _SCALE_ROWS)
    Xs, ys = X[::stride], y[::stride]
    z = torch.addmm(b, Xs, W.T)
    sq = float(W.double().square().sum())
    best, best_f = 0.0, math.inf
    for scale in (0.0, 0.125, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0):
        f = _ce_mean(scale * z, ys) + 0.5 * alpha * scale * scale * sq
        if f < best_f:
            best, best_f = scale, f
    return W * best, b * best


def _ce_mean(z: torch.Tensor, y: torch.Tensor) -> float:
    if z.shape[1] == 1:
        return float((torch.nn.functional.softplus(z[:, 0]) - y.to(z.dtype) * z[:, 0]).mean(dtype=torch.float64))
    return float((torch.logsumexp(z, 1) - z.gather(1, y[:, None])[:, 0]).mean(dtype=torch.float64))


def _lbfgs(
    X: torch.Tensor,
    y: torch.Tensor,
    alpha: float,
    start: tuple[torch.Tensor, torch.Tensor],
    stats: _Stats,
    *,
    max_iter: int,
    tol: float,
    step: int,
) -> LogisticSolution:
    """L-BFGS on (W, c) with b = c - W mean: the intercept is taken at the centre of the rows, which
    decouples it from the weights (the rows' mean is ~0 after standardising, but need not be).

    The features are NOT whitened: on encoder features, whose covariance is far from isotropic, L-BFGS in
    coordinates whitened by the Cholesky factor of Cov + alpha I needed 53-295 iterations where plain
    standardised coordinates needed 12-114 (weakly regularised position probes, 32 classes, 2,720 rows), and
    on the isotropic benchmark data 16 against 14: the weak-L2 optimum lies far out along low-variance
    directions that whitening stretches.

    Longer than 60 lines: one L-BFGS iteration (step `lbfgs_direction`, backtracking line search, history
    update) reads as the algorithm does in Nocedal & Wright (Alg. 7.5); split, its state (v, f, g, the S/Y
    history, the pass count) would be threaded through every helper.
    """
    n, d = X.shape
    mean = stats.mean.float()
    k = start[0].shape[0]

    def to_wb(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        W, c = v[: k * d].view(k, d), v[k * d :]
        return W, c - W @ mean

    def evaluate(v: torch.Tensor, rows: slice = slice(None)) -> tuple[float, torch.Tensor, float]:
        W, b = to_wb(v)
        f, gW, gb = _loss_grad(W, b, X[rows], y[rows], alpha, step)
        grad_max = max(float(gW.abs().max()), float(gb.abs().max()))
        gW = gW - gb[:, None] * mean  # chain rule through b = c - W mean
        return f, torch.cat([gW.reshape(-1), gb]), grad_max

    W0, b0 = start
    v = torch.cat([W0.reshape(-1), b0 + W0 @ mean])
    f, g, grad_max = evaluate(v)
    passes, it = 1, 0
    history = _History(_HISTORY, v.numel(), v.dtype, v.device)
    while grad_max > tol and it < max_iter:
        if len(history):
            q = history.direction(g)
        else:
            q = g * -_first_scale(evaluate, v, g, n)
        slope = float(g @ q)
        if slope >= 0:  # not a descent direction (numerical trouble): restart from steepest descent
            history.clear()
            q, slope = g.neg(), -float(g @ g)
        t, accepted = 1.0, False
        for _ in range(20):
            v_new = v + t * q
            f_new, g_new, gm_new = evaluate(v_new)
            passes += 1
            # Armijo, or near the optimum where float32 cannot resolve the decrease of f, Hager & Zhang's
            # approximate Wolfe test (f within rounding of f, directional derivative flattened)
            flatter = abs(float(g_new @ q)) <= 0.9 * abs(slope)
            if f_new <= f + 1e-4 * t * slope or (f_new <= f + 1e-6 * abs(f) and flatter):
                accepted = True
                break
            t *= 0.5
        it += 1
        if not accepted:  # no decrease is representable in float32: we are as close as we can get
            break
        s_vec, y_vec = v_new - v, g_new - g
        sy = float(s_vec @ y_vec)
        if sy > 1e-12 * float(y_vec @ y_vec):
            history.push(s_vec, y_vec)
        v, f, g, grad_max = v_new, f_new, g_new, gm_new
    W, b = to_wb(v)
    return LogisticSolution(weight=W.clone(), bias=b.clone(), n_iter=it, grad_max=grad_max,
                            converged=grad_max <= tol, n_passes=passes)  # fmt: skip


def lbfgs_direction(S: torch.Tensor, Y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The L-BFGS step -H g [p] from the last m pairs S, Y [m, p] (oldest first) with H0 = gamma I, in Byrd,
    Nocedal & Schnabel's (1994) compact form, the same vector as the two-loop recursion (Nocedal & Wright,
    Alg. 7.4) in a handful of matrix products instead of 4m vector operations (which dominated small fits):

        H g = gamma g + S' R^-T ((D + gamma Y Y') r - gamma Y g) - gamma Y' r,   r = R^-1 S g,

    R the upper triangle of S Y' (R_ij = s_i'y_j, i <= j), D its diagonal and gamma = s'y / y'y of the newest
    pair (Nocedal & Wright, eq. 7.20); the m x m algebra in float64. The solver keeps its pairs in a `_History`
    across iterations; this stateless form fills one with S, Y.
    """
    history = _History(len(S), S.shape[1], S.dtype, S.device)
    for s, y in zip(S, Y, strict=True):
        history.push(s, y)
    return history.direction(g)


def _compact_coefficients(SY: torch.Tensor, YY: torch.Tensor, a: torch.Tensor,
                          c: torch.Tensor) -> tuple[float, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The m x m algebra of the compact form (float64, chronological order): gamma and the coefficients of
    H g = gamma g + S' top - gamma Y' r, from SY, YY [m, m] and a = S g, c = Y g [m]."""
    gamma = float(SY[-1, -1] / YY[-1, -1])
    R = torch.triu(SY)
    r = torch.linalg.solve_triangular(R, a[:, None], upper=True)[:, 0]
    inner = SY.diagonal() * r + gamma * (YY @ r) - gamma * c
    top = torch.linalg.solve_triangular(R.T, inner[:, None], upper=False)[:, 0]
    return gamma, top, r


class _History:
    """The last ``m`` L-BFGS pairs (s, y) in one ring buffer ``[2m, p]`` (rows ``:m`` the s, ``m:`` the y), with
    their products s_i'y_j and y_i'y_j (float64, ``[m, m]``) updated by one row and column per new pair. A step
    (`direction`) then costs two matrix-vector products over the buffer and a new pair one and a half more
    (Y s and B y), where stacking the pairs and forming S Y' afresh each iteration cost a third of a small fit
    (2,700 rows, 32 classes)."""

    def __init__(self, m: int, p: int, dtype: torch.dtype, device: torch.device) -> None:
        self.m = m
        self.B = torch.zeros(2 * m, p, dtype=dtype, device=device)  # zeros: rows not yet written stay finite
        self.SY = torch.zeros(m, m, dtype=torch.float64, device=device)  # SY[i, j] = s_i'y_j (buffer rows)
        self.YY = torch.zeros(m, m, dtype=torch.float64, device=device)
        self.rows: list[int] = []  # buffer rows, oldest pair first

    def __len__(self) -> int:
        return len(self.rows)

    def clear(self) -> None:
        self.rows.clear()

    def push(self, s: torch.Tensor, y: torch.Tensor) -> None:
        """Add the newest pair, dropping the oldest when the buffer is full."""
        m = self.m
        j = self.rows.pop(0) if len(self.rows) == m else len(self.rows)
        self.B[j], self.B[m + j] = s, y
        self.rows.append(j)
        Ys, By = (self.B[m:] @ s).double(), (self.B @ y).double()  # Y s, [S y; Y y] (S s is never used)
        self.SY[j], self.SY[:, j], self.YY[j] = Ys, By[:m], By[m:]
        self.YY[:, j] = By[m:]

    def direction(self, g: torch.Tensor) -> torch.Tensor:
        """The L-BFGS step -H g (`lbfgs_direction`) from the stored pairs."""
        m = self.m
        order = torch.as_tensor(self.rows, device=self.B.device)
        Bg = (self.B @ g).double()
        gamma, top, r = _compact_coefficients(self.SY[order][:, order], self.YY[order][:, order], Bg[:m][order],
                                              Bg[m:][order])  # fmt: skip
        coef = torch.zeros(2 * m, dtype=self.B.dtype, device=self.B.device)  # rows not in use get 0
        coef[order], coef[m + order] = top.to(coef.dtype), (-gamma * r).to(coef.dtype)
        return torch.mv(self.B.T, coef).add_(g, alpha=gamma).neg_()


def _first_scale(evaluate, v: torch.Tensor, g: torch.Tensor, n: int) -> float:  # noqa: ANN001
    """Step scale s'y / y'y for the first L-BFGS step, from a secant along -g on a row subsample (~0.2 pass).

    A unit step on -g is safe only where the data Hessian (at most ~1/2 of the feature covariance, Boehning
    1992) dominates and far too short where the curvature is the small alpha; the secant measures it.
    """
    rows = slice(None, None, max(1, n // _SECANT_ROWS))
    s = g * (-1e-2 / max(float(g.abs().max()), 1e-12))
    _, g0, _ = evaluate(v, rows)
    _, g1, _ = evaluate(v + s, rows)
    yv = g1 - g0
    sy, yy = float(s @ yv), float(yv @ yv)
    return sy / yy if sy > 0 and yy > 0 else 1.0


def _loss_grad(
    W: torch.Tensor, b: torch.Tensor, X: torch.Tensor, y: torch.Tensor, alpha: float, step: int
) -> tuple[float, torch.Tensor, torch.Tensor]:
    """(mean objective, gradient wrt W [k, d], wrt b [k]), accumulated over row chunks."""
    n, d = X.shape
    binary = W.shape[0] == 1
    Wt = W.T.contiguous()  # [d, k]: the forward GEMM is fastest on a contiguous right operand
    gW = torch.zeros_like(W)
    gb = torch.zeros_like(b)
    loss = 0.0
    for s in range(0, n, step):
        xc, yc = X[s : s + step], y[s : s + step]
        z = torch.addmm(b, xc, Wt)  # [m, k] logits
        if binary:
            yf = yc.to(z.dtype)[:, None]
            loss += float((torch.nn.functional.softplus(z) - yf * z).sum(dtype=torch.float64))
            g = torch.sigmoid(z).sub_(yf)
        else:
            g = torch.softmax(z, dim=1)  # one fused kernel
            py = g.gather(1, yc[:, None])
            tiny = py < 1e-30  # -log p would lose precision: take those rows' loss from the logits
            if bool(tiny.any()):
                rows = tiny[:, 0]
                zr = z[rows]
                exact = torch.logsumexp(zr, 1) - zr.gather(1, yc[rows][:, None])[:, 0]
                loss += float(exact.sum(dtype=torch.float64))
                py = py.masked_fill(tiny, 1.0)
            loss -= float(py.log().sum(dtype=torch.float64))
            g.scatter_add_(1, yc[:, None], torch.full_like(py, -1.0))
        gW.addmm_(g.T, xc)
        gb += g.sum(0)
    gW.div_(n).add_(W, alpha=alpha)
    gb.div_(n)
    return loss / n + 0.5 * alpha * float(W.double().square().sum()), gW, gb
