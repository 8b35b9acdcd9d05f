"""Per-sentence statistics of contribution matrices, faithfulness correlations, and their group bootstrap.

Everything here takes plain tensors and returns per-sentence rows ``(method, layer, sentence, metric, sum,
count)``: a metric's value over the corpus is ``sum(sum) / sum(count)`` over sentences, so the bootstrap can
resample whole sentences (the group) with one matrix product (:func:`summarize`).

Shapes: ``b`` batch, ``L`` layer, ``q``/``k`` query/key positions.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

#: Per-sentence rows; ``sum / count`` summed over sentences is the metric's value.
PER_SENTENCE_COLUMNS = ["method", "layer", "sentence", "metric", "sum", "count"]
#: The token groups whose contribution share is reported (same punctuation as the heads experiment).
GROUPS = ("cls", "sep", "punct")
PUNCTUATION = (".", ",")


def shares(c: torch.Tensor) -> torch.Tensor:
    """Rows of ``c`` ``[..., q, k]`` divided by their sum (rows summing to 0 stay 0): each key's share."""
    total = c.sum(-1, keepdim=True)
    return torch.where(total > 0, c / total.clamp_min(1e-30), torch.zeros_like(c))


def layer_rows(
    method: str,
    c: torch.Tensor,
    mask: torch.Tensor,
    groups: Mapping[str, torch.Tensor],
    sentences: Sequence[int],
    *,
    ratio: torch.Tensor | None = None,
    layers: Sequence[int] | None = None,
) -> pd.DataFrame:
    """Per-sentence sums over real queries of the mixing ratio and of the share of each token group.

    ``c`` ``[b, L, q, k]`` contributions (padding zero); ``mask`` ``[b, q]``; ``groups``: name -> ``[b, k]``
    bool (which keys are [CLS], [SEP], punctuation); ``ratio`` ``[b, L, q]`` replaces the default mixing
    ratio ``1 - share_ii`` (used for Kobayashi et al.'s vector ratio of ``residual_norm``). ``layers``: the
    layer number of each slice of ``c`` (default ``0..L-1``). Metrics: ``mixing_ratio``, ``share_<group>``
    (mean over real queries of the summed share of the group's keys).
    """
    real = mask.bool()
    s = shares(c.double())
    if ratio is None:
        own = torch.diagonal(s, dim1=-2, dim2=-1)  # [b, L, q]
        ratio = torch.where(s.sum(-1) > 0, 1 - own, torch.zeros_like(own))
    per_query = {"mixing_ratio": ratio.double()}
    for name, keys in groups.items():
        per_query[f"share_{name}"] = (s * keys[:, None, None, :].to(s.dtype)).sum(-1)
    count = real.sum(-1).double()  # [b]
    n_layers = c.shape[1]
    layer_ids = list(range(n_layers)) if layers is None else list(layers)
    frames = []
    for metric, values in per_query.items():
        total = (values * real[:, None, :]).sum(-1)  # [b, L]
        frames.append(_rows(method, metric, total, count[:, None].expand_as(total), sentences, layer_ids))
    return pd.concat(frames, ignore_index=True)


def read_out(c_last: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Input attribution of a target that reads the output rows ``weights`` ``[b, q]`` from one layer's
    contributions ``c_last`` ``[b, q, k]``: ``sum_q weights_q * share_qk`` -> ``[b, k]``."""
    return torch.einsum("bq,bqk->bk", weights.to(c_last.dtype), shares(c_last))


def spearman_rows(
    method: str,
    attribution: torch.Tensor,
    reference: torch.Tensor,
    mask: torch.Tensor,
    sentences: Sequence[int],
    layer: int,
) -> pd.DataFrame:
    """Per-sentence Spearman correlation over real tokens between ``|attribution|`` and ``|reference|``
    (both ``[b, k]``); sentences where either side is constant are left out (the correlation is undefined)."""
    from scipy.stats import spearmanr

    a, r = attribution.detach().abs().double().cpu().numpy(), reference.detach().abs().double().cpu().numpy()
    real = mask.bool().cpu().numpy()
    values = []
    for i in range(a.shape[0]):
        x, y = a[i, real[i]], r[i, real[i]]
        if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
            values.append(np.nan)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            values.append(float(spearmanr(x, y).statistic))
    v = np.asarray(values)
    keep = np.isfinite(v)
    return pd.DataFrame(
        {
            "method": method,
            "layer": layer,
            "sentence": np.asarray(sentences)[keep],
            "metric": "spearman_vs_loo",
            "sum": v[keep],
            "count": 1.0,
        }
    )


def summarize(per_sentence: pd.DataFrame, *, n_boot: int, seed: int, ci: float = 0.95) -> pd.DataFrame:
    """``value = sum(sum) / sum(count)`` per ``(method, layer, metric)`` with a percentile group-bootstrap
    interval that resamples sentences (``probes.bootstrap.iter_resample_counts``; the same draws for every row that
    covers the same sentences, so methods are compared on paired resamples). ``n``: sentences."""
    from bertscope.probes.bootstrap import iter_resample_counts, percentile_interval

    rows = []
    draws: dict[tuple[int, ...], np.ndarray] = {}
    for (method, layer, metric), part in per_sentence.groupby(["method", "layer", "metric"], sort=False):
        part = part.sort_values("sentence")
        groups = tuple(part["sentence"].tolist())
        sums, counts = part["sum"].to_numpy(float), part["count"].to_numpy(float)
        value = sums.sum() / counts.sum() if counts.sum() > 0 else np.nan
        if groups not in draws:
            draws[groups] = np.concatenate(list(iter_resample_counts(len(groups), n_boot, seed)), axis=0).astype(float)
        b = draws[groups]
        with np.errstate(invalid="ignore", divide="ignore"):
            boot = (b @ sums) / (b @ counts)
        low, high = percentile_interval(boot, ci)
        rows.append({"method": method, "layer": int(layer), "metric": metric, "value": float(value),
                     "ci_low": float(low), "ci_high": float(high), "n": len(groups)})  # fmt: skip
    return pd.DataFrame(rows, columns=["method", "layer", "metric", "value", "ci_low", "ci_high", "n"])


def token_groups(ids: torch.Tensor, mask: torch.Tensor, tokenizer) -> dict[str, torch.Tensor]:
    """``{"cls", "sep", "punct"}`` -> ``[b, k]`` bool masks of the real keys of each group."""
    vocab = tokenizer.get_vocab()
    punct = [vocab[p] for p in PUNCTUATION if p in vocab]
    real = mask.bool()
    return {
        "cls": (ids == tokenizer.cls_token_id) & real,
        "sep": (ids == tokenizer.sep_token_id) & real,
        "punct": torch.isin(ids, torch.tensor(punct, dtype=ids.dtype, device=ids.device)) & real,
    }


def _rows(method, metric, total, count, sentences, layer_ids) -> pd.DataFrame:
    b, n_layers = total.shape
    return pd.DataFrame(
        {
            "method": method,
            "layer": np.tile(np.asarray(layer_ids), b),
            "sentence": np.repeat(np.asarray(sentences), n_layers),
            "metric": metric,
            "sum": total.cpu().numpy().reshape(-1),
            "count": count.cpu().numpy().reshape(-1),
        }
    )
