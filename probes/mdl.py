"""Minimum description length probing (Voita & Titov 2020), online (prequential) code.

The rows are put in a random order (whole groups together, when groups are given) and cut at doubling
boundaries t_0 < t_1 < ... < t_m = n, with t_j ~ n / 2^(m - j) (by default m = 10: 0.1%, 0.2%, ..., 50%,
100%). As in Voita & Titov's definition, the first block is sent with the uniform code; block j+1 is sent
with a probe trained on the first t_j rows, and costs the cross-entropy (in bits) of its labels under that
probe. The online codelength is the total in bits; compression = uniform codelength / online codelength, so
1 means the probe saved nothing and larger is better.

**Regularisation is chosen from the prefix only**, so the code stays a real online code (a receiver can
repeat every choice): with a grid of alphas (the default, `DEFAULT_ALPHAS` on the mean loss), every
probe-coded block but the last is coded by a probe per alpha, and the block j+1 is sent with the alpha whose
probes gave the shortest total codelength on the blocks already sent (follow the leader; the strongest L2
when there is no history yet or on ties). Choosing alpha after seeing all blocks (or fixing the alpha that
was tuned for accuracy on all rows) is not a code: it can make a learnable label look worse than uniform (a
weak L2 on a tiny prefix) or flatter a probe with information from the rows it codes.

Every code used is a proper (sub-)probability, so every codelength is a real, achievable one:
- a probe's class probabilities are mixed with the uniform distribution, p = (1 - eps) p_probe + eps / K, so
  classes absent from a training prefix stay codable;
- a prefix holding a single class (or a single row) cannot train a probe; that block is sent with the
  label-frequency code below (marked `model="prior"` in the block table);
- the label-frequency ("prior") code, reported beside the probe's, predicts each block from the label counts
  of the prefix, (count + 1) / (t + K): it is what a probe gets for free from unbalanced labels.

Regression targets are coded as bins of width `precision` covering [min y, max y] (uniform code: log2 of the
number of bins per row); the probe's code is a Gaussian around its prediction with the prefix's residual
variance, integrated over the bin and mixed with the uniform code as above; the prior code is a Gaussian with
the prefix's mean and variance.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy.special import ndtr
from sklearn.exceptions import ConvergenceWarning

from ._checks import check_backend, check_classes, check_features, check_groups, check_target, check_task
from .estimator import LinearProbe, _to_tensor
from .evaluate import DEFAULT_ALPHAS, _alpha_grid


def mdl_probe(
    X: Any,
    y: Any,
    groups: Any = None,
    *,
    task: str = "classification",
    seed: int = 0,
    alpha: float | Sequence[float] | None = None,
    backend: str = "sklearn",
    device: str | torch.device | None = None,
    control: Any = None,
    n_blocks: int = 10,
    epsilon: float = 1e-3,
    precision: float | None = None,
    standardize: bool = True,
    max_iter: int = 1000,
    tol: float = 1e-4,
    n_threads: int | None = None,
) -> dict[str, Any]:
    """Online codelength of y given X with a linear probe, and of `control` labels if given.

    X: [n, d]; y: [n]; groups: [n] sentence/document ids (kept together and never split by a block boundary)
    or None (rows are independent). alpha: the probe's L2 strength on the mean loss (`LinearProbe`): None =
    choose per block from `DEFAULT_ALPHAS` on the prefix (module docstring); a list = choose from that grid;
    a number = that alpha for every block (a valid code only if it was not tuned on these rows).
    n_blocks: number of doublings (first block ~ n / 2^n_blocks rows). epsilon: weight of the uniform
    code mixed into the probe's predictions. precision: regression bin width (None: 1 for integer targets,
    else (max - min) / 1000). n_threads: thread cap for the fits (see `LinearProbe`).

    Returns a dict: `online_codelength`, `uniform_codelength`, `prior_codelength` (bits), `compression`
    (uniform / online), `prior_compression` (uniform / prior), `n`, `alphabet_size` (classes or bins),
    `alpha` (the last block's), `alphas` (the grid), `blocks` (DataFrame: start, end, n_train, bits,
    uniform_bits, prior_bits, model, alpha: the alpha that coded the block, NaN if no probe did),
    `order` ([n] the row order used); with `control`, `control` holds the same dict for the control labels;
    `table` is a long DataFrame (labels, metric, value) of the scalar results.

    Over 60 lines through its signature and docstring; the body orders the rows, cuts the blocks and codes
    the labels (and the control labels) with `_codelength`.
    """
    check_task(task)
    check_backend(backend)
    if not 0 < epsilon < 1:
        raise ValueError(f"epsilon must be in (0, 1), got {epsilon}")
    if n_blocks < 1:
        raise ValueError(f"n_blocks must be >= 1, got {n_blocks}")
    grid = _alpha_grid_or_default(alpha)
    X = check_features(X)
    n = X.shape[0]
    y = check_target(y, n, task)
    order, ends = _transmission_order(n, groups, seed)
    bounds = _block_bounds(n, n_blocks, ends)
    if backend == "torch":
        X = _to_tensor(X, torch.device(device) if device is not None else torch.device("cpu"))
        Xo = X[torch.as_tensor(order, device=X.device)]
    else:
        Xo = X[order]
    probe = LinearProbe(task=task, alpha=grid[0], standardize=standardize, backend=backend, device=device,
                        max_iter=max_iter, seed=seed, tol=tol, warm_start=True, n_threads=n_threads)  # fmt: skip
    result = _codelength(Xo, y[order], bounds, probe, grid, task, epsilon, precision, name="y")
    result["order"] = order
    labelled = {"task": result}
    if control is not None:
        yc = check_target(control, n, task, name="control")
        control_probe = probe.__class__(**probe.get_params())
        result["control"] = _codelength(Xo, yc[order], bounds, control_probe, grid, task, epsilon, precision,
                                        name="control")  # fmt: skip
        result["control"]["order"] = order
        labelled["control"] = result["control"]
    metrics = ["online_codelength", "uniform_codelength", "prior_codelength", "compression", "prior_compression"]
    result["table"] = pd.DataFrame([{"labels": k, "metric": m, "value": r[m]} for k, r in labelled.items()
                                    for m in metrics])  # fmt: skip
    return result


def _transmission_order(n: int, groups: Any, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows' random transmission order [n] (whole groups together when `groups` is given) and the row
    counts at which a group ends in that order (every row when there are no groups)."""
    rng = np.random.default_rng([seed, 2])
    if groups is None:
        return rng.permutation(n), np.arange(1, n + 1)
    group_idx, n_groups = check_groups(groups, n)
    group_order = rng.permutation(n_groups)
    rank = np.empty(n_groups, dtype=np.int64)
    rank[group_order] = np.arange(n_groups)
    order = np.argsort(rank[group_idx], kind="stable")
    return order, np.cumsum(np.bincount(group_idx, minlength=n_groups)[group_order])


