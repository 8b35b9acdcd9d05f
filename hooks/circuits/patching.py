"""Exact activation patching of nodes: a head's output, its queries, keys or values, an MLP's output, the residual
stream at one position.

Each node's effect is ``m(clean run with the node set to its source value) - m(clean)`` per pair, source =
the corrupted run (activation patching), zero, or the mean over the task's clean runs (mean ablation). Heads of
one layer are patched together in one batched forward from that layer on (``forward_from``, the batch repeated
once per head, copy h patching head h), so all heads of a model take one forward per layer.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from bertscope.hooks.circuits.results import (
    HEAD_PARTS,
    NODE_SITES,
    by_length,
    chunks,
    effects_table,
    in_task_order,
    node_labels,
)
from bertscope.hooks.circuits.tasks import Task
from einops import rearrange, repeat

Source = Literal["corrupted", "zero", "mean"]
NODE_KINDS = ("heads", *HEAD_PARTS, "mlps", "resid")


@torch.no_grad()
def metric_values(model: Any, task: Task, which: str = "clean", batch_size: int = 32) -> np.ndarray:
    """``m`` per pair of the unmodified model on the clean or corrupted texts ``[n_pairs]``."""
    out, order = [], by_length(task.mask, batch_size)
    for rows in order:
        batch = task.batch(rows, which)
        out.append(task.metric(model(**batch), batch["attention_mask"], rows).double().cpu())
    return in_task_order(out, order).numpy()


def patch(
    model: Any,
    task: Task,
    nodes: str = "heads",
    *,
    source: Source = "corrupted",
    positions: torch.Tensor | None = None,
    batch_size: int = 16,
    n_boot: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """Exact patching of every node of kind ``nodes`` ("heads" | "queries" | "keys" | "values" | "mlps" | "resid")
    -> a tidy table. A head's ``queries`` (``keys``, ``values``) node is that head's ``hook_q`` (``hook_k``,
    ``hook_v``) at every position, the rest of the layer recomputed from it: the nodes AtP* estimates one by one.

    ``source``: "corrupted" (the corrupted run's value), "zero", or "mean" (its mean over real tokens of the
    task's clean runs). ``resid`` nodes (``resid{L}``: block L's input, ``resid{n_layers}``: the final hidden state)
    patch one position per pair, ``positions [n_pairs]``, from the corrupted run. Columns: ``method`` ("exact"),
    ``node``, ``layer``, ``head`` (-1 for non-heads), ``effect`` (mean over pairs of ``m(patched) - m(clean)``),
    ``normalised`` (the effect as a share of ``m(corrupted) - m(clean)``), their intervals (column ``interval``
    says which), ``n_pairs``."""
    effects, total = patch_effects(model, task, nodes, source=source, positions=positions, batch_size=batch_size)
    labels = node_labels(nodes, model.config.n_layers, model.config.n_heads)
    table = effects_table(effects, total, labels, method="exact", n_boot=n_boot, seed=seed)
    table.insert(1, "source", source)
    return table


def exact_effects(model: Any, task: Task, nodes: str = "heads", *, steps: int = 0, batch_size: int = 16
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Exact patching as the node table's ``exact`` entry calls it: :func:`patch_effects` from the corrupted run
    (``steps`` unused)."""
    return patch_effects(model, task, nodes, batch_size=batch_size)


