"""Circuit search and evaluation: top-n edges, greedy pruning with exact patching, faithfulness, CPR and CMD.

A circuit is a set of edges (a bool mask ``[n_senders, n_receivers]``). It is evaluated by
``circuits.graph.circuit_forward``: its edges carry the clean run's sender terms, every other edge the corrupted
run's. Faithfulness (MIB, Mueller et al. 2025)::

    f(C) = (m(C) - m(empty)) / (m(full) - m(empty))

with ``m`` the metric's mean over pairs, ``full`` every edge (the clean run) and ``empty`` none (the corrupted
run in the frozen model). The faithfulness curve takes the top ``int(p * n_edges)`` edges by absolute score at
``p`` in :data:`PERCENTAGES`, pruned to edges on a path from ``input`` to ``output``; CPR and CMD are MIB's
``evaluate_area_under_curve``: trapezoids over ``p`` (linear scale) of ``f`` (CPR, area under) and of
``|1 - f|`` (CMD, area between the curve and 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from bertscope.hooks.circuits.edges import EdgeScores
from bertscope.hooks.circuits.graph import Capture, Graph, capture, circuit_forward, graph_of
from bertscope.hooks.circuits.results import by_length, in_task_order
from bertscope.hooks.circuits.table import DEFAULTS
from bertscope.hooks.circuits.tasks import Task

PERCENTAGES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def area_under_curve(percentages: Sequence[float], faithfulness: Sequence[float]) -> tuple[float, float]:
    """``(CPR, CMD)`` of a faithfulness curve, as MIB's ``evaluate_area_under_curve`` (``log_scale=False``):
    ``sum_i (x_{i+1} - x_i) (f_i + f_{i+1}) / 2`` and the same over ``|1 - f|``."""
    x, f = list(percentages), list(faithfulness)
    if len(x) != len(f) or len(x) < 2:
        raise ValueError("need at least two (percentage, faithfulness) points of equal count")
    cpr = sum((x[i + 1] - x[i]) * (f[i] + f[i + 1]) / 2 for i in range(len(x) - 1))
    cmd = sum((x[i + 1] - x[i]) * (abs(1 - f[i]) + abs(1 - f[i + 1])) / 2 for i in range(len(x) - 1))
    return float(cpr), float(cmd)


class Evaluator:
    """The metric of any circuit on a task, with the clean and corrupted captures made once (``batch_size``
    pairs at a time). ``m(mask)`` -> mean over pairs; ``full``, ``empty`` its two references."""

    def __init__(self, model: Any, task: Task, *, batch_size: int = 32) -> None:
        self.model, self.task, self.graph = model, task, graph_of(model)
        self.parts: list[tuple[torch.Tensor, Capture, Capture, torch.Tensor]] = []
        for rows in by_length(task.mask, batch_size):
            clean, corr = task.batch(rows, "clean"), task.batch(rows, "corrupted")
            c = capture(model, clean)
            self.parts.append((rows, c, capture(model, corr, scales=c.scales), clean["attention_mask"]))
        self.n_evaluations = 0
        self.full = self(self.graph.valid)
        self.empty = self(torch.zeros_like(self.graph.valid))

    @torch.no_grad()
    def per_pair(self, mask: torch.Tensor) -> np.ndarray:
        """``m`` per pair ``[n_pairs]`` of the circuit ``mask``."""
        self.n_evaluations += 1
        out = []
        for rows, c, k, attn in self.parts:
            hidden, _ = circuit_forward(self.model, k, c.embed, mask.to(c.embed.dtype), attn)
            out.append(self.task.metric(hidden, attn, rows).double().cpu())
        return in_task_order(out, [p[0] for p in self.parts]).numpy()

    def __call__(self, mask: torch.Tensor) -> float:
        return float(self.per_pair(mask).mean())

    def faithfulness(self, mask: torch.Tensor) -> float:
        """``(m(mask) - m(empty)) / (m(full) - m(empty))``."""
        return (self(mask) - self.empty) / (self.full - self.empty)


def prune(graph: Graph, mask: torch.Tensor) -> torch.Tensor:
    """Edges of ``mask`` on a path from ``input`` to ``output`` (MIB's ``prune``): a sender must be reached from
    the input through circuit edges, and a receiver must reach the output."""
    mask = mask.clone() & graph.valid
    s_of = {n: i for i, n in enumerate(graph.senders)}
    r_of = {n: i for i, n in enumerate(graph.receivers)}
    reached = torch.zeros(len(graph.senders), dtype=torch.bool)
    reached[0] = True
    for name in graph.senders[1:]:  # forward order: a node is reached if one of its in-edges comes from one
        reached[s_of[name]] = bool((mask[:, r_of[name]] & reached).any())
    alive = torch.zeros(len(graph.receivers), dtype=torch.bool)
    alive[graph.receiver_output] = True
    for name in reversed(graph.receivers[:-1]):  # backward: a node is alive if one of its out-edges leads on
        alive[r_of[name]] = bool((mask[s_of[name]] & alive).any())
    sender_alive = torch.tensor([True] + [bool(alive[r_of[n]]) for n in graph.senders[1:]])
    receiver_reached = torch.tensor([bool(reached[s_of[n]]) for n in graph.receivers[:-1]] + [True])
    return mask & (reached & sender_alive)[:, None] & (alive & receiver_reached)[None, :]


def top_edges(scores: EdgeScores, n: int, *, absolute: bool = True, do_prune: bool = True) -> torch.Tensor:
    """The ``n`` highest-scoring edges (by absolute score unless ``absolute=False``), pruned to input->output paths."""
    g = scores.graph
    vals = scores.scores.abs() if absolute else scores.scores
    vals = torch.where(g.valid, vals.double(), torch.full_like(vals.double(), -torch.inf))
    mask = torch.zeros_like(g.valid)
    if n > 0:
        idx = torch.topk(vals.flatten(), min(n, int(g.valid.sum()))).indices
        mask.view(-1)[idx] = True
    return prune(g, mask) if do_prune else mask


@dataclass
class Circuit:
    """A found circuit: ``mask [n_senders, n_receivers]``, its ``edges`` (``"s->r"``), the heads and MLPs it uses
    (``nodes``), its ``faithfulness``, the metric means ``m_circuit``, ``m_full``, ``m_empty`` and how many
    circuit evaluations (forward passes over the task) the search cost."""

    mask: torch.Tensor
    edges: list[str]
    nodes: list[str]
    faithfulness: float
    m_circuit: float
    m_full: float
    m_empty: float
    n_evaluations: int = 0
    log: list[dict] = field(default_factory=list)

    def __repr__(self) -> str:
        """One line: edge and node counts, faithfulness and the first few edges (not the mask or the search log)."""
        shown = ", ".join(self.edges[:4]) + (", ..." if len(self.edges) > 4 else "")
        return (f"Circuit(edges={len(self.edges)}, nodes={len(self.nodes)}, faithfulness={self.faithfulness:.3f}, "
                f"n_evaluations={self.n_evaluations}, edges_shown=[{shown}])")


def _circuit(ev: Evaluator, mask: torch.Tensor, log: list[dict] | None = None) -> Circuit:
    g = ev.graph
    names = [f"{g.senders[i]}->{g.receivers[j]}" for i, j in torch.nonzero(mask).tolist()]
    used = sorted({n for e in names for n in e.split("->")} - {"input", "output"},
                  key=lambda n: g.senders.index(n))
    m = ev(mask)
    return Circuit(mask, names, used, (m - ev.empty) / (ev.full - ev.empty), m, ev.full, ev.empty,
                   ev.n_evaluations, log or [])


def find_circuit(
    model: Any,
    task: Task,
    scores: EdgeScores,
    *,
    method: str = "greedy",
    n_edges: int | None = None,
    candidates: int | None = DEFAULTS.candidates,
    threshold: float = DEFAULTS.threshold,
    evaluator: Evaluator | None = None,
) -> Circuit:
    """Find a circuit from edge ``scores``.

    ``method="topn"``: the ``n_edges`` top edges by absolute score, pruned. ``method="greedy"`` (ACDC-style,
    Conmy et al. 2023, with exact patching): start from the top ``candidates`` edges (``None``: every edge),
    visit receivers from the output backwards and, within a receiver, its edges from the smallest absolute score
    up; drop an edge when dropping it moves the metric by less than ``threshold`` times ``|m(full) -
    m(empty)|``; finally prune. Each tried edge costs one evaluation of the circuit on the whole task. Defaults:
    ``table.DEFAULTS``, the same as ``bertscope run circuits``'s."""
    ev = evaluator or Evaluator(model, task)
    g = ev.graph
    if method == "topn":
        if n_edges is None:
            raise ValueError("method='topn' needs n_edges")
        return _circuit(ev, top_edges(scores, n_edges))
    if method != "greedy":
        raise ValueError(f"method must be 'greedy' or 'topn', got {method!r}")
    mask = top_edges(scores, candidates, do_prune=False) if candidates else g.valid.clone()
    span = abs(ev.full - ev.empty)
    current = ev(mask)
    log = []
    for r in reversed(range(len(g.receivers))):
        senders = torch.nonzero(mask[:, r]).flatten().tolist()
        for s in sorted(senders, key=lambda i: float(scores.scores[i, r].abs())):
            trial = mask.clone()
            trial[s, r] = False
            value = ev(trial)
            change = abs(value - current) / span if span > 0 else 0.0
            kept = change >= threshold
            log.append({"edge": f"{g.senders[s]}->{g.receivers[r]}", "change": change, "kept": kept})
            if not kept:
                mask, current = trial, value
    return _circuit(ev, prune(g, mask), log)


def faithfulness(
    model: Any,
    task: Task,
    scores: EdgeScores,
    *,
    percentages: Sequence[float] = PERCENTAGES,
    n_random: int = DEFAULTS.n_random,
    seed: int = 0,
    evaluator: Evaluator | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The faithfulness curve of ``scores``' top edges and of ``n_random`` random edge orders (the control).

    Returns ``(curve, areas)``: ``curve`` has a row per ``ordering`` ("scores" or "random{i}") and ``percent``:
    ``n_edges`` asked, ``n_edges_kept`` after pruning, ``m_circuit``, ``faithfulness``; ``areas`` a row per
    ordering with ``cpr`` and ``cmd`` (:func:`area_under_curve`)."""
    ev = evaluator or Evaluator(model, task)
    g = ev.graph
    n_total = int(g.valid.sum())
    orders = [("scores", scores)]
    gen = torch.Generator().manual_seed(seed)
    for i in range(n_random):
        rand = torch.rand(g.valid.shape, generator=gen, dtype=torch.float64) * g.valid
        orders.append((f"random{i}", EdgeScores(g, rand, "random", scores.n_pairs)))
    rows, areas = [], []
    for name, sc in orders:
        f = []
        for p in percentages:
            n = int(p * n_total)
            mask = top_edges(sc, n)
            m = ev(mask)
            f.append((m - ev.empty) / (ev.full - ev.empty))
            rows.append({"ordering": name, "percent": 100 * p, "n_edges": n, "n_edges_kept": int(mask.sum()),
                         "m_circuit": m, "faithfulness": f[-1]})
        cpr, cmd = area_under_curve(percentages, f)
        areas.append({"ordering": name, "cpr": cpr, "cmd": cmd})
    return pd.DataFrame(rows), pd.DataFrame(areas)


def random_circuits(evaluator: Evaluator, n_edges: int, n_random: int, *, seed: int = 0) -> np.ndarray:
    """Faithfulness of ``n_random`` circuits of ``n_edges`` edges drawn uniformly from the graph's edges (pruned
    like any circuit): the control a found circuit of that size is compared with."""
    g = evaluator.graph
    gen = torch.Generator().manual_seed(seed)
    valid = torch.nonzero(g.valid.flatten()).flatten()
    out = []
    for _ in range(n_random):
        mask = torch.zeros_like(g.valid)
        pick = valid[torch.randperm(len(valid), generator=gen)[:n_edges]]
        mask.view(-1)[pick] = True
        out.append(evaluator.faithfulness(prune(g, mask)))
    return np.array(out)