def _target_codes(y: np.ndarray, task: str, precision: float | None,
                  name: str) -> tuple[np.ndarray | None, np.ndarray, np.ndarray | None, int, float | None]:  # fmt: skip
    """What is transmitted for each row of y [n]: (classes or None, codes [n] (class index or regression
    bin), bin centers [n] or None, alphabet size, the regression bin width or None)."""
    if task == "classification":
        classes, codes = check_classes(y, name=name)
        return classes, codes, None, len(classes), precision
    precision = _default_precision(y) if precision is None else float(precision)
    if not precision > 0:
        raise ValueError(f"precision must be > 0, got {precision}")
    codes = np.rint((y - y.min()) / precision).astype(np.int64)  # the bin each target is sent as
    alphabet = int(codes.max()) + 1
    if alphabet < 2:
        raise ValueError(f"{name} spans a single bin: there is nothing to code; check the target or precision")
    return None, codes, y.min() + codes * precision, alphabet, precision


def _block_probability(fitted: Any, X: Any, y: np.ndarray, codes: np.ndarray, classes: np.ndarray | None,
                       centers: np.ndarray | None, start: int, end: int, alphabet: int,
                       precision: float | None) -> np.ndarray:  # fmt: skip
    """The probability [end - start] a probe fitted on rows [0, start) gives each row of the block its
    transmitted code: its class probability, or for regression the mass of the target's bin under a
    Gaussian around the prediction with the prefix's residual spread."""
    block = slice(start, end)
    if classes is not None:
        proba = np.zeros((end - start, alphabet))
        proba[:, np.searchsorted(classes, fitted.classes_)] = fitted.predict_proba(X[block])
        return proba[np.arange(end - start), codes[block]]
    residual = fitted.predict(X[:start]) - y[:start]
    sigma = max(float(np.sqrt(np.mean(residual**2))), precision)
    return _gauss_bin(centers[block], fitted.predict(X[block]), sigma, precision)


def _block_bounds(n: int, n_blocks: int, ends: np.ndarray) -> np.ndarray:
    """Block boundaries [0, t_0, ..., n]: doubling targets n / 2^j snapped up to the next group end."""
    targets = np.ceil(n / 2.0 ** np.arange(n_blocks, -1, -1)).astype(np.int64)
    snapped = ends[np.searchsorted(ends, targets, side="left").clip(max=len(ends) - 1)]
    return np.unique(np.concatenate([[0], snapped, [n]]))


