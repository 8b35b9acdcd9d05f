"""Per-pair effects -> the tidy node table every circuits step returns, and the pair batching they share."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd
import torch
from bertscope.hooks.circuits.table import DEFAULTS
from bertscope.hooks.naming import head_name

INTERVAL = "95% percentile bootstrap over pairs (resampling pairs: the variance of the pair sample)"


def chunks(n: int, batch_size: int) -> Iterator[torch.Tensor]:
    """Row indices ``[k]`` of consecutive batches of at most ``batch_size`` pairs."""
    for start in range(0, n, batch_size):
        yield torch.arange(start, min(n, start + batch_size))


def by_length(mask: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """Row indices of batches of at most ``batch_size`` pairs, the pairs taken shortest first (``mask [n, pos]``,
    their attention mask): each batch is trimmed to its longest pair, so grouping similar lengths saves the padded
    positions' work. Per-pair outputs are put back in task order by :func:`in_task_order`."""
    order = torch.argsort(mask.sum(1), stable=True)
    return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]


def in_task_order(parts: Sequence[torch.Tensor], rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-batch outputs ``parts`` (first dimension = the batch's pairs ``rows``) -> one tensor in task order."""
    out, idx = torch.cat(list(parts)), torch.cat(list(rows))
    res = torch.empty_like(out)
    res[idx.to(out.device)] = out
    return res


HEAD_PARTS = ("queries", "keys", "values")
"""Per-head node kinds inside attention: all positions of one head's queries, keys or values (``attn.hook_q`` ...)."""

NODE_SITES = {"heads": "attn.hook_z", "queries": "attn.hook_q", "keys": "attn.hook_k", "values": "attn.hook_v",
              "mlps": "hook_mlp_out"}
"""The hook (within block L) each patchable node kind lives at; ``resid`` nodes are ``hook_resid_pre``."""


def node_labels(kind: str, n_layers: int, n_heads: int, positions: bool = False) -> list[tuple[str, int, int]]:
    """``(node, layer, head)`` of every node of ``kind`` ("heads" | "queries" | "keys" | "values" | "mlps" |
    "resid"); head is -1 where none. Heads are named ``L{L}H{h}`` (``hooks.naming.head_name``), a head's query,
    key and value nodes ``L{L}H{h}.q`` (``.k``, ``.v``)."""
    if kind == "heads":
        return [(head_name(L, h), L, h) for L in range(n_layers) for h in range(n_heads)]
    if kind in HEAD_PARTS:
        return [(f"{head_name(L, h)}.{kind[0]}", L, h) for L in range(n_layers) for h in range(n_heads)]
    if kind == "mlps":
        return [(f"m{L}", L, -1) for L in range(n_layers)]
    return [(f"resid{L}", L, -1) for L in range(n_layers + 1)]


def effects_table(
    effects: np.ndarray,
    total: np.ndarray,
    labels: Sequence[tuple[str, int, int]],
    *,
    method: str,
    n_boot: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """``effects [n_pairs, n_nodes]`` (per pair, metric change when the node is patched) and ``total [n_pairs]``
    (``m(corrupted) - m(clean)``) -> one row per node: ``effect`` (mean over pairs), ``normalised`` (sum of
    effects / sum of totals: the share of the clean->corrupted change the node carries) and their intervals (NaN,
    with ``interval`` saying so, below ``table.DEFAULTS.min_pairs`` pairs: one pair has no spread to resample)."""
    from bertscope.probes.bootstrap import ratio_of_sums

    eff = np.asarray(effects, dtype=np.float64)
    tot = np.asarray(total, dtype=np.float64)
    n = eff.shape[0]
    mean = ratio_of_sums(eff, np.ones((n, 1)), n_boot=n_boot, seed=seed)
    norm = ratio_of_sums(eff, tot[:, None], n_boot=n_boot, seed=seed)
    rows = pd.DataFrame(labels, columns=["node", "layer", "head"])
    rows.insert(0, "method", method)
    rows["effect"], rows["effect_low"], rows["effect_high"] = mean.value, mean.low, mean.high
    rows["normalised"], rows["normalised_low"], rows["normalised_high"] = norm.value, norm.low, norm.high
    rows["n_pairs"] = n
    rows["interval"] = INTERVAL
    if n < DEFAULTS.min_pairs:
        for col in ("effect_low", "effect_high", "normalised_low", "normalised_high"):
            rows[col] = np.nan
        rows["interval"] = f"none: {n} pair(s), an interval over pairs needs at least {DEFAULTS.min_pairs}"
    return rows
