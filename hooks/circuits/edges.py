"""Edge attribution on the frozen-LayerNorm model, and path patching as its ground truth.

Edge score (EAP, Syed et al. 2023, in the frozen-LN graph of ``circuits.graph``)::

    score(s -> r) = sum_{pos, m} (term_s(corrupted) - term_s(clean)) * dm / dx_r

where ``term_s`` is sender s's output carried to receiver r's input through the frozen LayerNorms (their linear
parts at the clean run's scale) and ``dm/dx_r`` the gradient of the metric with respect to r's input in the same
frozen model. Because ``x_r = const + sum_s term_s`` exactly there, the scores into a receiver sum to
``(x_r(corrupted) - x_r(clean)) . dm/dx_r``, the receiver's own attribution, exactly; on a model that is linear
once its LayerNorms are frozen, each score is exactly the effect of patching that edge. ``eap-ig`` averages the
gradient over ``steps`` runs whose input embeddings are ``e* + k/steps (e - e*)``, ``k = 0..steps-1`` (EAP-IG,
Hanna et al. 2024). Pre-LN models (ModernBERT) freeze nothing: this is plain EAP / EAP-IG.

:func:`path_patch` is the exact effect of one edge in the same frozen model: every receiver reads its clean
input except ``r``, which reads sender ``s``'s corrupted term in place of its clean one; everything downstream
of ``r`` is recomputed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from bertscope.hooks.circuits.graph import (
    Graph,
    capture,
    circuit_forward,
    frozen_forward,
    graph_of,
    receiver_slices,
)
from bertscope.hooks.circuits.results import by_length, chunks
from bertscope.hooks.circuits.table import DEFAULTS, edge_method, edge_methods
from bertscope.hooks.circuits.tasks import Task
from einops import einsum


def __getattr__(name: str) -> Any:
    """The old name ``EDGE_METHODS``, read from the edge table when asked for."""
    if name == "EDGE_METHODS":  # the registered edge methods, read from the table when asked for
        return edge_methods()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class EdgeScores:
    """Edge scores of one task: ``scores [n_senders, n_receivers]`` (mean over pairs of the per-pair score; 0 on
    edges that do not exist), the :class:`Graph`, and how they were computed."""

    graph: Graph
    scores: torch.Tensor
    method: str
    n_pairs: int

    def __repr__(self) -> str:
        """One line: the method, pairs, edge count and the top three edges by absolute score (not the tensor)."""
        top = self.graph.valid.sum().item()
        vals = torch.where(self.graph.valid, self.scores.abs().double(), torch.full_like(self.scores.double(), -1))
        idx = torch.topk(vals.flatten(), min(3, int(top))).indices.tolist() if top else []
        s, r, n_r = self.graph.senders, self.graph.receivers, len(self.graph.receivers)
        shown = ", ".join(f"{s[i // n_r]}->{r[i % n_r]}: {float(self.scores.view(-1)[i]):+.3g}" for i in idx)
        return (f"EdgeScores(method={self.method!r}, n_pairs={self.n_pairs}, edges={int(top)}, "
                f"top=[{shown}{', ...' if top > 3 else ''}])")

    def table(self) -> pd.DataFrame:
        """One row per existing edge: ``edge``, ``sender``, ``receiver``, ``score``, ``abs_score``, ``rank`` (1 =
        largest absolute score), ``method``, ``n_pairs``."""
        s, r = self.graph.senders, self.graph.receivers
        idx = torch.nonzero(self.graph.valid).tolist()
        vals = np.array([float(self.scores[i, j]) for i, j in idx])
        out = pd.DataFrame({"edge": [f"{s[i]}->{r[j]}" for i, j in idx], "sender": [s[i] for i, _ in idx],
                            "receiver": [r[j] for _, j in idx], "score": vals, "abs_score": np.abs(vals)})
        out["rank"] = out["abs_score"].rank(ascending=False, method="first").astype(int)
        out["method"], out["n_pairs"] = self.method, self.n_pairs
        return out.sort_values("rank").reset_index(drop=True)


def edges(model: Any, task: Task, method: str = DEFAULTS.edge_method, *, steps: int = DEFAULTS.ig_steps,
          batch_size: int = DEFAULTS.batch_size) -> EdgeScores:
    """Score every edge of ``model``'s graph on ``task`` (``method``: a registered edge method, "eap" or "eap-ig"
    built in; see the module docstring; defaults: ``table.DEFAULTS``, as ``bertscope run circuits``). Cost per
    pair: two frozen-model forwards to capture, then one (eap) or ``steps`` (eap-ig) forward+backward passes of
    the rebuilt model."""
    spec = edge_method(method)
    if spec.uses_steps and steps < 1:
        raise ValueError(f"{method} needs steps >= 1, got {steps}")
    g = graph_of(model)
    total = torch.zeros(g.valid.shape, dtype=torch.float64)
    for rows in by_length(task.mask, batch_size):
        total += edge_scores_per_pair(model, task, rows, method, steps).sum(0)
    return EdgeScores(g, total / task.n_pairs, method, task.n_pairs)


def edge_scores_per_pair(model: Any, task: Task, rows: torch.Tensor, method: str = DEFAULTS.edge_method,
                         steps: int = DEFAULTS.ig_steps) -> torch.Tensor:
    """``[len(rows), n_senders, n_receivers]`` edge scores of pairs ``rows`` (float64) by the registered edge
    method ``method`` (``table.EDGE_TABLE``)."""
    return edge_method(method).scores(model, task, rows, steps)


def eap_scores(model: Any, task: Task, rows: torch.Tensor, steps: int = 1) -> torch.Tensor:
    """EAP (Syed et al. 2023) on the frozen-LN graph: the gradient at the clean run (``steps`` unused)."""
    return gradient_edge_scores(model, task, rows, lambda clean, corr: [clean])


def eap_ig_scores(model: Any, task: Task, rows: torch.Tensor, steps: int = DEFAULTS.ig_steps) -> torch.Tensor:
    """EAP-IG (Hanna et al. 2024): the gradient averaged over inputs ``e* + k/steps (e - e*)``, ``k < steps``."""
    return gradient_edge_scores(
        model, task, rows, lambda clean, corr: [corr + (a / steps) * (clean - corr) for a in range(steps)])


def gradient_edge_scores(model: Any, task: Task, rows: torch.Tensor,
                         path: Callable[[torch.Tensor, torch.Tensor], list[torch.Tensor]]) -> torch.Tensor:
    """``[len(rows), n_senders, n_receivers]``: each edge's (corrupted - clean sender term) times the receiver's
    gradient, averaged over the frozen-model runs whose input embeddings are ``path(clean [b, p, m], corrupted
    [b, p, m])`` (a list)."""
    g = graph_of(model)
    clean, corr_batch = task.batch(rows, "clean"), task.batch(rows, "corrupted")
    mask = clean["attention_mask"]
    c = capture(model, clean)
    k = capture(model, corr_batch, scales=c.scales)
    full = g.valid.to(c.embed.dtype)
    with torch.no_grad():
        _, tr = circuit_forward(model, k, c.embed, full, mask, trace=True)
    terms = {key: t for key, t in tr.terms.items()}  # clean - corrupted, at each receiver
    inputs = path(c.embed, k.embed)
    grads: dict[tuple, torch.Tensor] = {}
    for e in inputs:
        hidden, rec = frozen_forward(model, c.scales, e.detach().requires_grad_(), mask)
        keys = list(rec)
        got = torch.autograd.grad(task.metric(hidden, mask, rows).sum(), [rec[key] for key in keys],
                                  allow_unused=True)
        for key, gr in zip(keys, got, strict=True):
            gr = torch.zeros_like(rec[key]) if gr is None else gr.detach()
            grads[key] = grads.get(key, 0) + gr / len(inputs)
    out = torch.zeros(len(rows), *g.valid.shape, dtype=torch.float64)
    for key, cols in receiver_slices(g):
        t = terms[key].double()
        gr = grads[key].double()
        if key[0] == "heads":
            sc = -einsum(t, gr, "s b p m, b p h m -> b s h")
        else:
            sc = -einsum(t, gr, "s b p m, b p m -> b s")[..., None]
        out[:, : t.shape[0], cols] = sc
    return out * g.valid


@torch.no_grad()
def circuit_metric(model: Any, task: Task, edge_mask: torch.Tensor, *, batch_size: int = 16,
                   inputs: str = "clean") -> np.ndarray:
    """``m`` per pair ``[n_pairs]`` of the frozen model in which only the edges of ``edge_mask [n_senders,
    n_receivers]`` carry the run's (clean) sender terms and every other edge the corrupted run's: all edges = the
    clean run, no edge = the (frozen) corrupted run."""
    out = []
    for rows in chunks(task.n_pairs, batch_size):
        clean, corr_batch = task.batch(rows, "clean"), task.batch(rows, "corrupted")
        c = capture(model, clean)
        k = capture(model, corr_batch, scales=c.scales)
        hidden, _ = circuit_forward(model, k, c.embed, edge_mask, clean["attention_mask"])
        out.append(task.metric(hidden, clean["attention_mask"], rows).double().cpu())
    return torch.cat(out).numpy()


@torch.no_grad()
def path_patch(model: Any, task: Task, edge_list: Sequence[str], *, batch_size: int = 16) -> pd.DataFrame:
    """Exact effect of each edge ``"s->r"`` in ``edge_list``: ``m(all edges but s->r) - m(clean)`` per pair in the
    frozen model (the sender's corrupted term reaches only that receiver; everything downstream recomputed).
    Columns ``edge``, ``effect`` (mean over pairs), ``n_pairs``."""
    g = graph_of(model)
    s_idx = {n: i for i, n in enumerate(g.senders)}
    r_idx = {n: i for i, n in enumerate(g.receivers)}
    full = g.valid.double()
    effects = []
    for name in edge_list:
        s, _, r = name.partition("->")
        if s not in s_idx or r not in r_idx or not g.valid[s_idx[s], r_idx[r]]:
            raise ValueError(f"{name!r} is not an edge of this model's graph (see graph_of(model).edge_names())")
    per_chunk = []
    for rows in chunks(task.n_pairs, batch_size):
        clean, corr_batch = task.batch(rows, "clean"), task.batch(rows, "corrupted")
        mask = clean["attention_mask"]
        c = capture(model, clean)
        k = capture(model, corr_batch, scales=c.scales)
        base = task.metric(circuit_forward(model, k, c.embed, full.to(c.embed.dtype), mask)[0], mask, rows)
        vals = []
        for name in edge_list:
            s, _, r = name.partition("->")
            em = full.clone()
            em[s_idx[s], r_idx[r]] = 0
            hidden, _ = circuit_forward(model, k, c.embed, em.to(c.embed.dtype), mask)
            vals.append((task.metric(hidden, mask, rows) - base).double().cpu())
        per_chunk.append(torch.stack(vals, 1))
    effects = torch.cat(per_chunk)
    return pd.DataFrame({"edge": list(edge_list), "effect": effects.mean(0).numpy(), "n_pairs": task.n_pairs})
