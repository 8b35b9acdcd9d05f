"""Reconstruction and sparsity metrics of a dictionary, overall and per token class.

Two families, both on rows ``x [n, d]`` (the dictionary's target), reconstructions ``x_hat [n, d]`` and latent
activations ``f [n, d_sae]``:

- :func:`reconstruction_metrics`: the definitions bertscope reports (written out in each docstring);
- :func:`saelens_metrics`: SAELens 6.x ``evals.get_sparsity_and_variance_metrics`` on one evaluation batch, term
  for term, quirks included (its ``mse`` divides each row's squared error by the batch's row count, and its
  ``explained_variance`` subtracts the squared mean of per-dimension second moments, not of the means), so that
  a number can be compared with one SAELens printed. ``tests/probes/test_dictionary_metrics.py`` pins both.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch


@torch.no_grad()
def reconstruction_metrics(x: torch.Tensor, x_hat: torch.Tensor, f: torch.Tensor) -> dict[str, float]:
    """bertscope's metrics of one set of rows (float64 sums):

    - ``l0``: mean number of active latents per row (``f > 0``); ``l1``: mean ``sum_i f_i``;
    - ``mse``: mean squared error per element, ``mean_rows,d (x - x_hat)^2``;
    - ``explained_variance``: ``1 - sum ||x - x_hat||^2 / sum ||x - mean(x)||^2`` (residual variance over total
      variance; the correct form of SAELens's ``explained_variance``);
    - ``cosine``: mean over rows of ``cos(x, x_hat)``;
    - ``relative_reconstruction_bias``: ``mean ||x_hat||^2 / mean <x, x_hat>`` (Wright & Sharkey, eq. 10 of
      arXiv:2404.16014; dictionary_learning and SAELens compute the same): 1 is unbiased, < 1 shrinkage;
    - ``l2_ratio``: mean ``||x_hat|| / ||x||``;
    - ``n_tokens``.
    """
    x, x_hat, f = x.double(), x_hat.double(), f.double()
    n = x.shape[0]
    if n == 0:
        return {"n_tokens": 0}
    resid = (x - x_hat).pow(2).sum(-1)
    total = (x - x.mean(0)).pow(2).sum(-1).sum()
    norm_in, norm_out = x.norm(dim=-1), x_hat.norm(dim=-1)
    return {
        "l0": float((f > 0).sum(-1).double().mean()),
        "l1": float(f.sum(-1).mean()),
        "mse": float(resid.mean() / x.shape[1]),
        "explained_variance": float(1 - resid.sum() / total) if total > 0 else float("nan"),
        "cosine": float(torch.nn.functional.cosine_similarity(x, x_hat, dim=-1).mean()),
        "relative_reconstruction_bias": float(norm_out.pow(2).mean() / (x * x_hat).sum(-1).mean()),
        "l2_ratio": float((norm_out / norm_in.clamp_min(1e-12)).mean()),
        "n_tokens": int(n),
    }


@torch.no_grad()
def saelens_metrics(x: torch.Tensor, x_hat: torch.Tensor, f: torch.Tensor) -> dict[str, float]:
    """SAELens 6.18 ``get_sparsity_and_variance_metrics`` for one batch of (already masked) rows, term for term:

    ``l2_norm_in/out`` mean row norms; ``l2_ratio`` mean ``||x_hat|| / ||x||`` (norms below 1e-4 divide by 1);
    ``relative_reconstruction_bias`` ``mean ||x_hat||^2 / mean <x, x_hat>``; ``l0`` mean ``sum (f > 0)``; ``l1``
    mean ``sum f``; ``mse`` mean over rows of ``||x - x_hat||^2 / n`` (n = rows in the batch);
    ``explained_variance_legacy`` mean over rows of ``1 - ||x - x_hat||^2 / ||x - mean(x)||^2``;
    ``explained_variance`` ``1 - mean ||x - x_hat||^2 / (mean ||x||^2 - m^2)`` with ``m`` the mean over
    dimensions of ``mean_rows x_d^2``; ``cossim`` mean row cosine. Computed in the inputs' dtype, as SAELens.
    """
    n = x.shape[0]
    norm_in, norm_out = x.norm(dim=-1), x_hat.norm(dim=-1)
    norm_div = norm_in.clone()
    norm_div[norm_div.abs() < 1e-4] = 1
    resid = (x - x_hat).pow(2).sum(-1)
    batched_var = (x - x.mean(0)).pow(2).sum(-1)
    mean_sum_sq = x.pow(2).sum(-1).mean(0)
    mean_act_per_dim = x.pow(2).mean(0).mean(0)
    total_variance = mean_sum_sq - mean_act_per_dim**2
    cossim = ((x / x.norm(dim=-1, keepdim=True)) * (x_hat / x_hat.norm(dim=-1, keepdim=True))).sum(-1)
    return {
        "l2_norm_in": float(norm_in.mean()),
        "l2_norm_out": float(norm_out.mean()),
        "l2_ratio": float((norm_out / norm_div).mean()),
        "relative_reconstruction_bias": float(x_hat.norm(dim=-1).pow(2).mean() / (x * x_hat).sum(-1).mean()),
        "l0": float((f > 0).sum(-1).float().mean()),
        "l1": float(f.sum(-1).mean()),
        "mse": float((resid / n).mean()),
        "explained_variance_legacy": float((1 - resid / batched_var).mean()),
        "explained_variance": float(1 - resid.mean(0) / total_variance),
        "cossim": float(cossim.mean()),
    }


@torch.no_grad()
def latent_statistics(f: torch.Tensor, *, dense_threshold: float = 0.1) -> dict[str, float | np.ndarray]:
    """Per-latent firing on ``f [n, d_sae]``: ``density`` ``[d_sae]`` (fraction of rows where the latent is
    active, SAELens's ``feature_density``), ``dead_fraction`` (latents never active on these rows),
    ``dense_fraction`` (latents active on more than ``dense_threshold`` of rows), ``mean_log10_density`` (over
    live latents)."""
    density = (f > 0).double().mean(0).cpu().numpy() if f.shape[0] else np.zeros(f.shape[1])
    live = density > 0
    return {
        "density": density,
        "dead_fraction": float((~live).mean()),
        "dense_fraction": float((density > dense_threshold).mean()),
        "mean_log10_density": float(np.log10(density[live]).mean()) if live.any() else float("nan"),
    }


def metrics_table(x: torch.Tensor, x_hat: torch.Tensor, f: torch.Tensor, token_class: Sequence[str] | None = None,
                  *, dense_threshold: float = 0.1) -> pd.DataFrame:
    """Long table (``token_class``, ``metric``, ``value``): :func:`reconstruction_metrics` and the latent
    fractions of :func:`latent_statistics`, for all rows (``token_class == "all"``) and for each token class."""
    classes = np.asarray(token_class if token_class is not None else ["all"] * x.shape[0], dtype=object)
    groups = [("all", np.ones(len(classes), dtype=bool))]
    if token_class is not None:
        groups += [(str(c), classes == c) for c in sorted(set(classes.tolist()))]
    rows = []
    for name, mask in groups:
        idx = torch.from_numpy(np.flatnonzero(mask))
        m = reconstruction_metrics(x[idx], x_hat[idx], f[idx])
        if m["n_tokens"]:
            stats = latent_statistics(f[idx], dense_threshold=dense_threshold)
            m.update({k: v for k, v in stats.items() if k != "density"})
        rows += [{"token_class": name, "metric": k, "value": float(v)} for k, v in m.items()]
    return pd.DataFrame(rows)
