"""The circuits analysis of one task, as plain tables: head scores by every method (with their cost), edges, a
circuit with its faithfulness curve, CPR/CMD and random controls; plus the built-in TFC1 task and the overlap
with another head set. Used by the ``circuits`` experiment and by ``bertscope circuits``."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from bertscope.experiments.circuits.data import injected_positions, tfc1_pairs  # noqa: F401 (homes before)
from bertscope.hooks import circuits
from bertscope.hooks.circuits import table
from bertscope.hooks.circuits.results import effects_table, node_labels


def __getattr__(name: str) -> Any:
    """Old names, kept importable: ``HEAD_METHODS`` (the node table's default methods, read when asked for);
    ``AnalysisSettings`` is the experiment's one ``Settings``, set here by ``experiment`` (always imported first,
    by the package)."""
    if name == "HEAD_METHODS":
        return table.node_methods(default=True)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def analyse(model: Any, task: circuits.Task, settings: Any, *,
            positions: torch.Tensor | None = None, progress: Callable[[str], None] = lambda msg: None,
            seed: int = 0, batch_size: int | None = None) -> dict[str, pd.DataFrame]:
    """Every table of the circuits analysis of ``task`` with the experiment's ``Settings`` (see the experiment's
    docstring for the columns): ``heads`` (long: a row per method, layer and head; every method is read from the
    node table, ``hooks/circuits/table.py``), ``cost``, ``resid`` (when ``positions`` is given), ``edges``,
    ``circuit``, ``faithfulness``, ``areas``, ``random_circuits``. ``batch_size``: pairs per pass (default
    ``settings.batch_size`` where it has one, else ``table.DEFAULTS.batch_size``)."""
    s = settings
    batch = batch_size or getattr(s, "batch_size", None) or table.DEFAULTS.batch_size
    out: dict[str, pd.DataFrame] = {}
    timer = _Timer(model, task, batch)
    heads, cost, per_pair = [], [], {}
    labels = node_labels("heads", model.config.n_layers, model.config.n_heads)
    for method in s.methods:
        progress(f"head scores: {method}")
        spec = table.node_method(method)
        (eff, total), secs = timer.time(lambda spec=spec: spec.effects(model, task, "heads", steps=s.ig_steps,
                                                                       batch_size=batch))
        rows = effects_table(eff, total, labels, method=method, n_boot=s.n_boot, seed=seed)
        rows.insert(1, "source", "corrupted")
        heads.append(rows)
        per_pair[method] = eff
        cost.append({"method": method, "seconds": secs, "forward_equivalents": secs / timer.forward_seconds})
    out["heads"] = pd.concat(heads, ignore_index=True)
    if "exact" in per_pair:
        out["agreement"] = agreement_table(per_pair, n_boot=s.n_boot, seed=seed)
    if positions is not None:
        progress("residual stream at the injected position")
        out["resid"] = circuits.patch(model, task, "resid", positions=positions, batch_size=batch,
                                      n_boot=s.n_boot, seed=seed)
    progress(f"edges: {s.edge_method}")
    scores, secs = timer.time(lambda: circuits.edges(model, task, s.edge_method, steps=s.ig_steps,
                                                     batch_size=batch))
    cost.append({"method": f"edges:{s.edge_method}", "seconds": secs,
                 "forward_equivalents": secs / timer.forward_seconds})
    out["edges"] = scores.table().head(s.top_edges)
    if s.checked_edges > 0:
        progress(f"path patching of {2 * s.checked_edges} edges (ground truth for the edge scores)")
        out["edge_check"], secs = timer.time(lambda: edge_check(model, task, scores, s.checked_edges, seed=seed,
                                                                batch_size=batch))
        cost.append({"method": "path patching (checked edges)", "seconds": secs,
                     "forward_equivalents": secs / timer.forward_seconds})
    progress("circuit search (greedy, exact patching)")
    ev = circuits.Evaluator(model, task, batch_size=max(batch, 32))
    circuit, secs = timer.time(lambda: circuits.find_circuit(model, task, scores, method="greedy",
                                                             candidates=s.candidates, threshold=s.threshold,
                                                             evaluator=ev))
    cost.append({"method": "greedy search", "seconds": secs, "forward_equivalents": secs / timer.forward_seconds})
    out["cost"] = pd.DataFrame(cost)
    progress("faithfulness curve and random controls")
    curve, areas = circuits.faithfulness(model, task, scores, n_random=s.n_random, seed=seed, evaluator=ev)
    out["faithfulness"], out["areas"] = curve, areas
    rand = circuits.random_circuits(ev, len(circuit.edges), s.n_random_circuits, seed=seed)
    out["random_circuits"] = pd.DataFrame({"draw": range(len(rand)), "n_edges": len(circuit.edges),
                                           "faithfulness": rand})
    out["circuit"] = circuit_table(circuit, scores)
    return out


def spearman_interval(est: np.ndarray, exact: np.ndarray, *, n_boot: int = 1000, seed: int = 0,
                      level: float = 0.95) -> tuple[float, float, float]:
    """Spearman over nodes of the mean over pairs of ``est [n_pairs, n_nodes]`` with that of ``exact`` (same
    shape), and its percentile bootstrap interval: pairs resampled with replacement (the same resample for both),
    both means recomputed, the Spearman recomputed. The interval covers the variance of the pair sample only."""
    from scipy.stats import rankdata

    est, exact = np.asarray(est, dtype=np.float64), np.asarray(exact, dtype=np.float64)
    n = est.shape[0]
    point = float(pd.Series(est.mean(0)).corr(pd.Series(exact.mean(0)), method="spearman"))
    if n < 2 or n_boot < 1:
        return point, float("nan"), float("nan")
    w = np.random.default_rng(seed).multinomial(n, np.full(n, 1.0 / n), size=n_boot) / n  # [B, n] weights
    a = np.apply_along_axis(rankdata, 1, w @ est)
    b = np.apply_along_axis(rankdata, 1, w @ exact)
    a, b = a - a.mean(1, keepdims=True), b - b.mean(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = (a * b).sum(1) / np.sqrt((a * a).sum(1) * (b * b).sum(1))
    tail = 100 * (1 - level) / 2
    low, high = np.nanpercentile(boot, [tail, 100 - tail])
    return point, float(low), float(high)


TOP_K = (5, 10, 20)
"""The k of the top-k recall in the agreement tables."""


def agreement_measures(est: np.ndarray, exact: np.ndarray, *, signed: bool = True, ks: tuple[int, ...] = TOP_K,
                       n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict[str, float]:
    """How well the estimate ``est [n_pairs, n_nodes]`` (per-pair node scores) finds exact patching's effects
    ``exact`` (same shape), each measure with a percentile bootstrap interval over pairs (``<name>_low`` /
    ``<name>_high``: pairs resampled with replacement, the same resample for every measure and both arrays, every
    mean recomputed: the variance of the pair sample only).

    The reference is exact patching's mean over pairs of the per-pair effect (``signed``) or, for an estimate of a
    magnitude (``signed=False``: AtP*'s GradDrop), the mean over pairs of ``|effect|``. Measures:

    - ``spearman``: rank correlation over nodes of the estimate's means with the reference;
    - ``recall_at_k`` (Kramár et al.'s measure, for each k in ``ks``): of the k nodes with the largest
      ``|reference|``, the fraction among the k with the largest ``|estimate|``;
    - ``mean_abs_exact`` and ``mean_abs_estimate``: E|effect|, the mean over nodes of ``|reference|`` and of
      ``|estimate|`` (how large the effects are, and whether the estimate has their scale).
    """
    from scipy.stats import rankdata

    est, exact = np.asarray(est, dtype=np.float64), np.asarray(exact, dtype=np.float64)
    ref = exact if signed else np.abs(exact)
    n, n_nodes = est.shape
    ks = tuple(k for k in ks if k < n_nodes)

    def measures(e: np.ndarray, r: np.ndarray) -> np.ndarray:  # e, r: [B, n_nodes] means -> [B, n_measures]
        a = np.apply_along_axis(rankdata, 1, e)
        b = np.apply_along_axis(rankdata, 1, r)
        a, b = a - a.mean(1, keepdims=True), b - b.mean(1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            rho = (a * b).sum(1) / np.sqrt((a * a).sum(1) * (b * b).sum(1))
        order_e, order_r = np.argsort(-np.abs(e), axis=1), np.argsort(-np.abs(r), axis=1)
        recalls = []
        for k in ks:
            hit = np.zeros_like(e, dtype=bool)
            np.put_along_axis(hit, order_e[:, :k], True, axis=1)
            recalls.append(np.take_along_axis(hit, order_r[:, :k], axis=1).mean(1))
        return np.stack([rho, *recalls, np.abs(r).mean(1), np.abs(e).mean(1)], 1)

    names = ["spearman", *(f"recall_at_{k}" for k in ks), "mean_abs_exact", "mean_abs_estimate"]
    point = measures(est.mean(0)[None], ref.mean(0)[None])[0]
    out = dict(zip(names, map(float, point), strict=True))
    if n < 2 or n_boot < 1:
        out.update({f"{m}_{side}": float("nan") for m in names for side in ("low", "high")})
        return out
    w = np.random.default_rng(seed).multinomial(n, np.full(n, 1.0 / n), size=n_boot) / n  # [B, n] weights
    boot = measures(w @ est, w @ ref)
    tail = 100 * (1 - level) / 2
    low, high = np.nanpercentile(boot, [tail, 100 - tail], axis=0)
    for i, m in enumerate(names):
        out[f"{m}_low"], out[f"{m}_high"] = float(low[i]), float(high[i])
    return out


def agreement_table(per_pair: dict[str, np.ndarray], *, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """A row per estimate in ``per_pair`` (method -> ``[n_pairs, n_heads]``; "exact" is the reference): Spearman
    with exact patching's mean head scores and its bootstrap interval over pairs (:func:`spearman_interval`),
    Pearson, heads, pairs; then Kramár et al.'s measures (:func:`agreement_measures`): top-k recall for k in
    :data:`TOP_K` and E|effect| of exact patching and of the estimate, each with its interval, and ``reference``
    (what the estimate is compared with: the mean effect, or for a magnitude estimate (``signed=False`` in the node
    table, AtP*) the mean of |effect|; its Spearman and Pearson are against that too)."""
    exact = per_pair["exact"]
    rows = []
    for method, est in per_pair.items():
        if method == "exact":
            continue
        spec = table.NODE_TABLE.get(method)
        signed = spec.signed if spec is not None else True
        ref = exact if signed else np.abs(exact)
        rho, low, high = spearman_interval(est, ref, n_boot=n_boot, seed=seed)
        more = agreement_measures(est, exact, signed=signed, n_boot=n_boot, seed=seed)
        rows.append({"method": method, "spearman": rho, "spearman_low": low, "spearman_high": high,
                     "pearson": float(np.corrcoef(est.mean(0), ref.mean(0))[0, 1]), "n_heads": est.shape[1],
                     "n_pairs": est.shape[0],
                     "interval": "95% percentile bootstrap over pairs (pair-sampling variance only)",
                     "reference": "mean effect" if signed else "mean |effect|",
                     **{k: v for k, v in more.items() if not k.startswith("spearman")}})
    return pd.DataFrame(rows)


def edge_check(model: Any, task: circuits.Task, scores: circuits.EdgeScores, n: int, *, seed: int = 0,
               batch_size: int = 16) -> pd.DataFrame:
    """Path patching (the sender's corrupted output reaches only that receiver, everything downstream recomputed
    on the frozen-LayerNorm model) of the ``n`` top-scored edges and ``n`` edges drawn at random (``seed``) from
    the rest: a row per edge with ``chosen`` ("top" | "random"), ``score`` (the edge method's estimate) and
    ``path_patching`` (the exact effect it estimates)."""
    table = scores.table()
    top = table.head(n).assign(chosen="top")
    rest = table.iloc[n:]
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(rest), size=min(n, len(rest)), replace=False) if len(rest) else []
    sample = pd.concat([top, rest.iloc[np.sort(pick)].assign(chosen="random")], ignore_index=True)
    exact = circuits.path_patch(model, task, list(sample.edge), batch_size=batch_size)
    sample["path_patching"] = exact.effect.to_numpy()
    return sample[["edge", "chosen", "rank", "score", "path_patching", "method", "n_pairs"]]


def circuit_table(circuit: circuits.Circuit, scores: circuits.EdgeScores) -> pd.DataFrame:
    """A row per edge of ``circuit`` with its score, and the circuit's faithfulness and references."""
    g = scores.graph
    s_of = {n: i for i, n in enumerate(g.senders)}
    r_of = {n: i for i, n in enumerate(g.receivers)}
    rows = []
    for e in circuit.edges:
        s, _, r = e.partition("->")
        rows.append({"edge": e, "sender": s, "receiver": r, "score": float(scores.scores[s_of[s], r_of[r]])})
    df = pd.DataFrame(rows, columns=["edge", "sender", "receiver", "score"])
    df["faithfulness"], df["m_circuit"] = circuit.faithfulness, circuit.m_circuit
    df["m_full"], df["m_empty"], df["n_evaluations"] = circuit.m_full, circuit.m_empty, circuit.n_evaluations
    return df


def head_overlap(found: set[tuple[int, int]], other: set[tuple[int, int]], n_heads: int) -> dict[str, float]:
    """Overlap of two head sets against chance: ``overlap``, ``expected`` (``|A| |B| / n``) and the
    hypergeometric ``p_value`` of at least that overlap when ``found`` is a random draw of its size."""
    from scipy.stats import hypergeom

    k = len(found & other)
    p = float(hypergeom.sf(k - 1, n_heads, len(other), len(found))) if found and other else float("nan")
    return {"overlap": float(k), "n_found": float(len(found)), "n_other": float(len(other)),
            "expected": len(found) * len(other) / n_heads, "p_value": p}


class _Timer:
    """Wall time of a call, and of one clean forward pass over the task (the unit of forward-equivalents)."""

    def __init__(self, model: Any, task: circuits.Task, batch_size: int) -> None:
        start = time.perf_counter()
        circuits.metric_values(model, task, "clean", batch_size)
        self.forward_seconds = max(time.perf_counter() - start, 1e-9)

    @staticmethod
    def time(fn: Callable[[], Any]) -> tuple[Any, float]:
        start = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - start


def duplicate_heads(out_root: Path, corpus_id: str) -> set[tuple[int, int]] | None:
    """The same-token experiment's held-out top duplicate heads in this run (attention weighting, on the run's
    corpus: both halves' choices), or None when its table is absent."""
    for name in ("held_out.parquet", "held_out.csv"):
        path = Path(out_root) / "same_token" / name
        if path.is_file():
            df = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
            rows = df[(df.weighting == "attention") & df.criterion.str.startswith("duplicate")]
            if "corpus" in rows and (rows.corpus == corpus_id).any():
                rows = rows[rows.corpus == corpus_id]
            return {(int(r.layer), int(r.head)) for r in rows.itertuples()} | {
                (int(r.layer_other), int(r.head_other)) for r in rows.itertuples()}
    return None