def _codelength(
    X: Any,
    y: np.ndarray,
    bounds: np.ndarray,
    probe: LinearProbe,
    grid: list[float],
    task: str,
    epsilon: float,
    precision: float | None,
    *,
    name: str,
) -> dict[str, Any]:
    """Prequential codelength of y [n] (rows already in transmission order) cut at `bounds`."""
    classes, codes, centers, alphabet, precision = _target_codes(y, task, precision, name)
    per_row = np.log2(alphabet)

    def mixed_bits(p: np.ndarray) -> float:
        return float(-np.log2((1 - epsilon) * p + epsilon / alphabet).sum())

    first = int(bounds[1])
    rows = [dict(start=0, end=first, n_train=0, bits=first * per_row, uniform_bits=first * per_row,
                 prior_bits=first * per_row, model="uniform", alpha=np.nan)]  # fmt: skip
    strongest_first = sorted(grid, reverse=True)
    history = dict.fromkeys(grid, 0.0)  # bits each alpha's probes spent on the blocks already sent
    seen_probe_block = False
    n_bounds = len(bounds)
    for index, (start, end) in enumerate(zip(bounds[1:-1], bounds[2:], strict=True)):
        last_block = index == n_bounds - 3
        start, end = int(start), int(end)
        block = slice(start, end)
        if task == "classification":
            counts = np.bincount(codes[:start], minlength=alphabet)
            prior = float(-np.log2((counts[codes[block]] + 1.0) / (start + alphabet)).sum())
        else:
            sigma = max(float(np.std(y[:start])), precision)
            prior = mixed_bits(_gauss_bin(centers[block], np.full(end - start, y[:start].mean()), sigma, precision))
        if start < 2 or (task == "classification" and np.count_nonzero(np.bincount(codes[:start])) < 2):
            rows.append(dict(start=start, end=end, n_train=start, bits=prior, uniform_bits=(end - start) * per_row,
                             prior_bits=prior, model="prior", alpha=np.nan))  # fmt: skip
            continue
        # the alpha is fixed before this block is seen: best total on the blocks sent so far (ties and no
        # history: the strongest L2, which is min() over the grid sorted strongest first)
        chosen = min(strongest_first, key=lambda a: history[a]) if seen_probe_block else strongest_first[0]
        candidates = [chosen] if last_block else grid  # the last block's other alphas would never be used
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # an imperfect fit only costs bits
            fits = probe.fit_path(X[:start], y[:start], candidates)
        bits_by_alpha = {a: mixed_bits(_block_probability(fitted, X, y, codes, classes, centers, start, end,
                                                          alphabet, precision))
                         for a, fitted in zip(candidates, fits, strict=True)}  # fmt: skip
        if not last_block:
            for a in grid:
                history[a] += bits_by_alpha[a]
        seen_probe_block = True
        rows.append(dict(start=start, end=end, n_train=start, bits=bits_by_alpha[chosen],
                         uniform_bits=(end - start) * per_row, prior_bits=prior, model="probe",
                         alpha=chosen))  # fmt: skip
    return _codelength_summary(pd.DataFrame(rows), len(y), alphabet, grid)


def _codelength_summary(blocks: pd.DataFrame, n: int, alphabet: int, grid: list[float]) -> dict[str, Any]:
    """`_codelength`'s result from its block table (start, end, n_train, bits, uniform_bits, prior_bits,
    model, alpha)."""
    online, uniform, prior = blocks.bits.sum(), blocks.uniform_bits.sum(), blocks.prior_bits.sum()
    return {
        "online_codelength": float(online),
        "uniform_codelength": float(uniform),
        "prior_codelength": float(prior),
        "compression": float(uniform / online),
        "prior_compression": float(uniform / prior),
        "n": n,
        "alphabet_size": alphabet,
        "alpha": float(blocks.alpha.dropna().iloc[-1]) if blocks.alpha.notna().any() else float("nan"),
        "alphas": list(grid),
        "blocks": blocks,
    }


def _alpha_grid_or_default(alpha: float | Sequence[float] | None) -> list[float]:
    return _alpha_grid(DEFAULT_ALPHAS if alpha is None else alpha)


def _gauss_bin(centers: np.ndarray, mean: np.ndarray, sigma: float, precision: float) -> np.ndarray:
    """Mass of N(mean, sigma^2) [m] on each bin [center - precision/2, center + precision/2] [m]."""
    half = precision / 2
    # mirror the upper tail onto the lower one, where ndtr differences keep their precision
    z = np.abs(centers - mean)
    return ndtr((half - z) / sigma) - ndtr((-half - z) / sigma)


def _default_precision(y: np.ndarray) -> float:
    if np.all(y == np.rint(y)):
        return 1.0
    return float((y.max() - y.min()) / 1000.0)
