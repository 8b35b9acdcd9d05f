"""`LinearProbe`: an L2-regularised linear probe with a scikit-learn and a torch backend.

Regularisation convention (both backends, both tasks) -- **the L2 term is on the MEAN loss**:

    (1/n) sum_i loss_i + (alpha / 2) * ||W||^2        loss = cross-entropy        (classification)
    (1/n) sum_i (y_i - w x_i - b)^2 + alpha * ||w||^2                             (regression)

over features standardised to zero mean and unit variance (when `standardize=True`), with an unpenalised
intercept. Because the loss is a mean, one alpha regularises equally at every training-set size, so an alpha
chosen on folds of 1,000 rows means the same on folds of 3,000 rows or on all rows. In scikit-learn's terms
(whose loss is a sum) that is `LogisticRegression(C=1 / (alpha * n))` and `Ridge(alpha=alpha * n)` with n the
number of training rows, which is exactly what the sklearn backend fits.

(Before this convention the loss was a sum and C = 1 / alpha: an old alpha a on n training rows is a / n now.)

Binary problems use one logit (scikit-learn's binomial parametrisation, `coef_` of shape [1, d]); problems
with K > 2 classes use K logits (`coef_` [K, d]).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from scipy.special import expit, softmax
from sklearn.base import BaseEstimator, clone
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.linear_model import LogisticRegression, Ridge

from . import _torch_solvers
from ._checks import (
    check_backend,
    check_classes,
    check_features,
    check_spread,
    check_target,
    check_task,
    thread_limit,
)


class LinearProbe(BaseEstimator):
    """Linear probe for classification (multinomial logistic) or regression (ridge).

    Parameters
    ----------
    task: "classification", "regression", or None (default) = from the labels at ``fit``, as ``evaluate`` infers
        it: float labels -> regression, integer, boolean or string labels -> classification (``task_`` holds the
        task fitted).
    alpha: L2 strength on the MEAN loss (>= 0 for ridge, > 0 for logistic); scikit-learn's C = 1 / (alpha * n)
        for n training rows (module docstring). The same alpha means the same at any training-set size.
    standardize: scale features to zero mean / unit variance (statistics of the training rows) before fitting;
        constant columns keep scale 1.
    backend: "sklearn" (LogisticRegression / Ridge, CPU, float64 or float32 as given) or "torch" (float32,
        discriminant-analysis start + L-BFGS for logistic, closed form for ridge, on `device`;
        X may also be a torch tensor). See `probes._torch_solvers`.
    device: torch device for the torch backend (None = the device of X when X is a tensor, else "cpu");
        ignored by the sklearn backend.
    max_iter: L-BFGS iteration limit (logistic only). A fit that stops before `tol` warns (ConvergenceWarning).
    seed: random state handed to the solver. Both default solvers are deterministic, so results do not depend
        on it; it is kept so that callers can pin it uniformly.
    tol: stop when the largest gradient entry of the objective divided by n is below this (scikit-learn's).
    warm_start: start the next `fit` from the previous solution when the class set and shape agree (only an
        initial point: the optimum reached is the same up to `tol`).
    batch_size: rows per chunk in the torch loss/gradient (None = automatic, ~64 MiB per chunk).
    n_threads: cap torch / BLAS / OpenMP threads during fit and predict (None = the libraries' defaults);
        see `probes._checks.thread_limit`: 1 is much faster on a CPU shared with other busy processes.

    Learned attributes: `classes_` [K] (classification), `coef_` ([k, d] classification with k = 1 if binary,
    else K; [d] regression) and `intercept_` ([k] or scalar), both in the ORIGINAL feature space, so that
    `decision_function(X) = X @ coef_.T + intercept_`; `mean_`, `scale_` [d] (the standardisation; zeros and
    ones when off); `n_features_in_`, `n_iter_`, `converged_`.
    """

    def __init__(
        self,
        task: str | None = None,
        alpha: float = 1e-3,
        standardize: bool = True,
        backend: str = "sklearn",
        device: str | torch.device | None = None,
        max_iter: int = 1000,
        seed: int = 0,
        tol: float = 1e-4,
        warm_start: bool = False,
        batch_size: int | None = None,
        n_threads: int | None = None,
    ) -> None:
        self.task = task
        self.alpha = alpha
        self.standardize = standardize
        self.backend = backend
        self.device = device
        self.max_iter = max_iter
        self.seed = seed
        self.tol = tol
        self.warm_start = warm_start
        self.batch_size = batch_size
        self.n_threads = n_threads

    @property
    def _task(self) -> str:
        """The task in force: the fitted ``task_``, else ``task`` (``None`` reads as classification until fitted)."""
        return getattr(self, "task_", None) or (self.task if self.task is not None else "classification")

    def _resolve_task(self, y: Any) -> str:
        """``task`` checked, or (``task=None``) inferred from ``y``'s dtype."""
        if self.task is not None:
            return check_task(self.task)
        kind = (y.dtype.is_floating_point and "f") if isinstance(y, torch.Tensor) else np.asarray(y).dtype.kind
        return "regression" if kind == "f" else "classification"

    # -- scikit-learn integration -------------------------------------------------------------------------
    @property
    def _estimator_type(self) -> str:  # scikit-learn < 1.6 reads this to pick stratified splits / scoring
        return "classifier" if self._task == "classification" else "regressor"

    def __sklearn_tags__(self):  # noqa: ANN204 (sklearn.utils.Tags, sklearn >= 1.6)
        from sklearn.utils import ClassifierTags, RegressorTags

        tags = super().__sklearn_tags__()
        tags.target_tags.required = True
        if self._task == "classification":
            tags.estimator_type = "classifier"
            tags.classifier_tags = ClassifierTags()
        else:
            tags.estimator_type = "regressor"
            tags.regressor_tags = RegressorTags()
        return tags

    # -- public API -----------------------------------------------------------------------------------------
    def fit(self, X: Any, y: Any) -> LinearProbe:
        """Fit on X [n, d] (numpy array, or torch tensor for the torch backend) and y [n]. Returns self."""
        with thread_limit(self.n_threads):
            return self._fit(X, y)

    def fit_path(self, X: Any, y: Any, alphas: Sequence[float]) -> list[LinearProbe]:
        """One fitted copy of this probe per alpha, all on the same X [n, d] and y [n], in the order given.

        Cheaper than separate fits: the torch backend standardises once, solves ridge for every alpha from one
        eigendecomposition, and solves logistic probes from the strongest to the weakest L2, each warm-started
        from the previous one (on these rows only) with shared covariance statistics; the sklearn backend
        warm-starts scikit-learn along the same order. `self` is left unfitted.
        """
        grid = [float(a) for a in alphas]
        if not grid:
            raise ValueError("alphas is empty; pass at least one alpha")
        checker = clone(self)
        checker.task_ = self._resolve_task(y)
        for a in grid:
            checker.set_params(alpha=a)._check_alpha()
        with thread_limit(self.n_threads):
            if check_backend(self.backend) == "torch":
                return self._fit_path_torch(X, y, grid)
            out: list[LinearProbe | None] = [None] * len(grid)
            probe = clone(self).set_params(warm_start=True)
            for i in sorted(range(len(grid)), key=lambda j: -grid[j]):
                out[i] = copy.deepcopy(probe.set_params(alpha=grid[i])._fit(X, y))
                out[i].set_params(warm_start=self.warm_start)
            return out  # type: ignore[return-value]

    def _fit_path_torch(self, X: Any, y: Any, grid: list[float]) -> list[LinearProbe]:
        task = self._resolve_task(y)
        X = check_features(X)
        n, d = X.shape
        y = check_target(y, n, task)
        template = clone(self)
        template.task_ = task
        if template._task == "classification":
            template.classes_, y_idx = check_classes(y)
        else:
            check_spread(y)
        Xs, device = template._standardized_tensor(X)
        if task == "regression":
            yt = torch.as_tensor(y, dtype=torch.float64, device=device)
            sols = [(w[None, :], b[None], 0, True) for w, b in
                    _torch_solvers.fit_ridge_path(Xs, yt, grid, batch_size=self.batch_size)]  # fmt: skip
        else:
            yt = torch.as_tensor(y_idx, dtype=torch.long, device=device)
            path = _torch_solvers.fit_logistic_path(Xs, yt, len(template.classes_), grid, max_iter=self.max_iter,
                                                    tol=self.tol, batch_size=self.batch_size)  # fmt: skip
            sols = [(s.weight, s.bias, s.n_iter, s.converged) for s in path]
        out = []
        for alpha, (w, b, n_iter, converged) in zip(grid, sols, strict=True):
            probe = copy.deepcopy(template).set_params(alpha=alpha)
            probe._w, probe._b = w.double().cpu().numpy(), np.atleast_1d(b.double().cpu().numpy())
            probe.n_iter_, probe.converged_, probe.n_features_in_ = n_iter, converged, d
            probe._sync_public_coef()
            if not converged:
                warnings.warn(f"torch logistic solver stopped after {n_iter} iterations at alpha={alpha:g} before "
                              f"tol={self.tol}; raise max_iter, loosen tol, or increase alpha", ConvergenceWarning,
                              stacklevel=3)  # fmt: skip
            out.append(probe)
        return out

    def decision_function(self, X: Any) -> np.ndarray:
        """Linear scores: [n] for regression and binary classification, [n, K] for K > 2 classes."""
        with thread_limit(self.n_threads):
            return self._decision_function(X)

    def _fit(self, X: Any, y: Any) -> LinearProbe:
        self.task_ = self._resolve_task(y)
        check_backend(self.backend)
        self._check_alpha()
        X = check_features(X)
        n, d = X.shape
        y = check_target(y, n, self._task)
        if self._task == "classification":
            classes, y_idx = check_classes(y)
        else:
            check_spread(y)
        previous = self._previous_solution() if self.warm_start else None
        if previous is not None and previous[0].shape[1] != d:
            previous = None
        if self._task == "classification":
            if previous is not None and not np.array_equal(previous[2], classes):
                previous = None
            self.classes_ = classes
        if self.backend == "torch":
            self._fit_torch(X, y_idx if self._task == "classification" else y, previous)
        else:
            self._fit_sklearn(X, y_idx if self._task == "classification" else y, previous)
        self.n_features_in_ = d
        self._sync_public_coef()
        return self

    def _decision_function(self, X: Any) -> np.ndarray:
        self._check_fitted()
        X = check_features(X, min_rows=1)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features but the probe was fit on {self.n_features_in_}")
        if self.backend == "torch":
            scores = self._scores_torch(X)
        else:
            Xn = X.detach().cpu().numpy() if isinstance(X, torch.Tensor) else X
            Xs = (Xn - self.mean_) / self.scale_
            scores = Xs @ self._w.T + self._b
        return scores[:, 0] if scores.shape[1] == 1 else scores

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities [n, K], columns in the order of `classes_` (classification only)."""
        if self._task != "classification":
            raise AttributeError("predict_proba is only available for task='classification'")
        scores = self.decision_function(X)
        if scores.ndim == 1:
            p1 = expit(scores)
            return np.stack([1.0 - p1, p1], axis=1)
        return softmax(scores, axis=1)

    def predict(self, X: Any) -> np.ndarray:
        """Predicted labels [n] (from `classes_`) or regression values [n]."""
        scores = self.decision_function(X)
        if self._task == "regression":
            return scores
        if scores.ndim == 1:
            return self.classes_[(scores > 0).astype(np.int64)]
        return self.classes_[np.argmax(scores, axis=1)]

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Accuracy (classification) or R^2 (regression), as scikit-learn's mixins define them."""
        from sklearn.metrics import accuracy_score, r2_score

        y_true = check_target(y, check_features(X, min_rows=1).shape[0], self._task)
        metric = accuracy_score if self._task == "classification" else r2_score
        return float(metric(y_true, self.predict(X), sample_weight=sample_weight))

    # -- backends -------------------------------------------------------------------------------------------
    def _fit_sklearn(self, X: Any, target: np.ndarray, previous: tuple | None) -> None:
        Xn = X.detach().cpu().numpy() if isinstance(X, torch.Tensor) else X
        if self.standardize:
            mean = Xn.mean(axis=0, dtype=np.float64)
            scale = Xn.std(axis=0, dtype=np.float64)
            Xs = ((Xn - mean) / _safe_scale(scale)).astype(Xn.dtype, copy=False)
        else:
            mean, scale, Xs = np.zeros(Xn.shape[1]), np.ones(Xn.shape[1]), Xn
        self.mean_, self.scale_ = mean, _safe_scale(scale)
        if self._task == "regression":
            est = Ridge(alpha=self.alpha * len(Xs), random_state=self.seed).fit(Xs, target)
            self._w, self._b = np.atleast_2d(est.coef_).astype(np.float64), np.atleast_1d(est.intercept_)
            self.n_iter_, self.converged_ = 0, True
            return
        est = LogisticRegression(
            C=1.0 / (self.alpha * len(Xs)),
            tol=self.tol,
            max_iter=self.max_iter,
            random_state=self.seed,
            warm_start=previous is not None,
        )
        if previous is not None:
            est.coef_, est.intercept_ = previous[0].copy(), previous[1].copy()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            est.fit(Xs, target)
        self.converged_ = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
        for w in caught:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        self._w, self._b = est.coef_.astype(np.float64), est.intercept_.astype(np.float64)
        self.n_iter_ = int(np.max(est.n_iter_))

    def _fit_torch(self, X: Any, target: np.ndarray, previous: tuple | None) -> None:
        Xs, device = self._standardized_tensor(X)
        if self._task == "regression":
            yt = torch.as_tensor(target, dtype=torch.float64, device=device)
            w, b = _torch_solvers.fit_ridge(Xs, yt, self.alpha, batch_size=self.batch_size)
            self._w, self._b = w.cpu().numpy()[None, :], np.atleast_1d(b.cpu().numpy())
            self.n_iter_, self.converged_ = 0, True
            return
        yt = torch.as_tensor(target, dtype=torch.long, device=device)
        init = None
        if previous is not None:
            init = (torch.as_tensor(previous[0], device=device), torch.as_tensor(previous[1], device=device))
        sol = _torch_solvers.fit_logistic(
            Xs,
            yt,
            len(self.classes_),
            self.alpha,
            max_iter=self.max_iter,
            tol=self.tol,
            init=init,
            batch_size=self.batch_size,
        )
        self._w = sol.weight.double().cpu().numpy()
        self._b = sol.bias.double().cpu().numpy()
        self.n_iter_, self.converged_ = sol.n_iter, sol.converged
        if not sol.converged:
            warnings.warn(
                f"torch logistic solver stopped after {sol.n_iter} iterations with max |gradient| {sol.grad_max:.2e} "
                f"> tol={self.tol}; raise max_iter, loosen tol, or increase alpha",
                ConvergenceWarning,
                stacklevel=3,
            )

    def _scores_torch(self, X: Any) -> np.ndarray:
        device = self._device_for(X)
        Xt = _to_tensor(X, device)
        mean = torch.as_tensor(self.mean_, dtype=torch.float32, device=device)
        scale = torch.as_tensor(self.scale_, dtype=torch.float32, device=device)
        W = torch.as_tensor(self._w, dtype=torch.float32, device=device)
        b = torch.as_tensor(self._b, dtype=torch.float32, device=device)
        step = _torch_solvers.chunk_rows(Xt.shape[1], W.shape[0], self.batch_size)
        out = [torch.addmm(b, (Xt[s : s + step] - mean) / scale, W.T).cpu() for s in range(0, len(Xt), step)]
        return torch.cat(out).double().numpy()

    def _device_for(self, X: Any) -> torch.device:
        if self.device is not None:
            return torch.device(self.device)
        return X.device if isinstance(X, torch.Tensor) else torch.device("cpu")

    def _standardized_tensor(self, X: Any) -> tuple[torch.Tensor, torch.device]:
        """X as float32 on the fit device, standardised; sets `mean_`, `scale_`."""
        device = self._device_for(X)
        Xt = _to_tensor(X, device)
        mean, scale = _torch_solvers.column_stats(Xt, self.batch_size)
        if self.standardize:
            scale = torch.where(scale > 0, scale, torch.ones_like(scale))
            Xs = torch.sub(Xt, mean.float()).div_(scale.float())
        else:
            mean, scale, Xs = torch.zeros_like(mean), torch.ones_like(scale), Xt
        self.mean_, self.scale_ = mean.cpu().numpy(), scale.cpu().numpy()
        return Xs, device

    # -- helpers ----------------------------------------------------------------------------------------------
    def _check_alpha(self) -> None:
        alpha = float(self.alpha)
        if not np.isfinite(alpha) or alpha < 0 or (self._task == "classification" and alpha == 0):
            need = "> 0" if self._task == "classification" else ">= 0"
            raise ValueError(f"alpha must be finite and {need} for task={self._task!r}, got {self.alpha!r}")

    def _check_fitted(self) -> None:
        if not hasattr(self, "_w"):
            raise NotFittedError("this LinearProbe is not fitted yet; call fit(X, y) first")

    def _previous_solution(self) -> tuple | None:
        if not hasattr(self, "_w"):
            return None
        return self._w, self._b, getattr(self, "classes_", None)

    def _sync_public_coef(self) -> None:
        coef = self._w / self.scale_
        intercept = self._b - coef @ self.mean_
        if self._task == "regression":
            self.coef_, self.intercept_ = coef[0], float(intercept[0])
        else:
            self.coef_, self.intercept_ = coef, intercept


def _safe_scale(scale: np.ndarray) -> np.ndarray:
    return np.where(scale > 0, scale, 1.0)


def _to_tensor(X: Any, device: torch.device) -> torch.Tensor:
    if isinstance(X, torch.Tensor):
        return X.to(device=device, dtype=torch.float32)
    return torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32)).to(device)
