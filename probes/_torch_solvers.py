"""Torch solvers behind `LinearProbe(backend="torch")`: float32, any device, memory bounded by row chunks.

Objectives (sums over rows; scikit-learn's conventions, so both backends have the same minimiser):

- logistic:  sum_i CE(softmax(W x_i + b), y_i) + alpha/2 * ||W||^2   (binary: one logit, sigmoid)
- ridge:     sum_i (y_i - w x_i - b)^2 + alpha * ||w||^2

The logistic loss and its gradient are written out by hand and accumulated over row chunks, so neither the
full `[n, classes]` logit matrix nor an autograd graph is ever held; L-BFGS (torch.optim.LBFGS, strong-Wolfe
line search, history 10, as scipy's in scikit-learn) minimises the objective divided by n, and stops when the
largest gradient entry falls below `tol` (scikit-learn's `gtol`). Ridge is solved in closed form from the
`[d, d]` Gram matrix, accumulated chunk by chunk and solved in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Rows per chunk are chosen so one chunk's float32 logits plus features stay near this many bytes.
_CHUNK_BYTES = 64 * 2**20


@dataclass
class LogisticSolution:
    weight: torch.Tensor  # [k, d] with k = 1 for binary problems, else n_classes
    bias: torch.Tensor  # [k]
    n_iter: int
    grad_max: float  # largest |gradient| entry of the (1/n-scaled) objective at the solution
    converged: bool


def chunk_rows(n_features: int, n_outputs: int, batch_size: int | None) -> int:
    if batch_size is not None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be a positive number of rows, got {batch_size}")
        return int(batch_size)
    return max(1024, _CHUNK_BYTES // (4 * (n_features + 2 * n_outputs)))


def column_stats(X: torch.Tensor, batch_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-column mean and population std of X [n, d] in float64, two passes over row chunks."""
    n, d = X.shape
    step = chunk_rows(d, 1, batch_size)
    total = torch.zeros(d, dtype=torch.float64, device=X.device)
    for s in range(0, n, step):
        total += X[s : s + step].double().sum(0)
    mean = total / n
    sq = torch.zeros(d, dtype=torch.float64, device=X.device)
    for s in range(0, n, step):
        sq += (X[s : s + step].double() - mean).square().sum(0)
    return mean, (sq / n).sqrt()


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
    """Multinomial (or binary) L2 logistic regression by full-batch L-BFGS.

    X: [n, d] float32 (already standardised if wanted); y: [n] long class indices in 0..n_classes-1.
    init: optional (weight [k, d], bias [k]) warm start.
    """
    n, d = X.shape
    k = 1 if n_classes == 2 else n_classes
    params = torch.zeros(k, d + 1, dtype=torch.float32, device=X.device)
    if init is not None and tuple(init[0].shape) == (k, d):
        params[:, :d] = init[0].to(params)
        params[:, d] = init[1].to(params)
    params.requires_grad_(True)
    step = chunk_rows(d, k, batch_size)
    last = {"grad_max": float("inf")}

    def closure() -> float:
        loss, grad = _logistic_loss_grad(params.detach(), X, y, alpha, step)
        params.grad = grad
        last["grad_max"] = float(grad.abs().max())
        return loss

    opt = torch.optim.LBFGS(
        [params],
        lr=1.0,
        max_iter=max_iter,
        max_eval=max(int(max_iter * 1.25), max_iter + 1),
        tolerance_grad=tol,
        tolerance_change=1e-12,
        history_size=10,
        line_search_fn="strong_wolfe",
    )
    opt.step(closure)
    n_iter = int(opt.state[opt._params[0]].get("n_iter", 0))
    final = params.detach()
    return LogisticSolution(
        weight=final[:, :d].clone(),
        bias=final[:, d].clone(),
        n_iter=n_iter,
        grad_max=last["grad_max"],
        converged=last["grad_max"] <= tol,
    )


def fit_ridge(
    X: torch.Tensor, y: torch.Tensor, alpha: float, *, batch_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form ridge with an unpenalised intercept. X: [n, d] float32; y: [n]. Returns (w [d], b [])."""
    n, d = X.shape
    step = chunk_rows(d, 1, batch_size)
    x_mean = torch.zeros(d, dtype=torch.float64, device=X.device)
    for s in range(0, n, step):
        x_mean += X[s : s + step].double().sum(0)
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
    gram.diagonal().add_(alpha)
    w = torch.linalg.solve(gram, rhs)
    b = y_mean - x_mean @ w
    return w, b


def _logistic_loss_grad(
    params: torch.Tensor, X: torch.Tensor, y: torch.Tensor, alpha: float, step: int
) -> tuple[float, torch.Tensor]:
    """(objective / n, gradient [k, d+1]) for params = [W | b], accumulated over row chunks."""
    n, d = X.shape
    W, b = params[:, :d], params[:, d]
    binary = params.shape[0] == 1
    grad = torch.zeros_like(params)
    gW, gb = grad[:, :d], grad[:, d]
    loss = 0.0
    for s in range(0, n, step):
        xc, yc = X[s : s + step], y[s : s + step]
        z = torch.addmm(b, xc, W.T)  # [m, k] logits
        if binary:
            yf = yc.to(z.dtype)[:, None]
            loss += float((torch.nn.functional.softplus(z) - yf * z).sum(dtype=torch.float64))
            g = torch.sigmoid(z).sub_(yf)
        else:
            lse = torch.logsumexp(z, dim=1)
            loss += float((lse - z.gather(1, yc[:, None])[:, 0]).sum(dtype=torch.float64))
            g = z.sub_(lse[:, None]).exp_()  # softmax, in place
            g.scatter_add_(1, yc[:, None], torch.full((len(yc), 1), -1.0, dtype=g.dtype, device=g.device))
        gW.addmm_(g.T, xc)
        gb += g.sum(0)
    loss += 0.5 * alpha * float(W.double().square().sum())
    gW.add_(W, alpha=alpha)
    grad /= n
    return loss / n, grad
