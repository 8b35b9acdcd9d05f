"""Linear concept erasure: LEACE, INLP, mean projection and an equal-rank random-subspace control.

Every eraser is a ``(fit, transform)`` object on arrays or tensors ``[..., d]`` and, through ``hook``, an
intervention at any hook site whose last dimension is ``d``:

>>> eraser = LeaceFitter.fit(x, labels).eraser          # x [n, d], labels [n] ints (one-hot inside)
>>> clean = eraser(x)                                    # x - (x - mean) Wr^T Wl^T
>>> eraser = LeaceEraser.fit(x, labels)                  # the same: fit on the class returns a new fitted eraser
>>> inlp = INLP("svm", n_iterations=5).fit(x, labels)    # fit on an instance fits it and returns it
>>> with model.hooks(eraser.hook(model, "blocks.1.hook_resid_post")):
...     out = model(ids, mask)                            # the rest of the forward runs on erased vectors

- ``LeaceFitter`` / ``LeaceEraser``: LEACE (Belrose et al. 2023), written as EleutherAI's ``concept-erasure``
  computes it (``concept_erasure/leace.py``, v0.2.5): running (Welford) moments updated batch by batch, so
  corpora larger than memory stream through ``update``; covariance of X with optimal linear shrinkage
  (``optimal_linear_shrinkage``, Ledoit-Wolf-style random-matrix shrinkage toward ``tr(S)/d · I``) or Bessel's
  correction; whitening ``W = Σ^{-1/2}`` on the eigenvalues above ``pinv``'s threshold; ``u`` = left singular
  vectors of ``W Σ_xz`` with singular value above ``svd_tol``; ``P = I - W^+ u u^T W``; with
  ``constrain_cov_trace`` the projection is mixed toward the orthogonal ``I - u u^T`` until the covariance trace
  no longer grows; ``method="orth"`` skips whitening (``P = I - u u^T``); ``affine`` keeps the mean.
- ``INLP`` (Ravfogel et al. 2020, ``nullspace_projection/src/debias.py``): train a linear classifier, project
  onto the nullspace of its weight rows, retrain on the projected data, ``n_iterations`` times; the final
  projection is onto the intersection of the nullspaces, ``P = I - P_rowspace(Σ_i P_rowspace(W_i))``.
  An iteration whose dev accuracy is under ``min_accuracy`` is not projected out (``debias.py``'s
  ``continue``; its retrain on the unchanged data would find the same classifier, so iterating stops there);
  ``stop_at_majority`` stops once dev accuracy is within ``tolerance`` of the majority class (Elazar et al.
  2021's amnesic-probing stopping rule).
- ``MeanProjection``: the orthogonal projection off the span of the class-mean differences ``μ_c - μ``
  (Haghighatkhah et al. 2022); rank ``k - 1`` for ``k`` classes.
- ``RandomSubspaceEraser``: the orthogonal projection off a random subspace of a given rank (the control every
  erasure result stands beside).

Both ``fit`` forms work on every eraser fit to data (LEACE, INLP, mean projection): on the class,
``Eraser.fit(x, z, **options)`` returns a new fitted eraser (concept-erasure's form; ``options`` are the
constructor's and ``fit``'s keywords); on an instance, ``eraser.fit(x, z)`` fits that eraser and returns it
(scikit-learn's). ``RandomSubspaceEraser`` is built, not fit: its subspace depends on no data.

Concepts ``z``: a 1-D integer array is class labels (one-hot inside, ``n_classes`` columns); a 1-D float array
is one continuous concept; ``[n, k]`` is used as given.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

__all__ = [
    "INLP",
    "INLPStep",
    "LeaceEraser",
    "LeaceFitter",
    "LinearEraser",
    "MeanProjection",
    "RandomSubspaceEraser",
    "concept_matrix",
    "cross_covariance",
    "optimal_linear_shrinkage",
]

ErasureMethod = Literal["leace", "orth"]


# ============================================================================================ common parts
def concept_matrix(z: Any, n: int, *, n_classes: int | None = None, dtype: torch.dtype = torch.float64,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """The concept as a matrix ``[n, k]``: integer labels [n] -> one-hot (``n_classes`` columns, default
    ``max + 1``); float [n] -> one column; ``[n, k]`` as given."""
    t = torch.as_tensor(np.asarray(z) if not isinstance(z, torch.Tensor) else z, device=device)
    if t.shape[0] != n:
        raise ValueError(f"concept has {t.shape[0]} rows for {n} vectors; give one label per vector")
    if t.ndim == 1 and not t.is_floating_point():
        if (t < 0).any():
            raise ValueError("class labels must be integers >= 0 (map them with np.unique(..., return_inverse=True))")
        k = int(t.max()) + 1 if n_classes is None else n_classes
        if len(t) and int(t.max()) >= k:
            raise ValueError(f"label {int(t.max())} is out of range for n_classes={k}")
        return torch.nn.functional.one_hot(t.long(), k).to(dtype)
    if t.ndim == 1:
        return t.to(dtype)[:, None]
    if t.ndim != 2:
        raise ValueError(f"concept must be [n] labels or [n, k], got shape {tuple(t.shape)}")
    return t.to(dtype)


def cross_covariance(x: Any, z: Any, *, n_classes: int | None = None) -> np.ndarray:
    """Sample cross-covariance ``Cov(x, z)`` [d, k] (float64; ``z`` as in ``concept_matrix``), the quantity
    LEACE drives to zero."""
    xt = _as_2d(x).to(torch.float64)
    zt = concept_matrix(z, xt.shape[0], n_classes=n_classes)
    xc, zc = xt - xt.mean(0), zt - zt.mean(0)
    return (xc.T @ zc / max(xt.shape[0] - 1, 1)).numpy()


class _fit_either:
    """Decorator: a ``fit(self, x, z, ...)`` usable in both forms. On an instance, ``eraser.fit(x, z)`` fits that
    eraser and returns it (scikit-learn's form); on the class, ``Eraser.fit(x, z, **options)`` builds
    ``Eraser(**constructor options)``, fits it with the rest and returns it (concept-erasure's form). A keyword
    ``fit`` names goes to ``fit``, any other to the constructor (all to ``fit`` when it takes ``**kwargs``)."""

    def __init__(self, fit: Callable[..., Any]) -> None:
        self.fit = fit
        params = inspect.signature(fit).parameters
        self.to_fit = (None if any(p.kind is p.VAR_KEYWORD for p in params.values())
                       else set(params) - {"self"})  # fmt: skip
        functools.update_wrapper(self, fit)

    def __get__(self, obj: Any, owner: type) -> Callable[..., Any]:
        if obj is not None:
            return types.MethodType(self.fit, obj)

        @functools.wraps(self.fit)
        def fit_new(*args: Any, **kwargs: Any) -> Any:
            fit_kw = {k: v for k, v in kwargs.items() if self.to_fit is None or k in self.to_fit}
            init_kw = {k: v for k, v in kwargs.items() if k not in fit_kw}
            return self.fit(owner(**init_kw), *args, **fit_kw)

        return fit_new


class LinearEraser:
    """An affine eraser ``r(x) = x - ((x - bias) @ right^T) @ left^T``, i.e. ``P x + (I - P) bias`` with
    ``P = I - left @ right`` [d, d]. ``left``, ``right^T``: [d, r]; ``bias``: [d] or None (then linear).

    Call it (or ``transform``) on ``[..., d]`` tensors or arrays: the result has the input's type and dtype.
    ``hook(model, names)`` gives the same map as hooks for ``model.hooks(...)`` / ``run_with_hooks``.
    """

    def __init__(self, left: torch.Tensor, right: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.left, self.right, self.bias = left, right, bias

    @property
    def dim(self) -> int:
        """Width d of the vectors it erases."""
        return self.left.shape[0]

    @property
    def P(self) -> torch.Tensor:
        """The linear part ``I - left @ right`` [d, d]."""
        return torch.eye(self.dim, dtype=self.left.dtype, device=self.left.device) - self.left @ self.right

    @property
    def rank(self) -> int:
        """Rank of the erased part ``I - P`` (how many directions the eraser changes)."""
        if self.left.shape[1] == 0:
            return 0
        if self.left.shape[1] < self.dim:  # rank(left @ right) <= k: the [d, k] factors are cheaper to check
            return min(int(torch.linalg.matrix_rank(self.left)), int(torch.linalg.matrix_rank(self.right)))
        return int(torch.linalg.matrix_rank(self.left @ self.right))

    def transform(self, x: Any) -> Any:
        """Erase the concept from ``x`` [..., d] (tensor or array; type and dtype kept)."""
        if isinstance(x, torch.Tensor):
            return self._apply(x)
        arr = np.asarray(x)
        return self._apply(torch.from_numpy(np.ascontiguousarray(arr))).numpy().astype(arr.dtype, copy=False)

    __call__ = transform

    def _apply(self, x: torch.Tensor) -> torch.Tensor:
        if self.dim == 0:
            raise RuntimeError(f"this {type(self).__name__} is not fitted yet: call its fit(x, z) first")
        if x.shape[-1] != self.dim:
            raise ValueError(f"eraser is for width {self.dim}, got vectors of width {x.shape[-1]}")
        left, right = self.left.to(x.device), self.right.to(x.device)
        work = torch.promote_types(x.dtype, left.dtype)
        xw = x.to(work)
        delta = xw - self.bias.to(x.device, work) if self.bias is not None else xw
        return (xw - (delta @ right.to(work).mT) @ left.to(work).mT).to(x.dtype)

    def hook(self, model: torch.nn.Module | None, names: str | Sequence[str],
             positions: Callable[[torch.Tensor], torch.Tensor] | None = None) -> list[tuple[str, Callable]]:
        """Hooks that erase at the named sites (``[batch, pos, d]`` or ``[..., d]`` tensors).

        model: checks that each name is a hook point (a typo fails here, not mid-run); None skips the check.
        positions: optional ``fn(tensor) -> bool mask [batch, pos]`` choosing which positions are erased
            (default: every position).
        """
        names = [names] if isinstance(names, str) else list(names)
        if model is not None and hasattr(model, "select_hooks"):
            model.select_hooks(names)  # KeyError naming the unknown site

        def fn(tensor: torch.Tensor, hook: Any) -> torch.Tensor:
            erased = self._apply(tensor)
            if positions is None:
                return erased
            keep = positions(tensor).to(tensor.device).bool()
            return torch.where(keep[..., None], erased, tensor)

        return [(name, fn) for name in names]


def _as_2d(x: Any) -> torch.Tensor:
    t = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(np.asarray(x)))
    if t.ndim < 2:
        raise ValueError(f"x must be [n, d] (or [..., d]), got shape {tuple(t.shape)}")
    return t.reshape(-1, t.shape[-1])


def _orthonormal_columns(a: torch.Tensor, rtol: float = 1e-10) -> torch.Tensor:
    """An orthonormal basis [d, r] of the column space of ``a`` [d, m] (singular values above ``rtol · max``),
    as ``scipy.linalg.orth``."""
    if a.numel() == 0:
        return a.new_zeros(a.shape[0], 0)
    u, s, _ = torch.linalg.svd(a, full_matrices=False)
    if s.numel() == 0 or s[0] == 0:
        return a.new_zeros(a.shape[0], 0)
    return u[:, s > rtol * s[0] * max(a.shape)]


# ============================================================================================ LEACE
def optimal_linear_shrinkage(S_n: torch.Tensor, n: int | torch.Tensor) -> torch.Tensor:
    """Optimal linear shrinkage of a sample covariance ``S_n`` [p, p] from ``n`` samples toward
    ``tr(S_n)/p · I`` (the formula of Bai et al. / concept-erasure's ``optimal_linear_shrinkage``):
    returns ``α S_n + β tr(S_n)/p · I`` with ``α = 1 - (tr(S)^2 ‖σ0‖²/n + ε) / (‖S‖²‖σ0‖² - ‖σ0‖⁴ + ε)``,
    ``‖σ0‖² = tr(S)²/p``, ``β = (1 - α)(‖σ0‖² + ε)/(‖σ0‖² + ε)``."""
    p = S_n.shape[-1]
    trace_s = torch.trace(S_n)
    sigma0_sq = trace_s**2 / p
    s_sq = torch.linalg.matrix_norm(S_n) ** 2
    eps = torch.finfo(S_n.dtype).eps
    top = trace_s * trace_s * sigma0_sq / n
    bottom = s_sq * sigma0_sq - sigma0_sq * sigma0_sq
    alpha = 1 - (top + eps) / (bottom + eps)
    beta = (1 - alpha) * (sigma0_sq + eps) / (sigma0_sq + eps)
    return alpha * S_n + torch.eye(p, dtype=S_n.dtype, device=S_n.device) * (beta * trace_s / p)


class LeaceEraser(LinearEraser):
    """The LEACE eraser ``x - ((x - mean) @ proj_right^T) @ proj_left^T`` (concept-erasure's names kept:
    ``proj_left`` [d, k], ``proj_right`` [k, d], ``bias`` [d] or None). ``LeaceEraser()`` with no factors is an
    unfitted eraser for ``eraser.fit(x, z)``."""

    def __init__(self, proj_left: torch.Tensor | None = None, proj_right: torch.Tensor | None = None,
                 bias: torch.Tensor | None = None) -> None:
        empty = torch.zeros(0, 0, dtype=torch.float64)
        super().__init__(empty if proj_left is None else proj_left, empty if proj_right is None else proj_right,
                         bias)

    @property
    def proj_left(self) -> torch.Tensor:
        return self.left

    @property
    def proj_right(self) -> torch.Tensor:
        return self.right

    @_fit_either
    def fit(self, x: Any, z: Any, **kwargs: Any) -> LeaceEraser:
        """Fit on ``x`` [n, d] and concept ``z`` in one call (``LeaceFitter.fit(x, z, **kwargs).eraser``'s
        factors): ``LeaceEraser.fit(x, z)`` returns a new eraser, ``eraser.fit(x, z)`` refits this one."""
        fitted = LeaceFitter.fit(x, z, **kwargs).eraser
        self.left, self.right, self.bias = fitted.left, fitted.right, fitted.bias
        return self


class LeaceFitter:
    """Running moments for LEACE; ``update(x, z)`` batch by batch, ``eraser`` computes the closed form.

    x_dim, z_dim: widths of the vectors and of the concept matrix (``n_classes`` for class labels).
    method: "leace" (whitened, least-squares optimal) or "orth" (orthogonal projection off Σ_xz's columns).
    affine: keep the mean (bias = running mean of x). constrain_cov_trace: mix toward the orthogonal
    projection if the erased covariance's trace would exceed the original's. shrinkage: optimal linear
    shrinkage of Σ_xx (else Bessel's correction). svd_tol: singular values of ``W Σ_xz`` at or under this are
    dropped. dtype: of the statistics (float64 by default: the moments of millions of rows stay exact).
    """

    def __init__(self, x_dim: int, z_dim: int, method: ErasureMethod = "leace", *, affine: bool = True,
                 constrain_cov_trace: bool = True, shrinkage: bool = True, svd_tol: float = 0.01,
                 dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> None:
        if method not in ("leace", "orth"):
            raise ValueError(f"unknown erasure method {method!r}; use 'leace' or 'orth'")
        if not svd_tol > 0:
            raise ValueError(f"svd_tol must be positive (numerical stability), got {svd_tol}")
        self.x_dim, self.z_dim, self.method = x_dim, z_dim, method
        self.affine, self.constrain_cov_trace, self.shrinkage, self.svd_tol = (
            affine, constrain_cov_trace, shrinkage, svd_tol)
        self.dtype, self.device = dtype, device
        self.n = 0
        self.mean_x = torch.zeros(x_dim, dtype=dtype, device=device)
        self.mean_z = torch.zeros(z_dim, dtype=dtype, device=device)
        self.sigma_xz_ = torch.zeros(x_dim, z_dim, dtype=dtype, device=device)
        self.sigma_xx_ = torch.zeros(x_dim, x_dim, dtype=dtype, device=device) if method == "leace" else None
        self._eraser: LeaceEraser | None = None

    @classmethod
    def fit(cls, x: Any, z: Any, *, n_classes: int | None = None, **kwargs: Any) -> LeaceFitter:
        """A fitter updated once with all of ``x`` [n, d] and ``z`` (labels [n], floats [n] or [n, k])."""
        xt = _as_2d(x)
        zt = concept_matrix(z, xt.shape[0], n_classes=n_classes)
        kwargs.setdefault("dtype", torch.float64)
        return cls(xt.shape[1], zt.shape[1], **kwargs).update(xt, zt)

    @torch.no_grad()
    def update(self, x: Any, z: Any) -> LeaceFitter:
        """Add a batch: ``x`` [..., d] and its concept (labels use ``z_dim`` classes). Welford's updates,
        so the result does not depend on how the rows are split into batches (up to rounding)."""
        xt = _as_2d(x).to(self.dtype).to(self.mean_x.device)
        zt = concept_matrix(z, xt.shape[0], n_classes=self.z_dim, dtype=self.dtype, device=self.mean_x.device)
        if xt.shape[1] != self.x_dim or zt.shape[1] != self.z_dim:
            raise ValueError(f"batch is x [{xt.shape[1]}] z [{zt.shape[1]}], fitter is x [{self.x_dim}] "
                             f"z [{self.z_dim}]")
        self.n += xt.shape[0]
        delta_x = xt - self.mean_x
        self.mean_x += delta_x.sum(0) / self.n
        delta_x2 = xt - self.mean_x
        if self.sigma_xx_ is not None:
            self.sigma_xx_.addmm_(delta_x.mT, delta_x2)
        delta_z = zt - self.mean_z
        self.mean_z += delta_z.sum(0) / self.n
        self.sigma_xz_.addmm_(delta_x.mT, zt - self.mean_z)
        self._eraser = None
        return self

    @property
    def sigma_xx(self) -> torch.Tensor:
        """Covariance of X [d, d] (symmetrised; shrunk, or with Bessel's correction)."""
        if self.n < 2 or self.sigma_xx_ is None:
            raise ValueError("sigma_xx needs method='leace' and at least 2 rows; call update() first")
        s_hat = (self.sigma_xx_ + self.sigma_xx_.mT) / 2
        if self.shrinkage:
            return optimal_linear_shrinkage(s_hat / self.n, self.n)
        return s_hat / (self.n - 1)

    @property
    def sigma_xz(self) -> torch.Tensor:
        """Cross-covariance of X and Z [d, k] (Bessel's correction)."""
        if self.n < 2:
            raise ValueError("sigma_xz needs at least 2 rows; call update() first")
        return self.sigma_xz_ / (self.n - 1)

    @property
    def eraser(self) -> LeaceEraser:
        """The LEACE eraser for the moments so far (computed once per update)."""
        if self._eraser is None:
            self._eraser = self._compute()
        return self._eraser

    def _compute(self) -> LeaceEraser:
        eye = torch.eye(self.x_dim, dtype=self.dtype, device=self.mean_x.device)
        if self.method == "leace":
            sigma = self.sigma_xx
            eigval, eigvec = torch.linalg.eigh(sigma)
            keep = eigval > eigval[-1] * sigma.shape[-1] * torch.finfo(eigval.dtype).eps  # pinv's threshold
            eigval = eigval.clamp_min(0.0)
            W = eigvec * torch.where(keep, eigval.rsqrt(), 0.0) @ eigvec.mT
            W_inv = eigvec * torch.where(keep, eigval.sqrt(), 0.0) @ eigvec.mT
        else:
            W, W_inv = eye, eye
        u, s, _ = torch.linalg.svd(W @ self.sigma_xz, full_matrices=False)
        u = u * (s > self.svd_tol)
        left, right = W_inv @ u, u.mT @ W
        if self.constrain_cov_trace and self.method == "leace":
            left, right = self._constrain_trace(eye, left, right, u)
        return LeaceEraser(left, right, self.mean_x.clone() if self.affine else None)

    def _constrain_trace(self, eye: torch.Tensor, left: torch.Tensor, right: torch.Tensor,
                         u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mix P toward the orthogonal Q = I - u u^T so that tr(P Σ P^T) <= tr(Σ) (the positive root of the
        quadratic in the mixing weight, clamped to [0, 1]), as concept-erasure does. With the Σ the whitening
        came from, ``P Σ P^T = Σ^{1/2} (I - u u^T) Σ^{1/2}`` cannot grow the trace; this guards the rounding and
        rank-deficient cases. The factors returned multiply back to ``I - P`` exactly (concept-erasure 0.2.4/5
        scales ``vh``'s columns instead of its rows here, so its factors would not)."""
        P = eye - left @ right
        sigma = self.sigma_xx
        old, new = torch.trace(sigma), torch.trace(P @ sigma @ P.mT)
        if not new > old:
            return left, right
        Q = eye - u @ u.mT
        x, y, z, w = new, 2 * torch.trace(P @ sigma @ Q.mT), torch.trace(Q @ sigma @ Q.mT), old
        discr = torch.sqrt(4 * w * x - 4 * w * y + 4 * w * z - 4 * x * z + y**2)
        alpha1 = (-y / 2 + z - discr / 2) / (x - y + z)
        alpha2 = (-y / 2 + z + discr / 2) / (x - y + z)
        alpha = torch.where(alpha1 > 0, alpha1, alpha2).clamp(0, 1)
        P = alpha * P + (1 - alpha) * Q
        uu, ss, vh = torch.linalg.svd(eye - P)
        return uu * ss.sqrt(), vh * ss.sqrt()[:, None]


# ============================================================================================ INLP
@dataclass
class INLPStep:
    """One INLP iteration: its classifier's dev accuracy (before its own direction is projected out) and whether
    its directions were projected out (False: its accuracy was under ``min_accuracy``, and iterating stopped)."""

    iteration: int
    dev_accuracy: float
    projected: bool = True


class INLP(LinearEraser):
    """Iterative nullspace projection (Ravfogel et al. 2020), with amnesic probing's stopping rule.

    classifier: "svm" (``LinearSVC(C=0.01, fit_intercept=True, dual=False)``, INLP's own setting in
        ``nullspace_projection``), "sgd-log" (``SGDClassifier(loss="log_loss", early_stopping=True)``, what
        Elazar et al.'s ``amnesic_probing/tasks/utils.get_projection_matrix`` trains), "logistic"
        (``LogisticRegression``) or a callable returning an unfitted scikit-learn classifier with ``coef_``.
    n_iterations: most classifiers trained (amnesic probing's ``--n_cls``, default 20). Each removes its
        weight rows' span: 1 direction for a binary concept, up to ``k`` for ``k`` classes (one-vs-rest).
    stop_at_majority: as ``amnesic_probing/debias/debias.get_debiasing_projection`` with
        ``min_accuracy = majority``: the projection kept is the one after the first iteration whose dev accuracy
        (measured before its own projection) is within ``tolerance`` (0.01) of the dev majority rate; without
        it, every iteration's classifier is projected out (INLP's fixed iteration count).
    min_accuracy: ``debias.py``'s ``min_accuracy`` (default 0: never): a classifier whose dev accuracy is under
        it is not projected out (its ``INLPStep.projected`` is False). ``debias.py`` then ``continue``s, retraining
        on the same, unprojected data; a seeded classifier finds the same one again, so here iterating stops.
    Each classifier is trained on ``x P`` with ``P`` the projection onto the intersection of the nullspaces
    found so far, as both codes do (they use Ben-Israel's ``P = I - P_rowspace(Σ_i P_rowspace(W_i))``; here the
    same projection is kept as an orthonormal basis of the removed span, grown by each ``W``'s new directions).
    The eraser is linear (``bias`` None): ``x -> P x``. ``steps`` records each iteration's dev accuracy.
    """

    def __init__(self, classifier: str | Callable[[], Any] = "svm", n_iterations: int = 20, *,
                 stop_at_majority: bool = False, tolerance: float = 0.01, min_accuracy: float = 0.0,
                 max_iter: int = 1000, seed: int = 0) -> None:
        if not isinstance(n_iterations, int) or n_iterations < 1:
            raise ValueError(f"n_iterations must be a positive integer, got {n_iterations!r}")
        if not 0.0 <= min_accuracy <= 1.0:
            raise ValueError(f"min_accuracy must be an accuracy in [0, 1], got {min_accuracy!r}")
        self.classifier, self.n_iterations, self.min_accuracy = classifier, n_iterations, min_accuracy
        self.stop_at_majority, self.tolerance, self.max_iter, self.seed = stop_at_majority, tolerance, max_iter, seed
        self.steps: list[INLPStep] = []
        self.weights: list[np.ndarray] = []
        self.majority = float("nan")
        super().__init__(torch.zeros(0, 0, dtype=torch.float64), torch.zeros(0, 0, dtype=torch.float64), None)

    def _new_classifier(self) -> Any:
        if callable(self.classifier):
            return self.classifier()
        from sklearn.linear_model import LogisticRegression, SGDClassifier
        from sklearn.svm import LinearSVC

        if self.classifier == "svm":
            return LinearSVC(C=0.01, fit_intercept=True, dual=False, max_iter=self.max_iter, random_state=self.seed)
        if self.classifier == "sgd-log":
            return SGDClassifier(loss="log_loss", early_stopping=True, max_iter=self.max_iter, random_state=self.seed)
        if self.classifier == "logistic":
            return LogisticRegression(max_iter=self.max_iter, random_state=self.seed)
        raise ValueError(f"unknown classifier {self.classifier!r}; use 'svm', 'sgd-log', 'logistic' or a callable")

    @_fit_either
    def fit(self, x: Any, y: Any, x_dev: Any = None, y_dev: Any = None) -> INLP:
        """Fit on ``x`` [n, d] with class labels ``y`` [n]; dev accuracies on (``x_dev``, ``y_dev``), or on a
        seeded 20% of the rows held out from training when not given. ``INLP.fit(x, y, **options)`` returns a new
        fitted eraser (constructor options among ``options``); ``inlp.fit(x, y)`` fits this one."""
        X = np.asarray(x, dtype=np.float64).reshape(-1, np.shape(x)[-1])
        y = np.asarray(y).reshape(-1)
        if x_dev is None:
            order = np.random.default_rng(self.seed).permutation(len(X))
            dev, train = order[: max(1, len(X) // 5)], order[max(1, len(X) // 5):]
            X, y, Xd, yd = X[train], y[train], X[dev], y[dev]
        else:
            Xd, yd = np.asarray(x_dev, dtype=np.float64), np.asarray(y_dev).reshape(-1)
        d = X.shape[1]
        self.majority = float(np.max(np.unique(yd, return_counts=True)[1]) / len(yd))
        basis = np.zeros((d, 0))  # orthonormal basis of the span of all weight rows so far
        self.steps, self.weights = [], []
        for it in range(self.n_iterations):
            if len(np.unique(y)) < 2:
                break
            P = np.eye(d) - basis @ basis.T  # = I - P_rowspace(Σ_i P_rowspace(W_i)) (Ben-Israel), kept as a basis
            clf = self._new_classifier().fit(X @ P, y)
            acc = float(np.mean(clf.predict(Xd @ P) == yd))
            if acc < self.min_accuracy:  # debias.py's `continue`: the same data would give the same classifier
                self.steps.append(INLPStep(it, acc, projected=False))
                break
            self.steps.append(INLPStep(it, acc))
            W = np.atleast_2d(clf.coef_)
            self.weights.append(W)
            new = W.T - basis @ (basis.T @ W.T)  # the part of W's row space not yet removed
            basis = np.hstack([basis, _orthonormal_columns(torch.from_numpy(new)).numpy()])
            if self.stop_at_majority and acc - self.majority <= self.tolerance:
                break
        self.left = torch.from_numpy(np.ascontiguousarray(basis))
        self.right, self.bias = self.left.mT.contiguous(), None
        return self


# ============================================================================================ mean projection
class MeanProjection(LinearEraser):
    """Orthogonal projection off the span of the class-mean differences ``μ_c - μ`` (rank ``k - 1`` for ``k``
    classes; the difference of means for a binary concept). ``affine``: erase around the mean (``bias`` =
    mean of x), so the projection leaves the overall mean where it was."""

    def __init__(self, *, affine: bool = True, rtol: float = 1e-8) -> None:
        self.affine, self.rtol = affine, rtol
        super().__init__(torch.zeros(0, 0, dtype=torch.float64), torch.zeros(0, 0, dtype=torch.float64), None)

    @_fit_either
    def fit(self, x: Any, y: Any) -> MeanProjection:
        """Fit on ``x`` [n, d] and class labels ``y`` [n]: ``MeanProjection.fit(x, y, affine=...)`` returns a new
        fitted eraser, ``mp.fit(x, y)`` fits this one."""
        xt = _as_2d(x).to(torch.float64)
        labels = np.unique(np.asarray(y), return_inverse=True)[1].reshape(-1)
        onehot = torch.nn.functional.one_hot(torch.from_numpy(labels), int(labels.max()) + 1).to(torch.float64)
        means = (onehot.T @ xt) / onehot.sum(0)[:, None]  # [k, d]
        mu = xt.mean(0)
        basis = _orthonormal_columns((means - mu).T, self.rtol)
        self.left, self.right = basis, basis.mT.contiguous()
        self.bias = mu if self.affine else None
        return self


# ============================================================================================ control
class RandomSubspaceEraser(LinearEraser):
    """Orthogonal projection off a uniformly random ``rank``-dimensional subspace of R^d (QR of a Gaussian
    matrix, seeded): the equal-rank control of an erasure. ``bias`` (e.g. the data mean) keeps that point."""

    def __init__(self, dim: int, rank: int, *, seed: int = 0, bias: Any = None) -> None:
        if not 0 <= rank <= dim:
            raise ValueError(f"rank must be in 0..{dim}, got {rank}")
        g = torch.Generator().manual_seed(seed)
        q, _ = torch.linalg.qr(torch.randn(dim, max(rank, 1), generator=g, dtype=torch.float64))
        q = q[:, :rank]
        b = None if bias is None else torch.as_tensor(np.asarray(bias), dtype=torch.float64)
        super().__init__(q, q.mT.contiguous(), b)
