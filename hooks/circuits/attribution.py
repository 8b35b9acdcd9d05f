"""Attribution patching of nodes: AtP, AtP* and EAP-IG, each an estimate of exact patching's effect.

For a node with clean activation ``a`` and corrupted ``a*`` (gradients through the model's real LayerNorms):

- ``atp`` (Nanda 2023; Syed et al. 2023): ``(a* - a) . dm/da`` at the clean run.
- ``atp*`` (Kramár et al. 2024, the QK fix): the paper's nodes are a head's queries, keys and values
  (``nodes`` = "queries", "keys", "values": each head's ``hook_q`` / ``hook_k`` / ``hook_v`` at every position). A
  value node is linear given the pattern (``(v* - v) . dm/dv``), but a query or key node's change goes through
  the softmax exactly: the attention row with the corrupted query (each key's column with the corrupted key, all
  queries) is recomputed and the pattern change multiplied by ``dm/dA``. This removes the error AtP makes when
  attention is saturated. On ``nodes="heads"`` a head's score is the sum of its three nodes' estimates; exact
  patching of the head's output moves all three together, so that sum leaves out their interaction (compare
  :func:`~bertscope.hooks.circuits.patching.patch` with the same node kinds). (The paper's second fix,
  GradDrop, is not applied: its absolute values lose the effect's sign.)
- ``eap-ig`` (Hanna et al. 2024, as in their ``get_scores_eap_ig``; MIB's "EAP-IG-inputs"): ``(a* - a) . mean_k
  dm/da`` over ``steps`` runs whose input embeddings (``embed.hook_out``) are ``e* + k/steps (e - e*)``,
  ``k = 0..steps-1``. The path moves every input at once, so it estimates a path-averaged effect, not the effect
  of patching one node into the clean run.
- ``eap-ig-act`` (Hanna et al.'s ``get_scores_ig_activations``; MIB's "EAP-IG-activations"): one line per node
  of their graph, ``input`` (``embed.hook_out``), each layer's attention (all its heads together) and each MLP:
  that node's output set to ``alpha a + (1 - alpha) a*``, ``alpha = k/steps``, ``k = 1..steps``, everything
  downstream recomputed from the clean text; on every one of those ``(2 n_layers + 1) x steps`` passes the
  gradient is read at every node, and a node's score is ``(a* - a) . mean over all passes of dm/da`` (their
  backward hooks accumulate into every node's score on every pass, divided by the total step count).
- ``ig-act-own``: the same interpolation, but a layer's heads read the gradient only on the passes that move their
  own layer: ``(a* - a) . mean_k dm/da`` along the layer's own line, a Riemann sum of the integral that, as
  ``steps`` grows, is the exact effect of patching the whole layer's nodes, split between its heads along the
  path (costs ``n_layers x steps`` passes). Before this variant had its own name it was ``eap-ig-act``.

Every estimate is per pair (gradients of the sum over pairs, which are independent), so the table carries the
same intervals as exact patching's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch
from bertscope.hooks.circuits.results import (
    HEAD_PARTS,
    NODE_SITES,
    by_length,
    effects_table,
    in_task_order,
    node_labels,
)
from bertscope.hooks.circuits.tasks import Task

METHODS = ("atp", "atp*", "eap-ig", "eap-ig-act", "ig-act-own")


def attribute(
    model: Any,
    task: Task,
    method: str = "atp",
    nodes: str = "heads",
    *,
    steps: int = 5,
    batch_size: int = 16,
    n_boot: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """Attribution-patching estimates of every node's patching effect -> the table :func:`patch` returns
    (``method`` = "atp", "atp*", "eap-ig", "eap-ig-act" or "ig-act-own"; ``nodes`` "heads", "queries", "keys",
    "values" or "mlps"; ``atp*`` attention nodes only: on "queries", "keys" and "values" it is the paper's per-node
    estimate, on "heads" their sum)."""
    effects, total = attribute_effects(model, task, method, nodes, steps=steps, batch_size=batch_size)
    labels = node_labels(nodes, model.config.n_layers, model.config.n_heads)
    table = effects_table(effects, total, labels, method=method, n_boot=n_boot, seed=seed)
    table.insert(1, "source", "corrupted")
    return table


def attribute_effects(
    model: Any, task: Task, method: str = "atp", nodes: str = "heads", *, steps: int = 5, batch_size: int = 16
) -> tuple[np.ndarray, np.ndarray]:
    """``(estimates [n_pairs, n_nodes], total [n_pairs])`` for :func:`attribute`."""
    if method not in METHODS:
        raise ValueError(f"unknown attribution method {method!r}; choose one of {', '.join(METHODS)}")
    kinds = ("heads", *HEAD_PARTS) if method == "atp*" else ("heads", *HEAD_PARTS, "mlps")
    if nodes not in kinds:
        raise ValueError(f"{method} attributes {', '.join(kinds)}, not {nodes!r}")
    if method in ("eap-ig", "eap-ig-act", "ig-act-own") and steps < 1:
        raise ValueError(f"eap-ig needs steps >= 1, got {steps}")
    out, totals, order = [], [], by_length(task.mask, batch_size)
    for rows in order:
        clean, corr = task.batch(rows, "clean"), task.batch(rows, "corrupted")
        est, total = _chunk(model, task, method, nodes, steps, clean, corr, rows)
        out.append(est)
        totals.append(total)
    return in_task_order(out, order).numpy(), in_task_order(totals, order).numpy()


def _chunk(model, task, method, nodes, steps, clean, corr, rows) -> tuple[torch.Tensor, torch.Tensor]:
    mask = clean["attention_mask"]
    n = model.config.n_layers
    site = NODE_SITES[nodes]
    extra = ["blocks.*.attn.hook_q", "blocks.*.attn.hook_k", "blocks.*.attn.hook_v", "blocks.*.attn.hook_pattern",
             "blocks.*.attn.hook_scores", "blocks.*.hook_resid_pre"] if method == "atp*" else []
    if method == "eap-ig-act":
        extra = ["blocks.*.attn.hook_z", "blocks.*.hook_mlp_out"]
    names = [f"blocks.*.{site}", "embed.hook_out", *extra]
    with torch.no_grad():
        out_k, ck = model.run_with_cache(**corr, names_filter=names)
    loss = lambda out: task.metric(out, mask, rows).sum()  # noqa: E731  (per-pair gradients: pairs are independent)
    if method == "eap-ig":
        grads = None
        with torch.no_grad():
            _, cc = model.run_with_cache(**clean, names_filter=names)
        e_clean, e_corr = cc["embed.hook_out"], ck["embed.hook_out"]
        for k in range(steps):
            mixed = e_corr + (k / steps) * (e_clean - e_corr)
            hook = ("embed.hook_out", lambda t, hook, mixed=mixed: mixed)
            _, cg = model.run_with_cache(**clean, names_filter=names[:1], fwd_hooks=[hook], incl_bwd=True,
                                         loss_fn=loss)
            g = [cg[f"blocks.{L}.{site}_grad"] for L in range(n)]
            grads = g if grads is None else [a + b for a, b in zip(grads, g, strict=True)]
        grads = [g / steps for g in grads]
    elif method == "eap-ig-act":
        with torch.no_grad():
            _, cc = model.run_with_cache(**clean, names_filter=names)
        grads = [None] * n
        lines = ["embed.hook_out"] + [f"blocks.{L}.{s}" for L in range(n) for s in ("attn.hook_z", "hook_mlp_out")]
        for line in lines:  # Hanna et al.: every node's own line, the gradient read at every node on every pass
            for k in range(1, steps + 1):
                mixed = (k / steps) * cc[line] + (1 - k / steps) * ck[line]
                hook = (line, lambda t, hook, mixed=mixed: mixed)
                _, cg = model.run_with_cache(**clean, names_filter=names[:1], fwd_hooks=[hook], incl_bwd=True,
                                             loss_fn=loss)
                for L in range(n):
                    g = cg[f"blocks.{L}.{site}_grad"]
                    grads[L] = g if grads[L] is None else grads[L] + g
        grads = [g / (len(lines) * steps) for g in grads]
    elif method == "ig-act-own":
        with torch.no_grad():
            _, cc = model.run_with_cache(**clean, names_filter=names)
        grads = []
        for L in range(n):
            name = f"blocks.{L}.{site}"
            a, a_k = cc[name], ck[name]
            total_grad = torch.zeros_like(a)
            for k in range(1, steps + 1):
                mixed = (k / steps) * a + (1 - k / steps) * a_k
                hook = (name, lambda t, hook, mixed=mixed: mixed)
                _, cg = model.run_with_cache(**clean, names_filter=[name], fwd_hooks=[hook], incl_bwd=True,
                                             loss_fn=loss)
                total_grad += cg[name + "_grad"]
            grads.append(total_grad / steps)
    else:
        _, cc = model.run_with_cache(**clean, names_filter=names, incl_bwd=True, loss_fn=loss)
        grads = [cc[f"blocks.{L}.{site}_grad"] for L in range(n)]
    with torch.no_grad():
        m_clean = task.metric(model(**clean), mask, rows)
        total = (task.metric(out_k, mask, rows) - m_clean).double().cpu()
        per_layer = []
        for L in range(n):
            delta = ck[f"blocks.{L}.{site}"] - cc[f"blocks.{L}.{site}"]
            if method == "atp*":
                parts = atp_star_parts(model, L, cc, ck, mask)
                per_layer.append(sum(parts.values()) if nodes == "heads" else parts[_PART[nodes]])
            elif nodes != "mlps":
                per_layer.append((delta * grads[L]).sum((1, 3)))  # [b, h]
            else:
                per_layer.append((delta * grads[L]).sum((1, 2))[:, None])
    return torch.cat(per_layer, dim=1).double().cpu(), total


_PART = {"queries": "query", "keys": "key", "values": "value"}


def atp_star_parts(model: Any, layer: int, cc: Any, ck: Any, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """AtP* of every head of ``layer`` by node type: ``{"query", "key", "value"}`` each ``[b, h]`` (float64), from
    the clean cache ``cc`` (with ``_grad`` entries of ``hook_pattern`` and ``hook_v``) and the corrupted ``ck``."""
    p = f"blocks.{layer}.attn."
    A = cc[p + "hook_pattern"].double()  # [b, h, q, k]
    gA = cc[p + "hook_pattern_grad"].double()
    value = ((ck[p + "hook_v"] - cc[p + "hook_v"]) * cc[p + "hook_v_grad"]).sum((1, 3)).double()
    s_q, s_k = _scores_with(model, layer, cc, ck, mask)
    S = cc[p + "hook_scores"].double()
    # query nodes: row t recomputed with the corrupted query
    query = (gA * (torch.softmax(s_q, dim=-1) - A)).sum((2, 3))
    # key nodes: column s of every row replaced by the corrupted key's score, softmax recomputed in closed form
    real = mask.bool()[:, None, None, :].expand_as(A)
    delta = torch.where(real, (s_k - S).clamp(max=600.0), torch.zeros_like(S))
    grow = torch.expm1(delta)
    r = 1 + A * grow
    G = (gA * A).sum(-1, keepdim=True)  # [b, h, q, 1]
    key = ((1 / r - 1) * G + gA * A * grow / r).sum((2, 3))
    return {"query": query, "key": key, "value": value}


def _scores_with(model, layer, cc, ck, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """Block ``layer``'s attention scores with every query corrupted (keys clean), and with every key corrupted
    (queries clean): ``[b, h, q, k]`` each. A score depends only on its own query and key (and positions), so
    entry ``[t, s]`` is the score with only query t (or only key s) corrupted."""
    p = f"blocks.{layer}.attn."
    out = {}
    for which in ("q", "k"):
        put = (p + f"hook_{which}", lambda t, hook, w=which: ck[p + f"hook_{w}"])
        grab = (p + "hook_scores", lambda t, hook, w=which: out.__setitem__(w, t))
        with model.hooks([put, grab]):
            model.forward_from(layer, cc[f"blocks.{layer}.hook_resid_pre"], mask, stop_at_layer=layer)
    return out["q"].double(), out["k"].double()