@torch.no_grad()
def patch_effects(
    model: Any,
    task: Task,
    nodes: str = "heads",
    *,
    source: Source = "corrupted",
    positions: torch.Tensor | None = None,
    batch_size: int = 16,
) -> tuple[np.ndarray, np.ndarray]:
    """``(effects [n_pairs, n_nodes], total [n_pairs])``: what :func:`patch` tabulates."""
    if nodes not in NODE_KINDS:
        raise ValueError(f"nodes must be one of {NODE_KINDS}, got {nodes!r}")
    if source not in ("corrupted", "zero", "mean"):
        raise ValueError(f"source must be 'corrupted', 'zero' or 'mean', got {source!r}")
    if nodes == "resid" and (positions is None or source != "corrupted"):
        raise ValueError("resid nodes need positions [n_pairs] and source='corrupted'")
    n = model.config.n_layers
    means = _means(model, task, nodes, batch_size) if source == "mean" else None
    effects, totals, order = [], [], by_length(task.mask, batch_size)
    for rows in order:
        clean, corr = task.batch(rows, "clean"), task.batch(rows, "corrupted")
        mask = clean["attention_mask"]
        names = ["blocks.*.hook_resid_pre", *([f"blocks.*.{NODE_SITES[nodes]}"] if nodes in NODE_SITES else [])]
        out_c, cc = model.run_with_cache(**clean, names_filter=names)
        out_k, ck = model.run_with_cache(**corr, names_filter=names)
        m_clean = task.metric(out_c, mask, rows)
        totals.append((task.metric(out_k, mask, rows) - m_clean).double().cpu())
        per_layer = []
        if nodes == "resid":
            pos = positions[rows].to(mask.device)
            for layer in range(n + 1):
                if layer == n:
                    hidden = _put_position(out_c, out_k, pos)
                else:
                    x = _put_position(cc[f"blocks.{layer}.hook_resid_pre"], ck[f"blocks.{layer}.hook_resid_pre"], pos)
                    hidden = model.forward_from(layer, x, mask)
                per_layer.append(task.metric(hidden, mask, rows)[None])
        for layer in range(n if nodes != "resid" else 0):
            x = cc[f"blocks.{layer}.hook_resid_pre"]
            if nodes == "heads" or nodes in HEAD_PARTS:
                site = f"blocks.{layer}.{NODE_SITES[nodes]}"
                src = _head_source(source, ck[site], means, layer)
                per_layer.append(_patch_heads(model, task, layer, x, mask, rows, src, site))
            else:
                src = _mlp_source(source, ck[f"blocks.{layer}.hook_mlp_out"], means, layer)
                hook = (f"blocks.{layer}.hook_mlp_out", lambda t, hook, src=src: src.expand_as(t))
                with model.hooks([hook]):
                    per_layer.append(task.metric(model.forward_from(layer, x, mask), mask, rows)[None])
        effects.append((torch.cat(per_layer) - m_clean[None]).T.double().cpu())
    return in_task_order(effects, order).numpy(), in_task_order(totals, order).numpy()


def _patch_heads(model, task, layer, x, mask, rows, src, site) -> torch.Tensor:
    """``[n_heads, b]`` metric with head h of ``layer`` set to ``src[..., h, :]`` in copy h, at the per-head hook
    ``site`` (``[batch, pos, head, d_head]``: ``attn.hook_z``, ``hook_q``, ``hook_k`` or ``hook_v``)."""
    h = model.config.n_heads
    eye = torch.eye(h, dtype=torch.bool, device=x.device)

    def put(z: torch.Tensor, hook: Any) -> torch.Tensor:
        z = rearrange(z, "(c b) p h d -> c b p h d", c=h)
        z = torch.where(eye[:, None, None, :, None], src.expand_as(z[0])[None], z)
        return rearrange(z, "c b p h d -> (c b) p h d")

    with model.hooks([(site, put)]):
        hidden = model.forward_from(layer, repeat(x, "b p m -> (c b) p m", c=h), repeat(mask, "b p -> (c b) p", c=h))
    values = task.metric(hidden, repeat(mask, "b p -> (c b) p", c=h), repeat(rows, "b -> (c b)", c=h))
    return rearrange(values, "(c b) -> c b", c=h)


def _put_position(x: torch.Tensor, y: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``x`` with ``x[i, pos[i]]`` replaced by ``y[i, pos[i]]``."""
    out = x.clone()
    idx = torch.arange(x.shape[0], device=x.device)
    out[idx, pos] = y[idx, pos]
    return out


def _head_source(source, z_corr, means, layer) -> torch.Tensor:
    if source == "corrupted":
        return z_corr
    if source == "zero":
        return torch.zeros_like(z_corr)
    return means[layer].to(z_corr.dtype)  # [h, d] broadcasts over [b, p, h, d]


def _mlp_source(source, out_corr, means, layer) -> torch.Tensor:
    if source == "corrupted":
        return out_corr
    if source == "zero":
        return torch.zeros_like(out_corr)
    return means[layer].to(out_corr.dtype)


@torch.no_grad()
def _means(model, task, nodes, batch_size) -> list[torch.Tensor]:
    """Mean over real tokens of the task's clean runs, per layer: ``[h, d]`` at a per-head site (``hook_z``,
    ``hook_q`` ...), ``[m]`` at ``hook_mlp_out``."""
    site = NODE_SITES[nodes]
    sums, count = None, 0
    for rows in chunks(task.n_pairs, batch_size):
        batch = task.batch(rows)
        _, cache = model.run_with_cache(**batch, names_filter=f"blocks.*.{site}")
        real = batch["attention_mask"].bool()
        got = [cache[f"blocks.{L}.{site}"][real].double().sum(0) for L in range(model.config.n_layers)]
        sums = got if sums is None else [a + b for a, b in zip(sums, got, strict=True)]
        count += int(real.sum())
    return [s / count for s in sums]
