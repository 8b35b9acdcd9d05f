"""The `circuits` experiment's findings: sentences formatted from its saved tables only."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from bertscope.experiments.circuits.plots import read_table
from bertscope.experiments.findings import Finding, fmt_ci
from bertscope.experiments.naming import head_name
from bertscope.hooks.circuits import table
from bertscope.hooks.naming import head_of

CAPTIONS: dict[str, str] = {
    "fig_head_maps": "Which heads carry the term-frequency signal: each head's effect on the cosine between the "
    "query term and the document when that head's output is patched from the corrupted document (filler word) "
    "into the clean one (query term repeated), as a share of the whole clean-to-corrupted change. One panel "
    "per method: exact patching, and the gradient estimates AtP, AtP* and EAP-IG of the same quantity.",
    "fig_circuit": "The circuit found by greedy pruning with exact patching on the frozen-LayerNorm model, drawn "
    "by layer: the embeddings at the bottom, each layer's attention heads (by head number) and MLP above it, the "
    "output (the metric) at the top; grey dots are the model's other heads and MLPs. An arrow is an edge the "
    "circuit keeps; its width is the size of its EAP-IG score (the estimated change of the metric when only "
    "that edge is corrupted), its colour the score's sign (legend). Faithfulness 1 = the circuit alone recovers "
    "the full model's metric, 0 = no better than the corrupted run.",
    "fig_faithfulness": "Faithfulness of circuits made of the top edges by score (black) and of random edge "
    "orders (grey), as a function of the fraction of edges kept: 1 = the circuit alone recovers the full "
    "model's metric, 0 = no better than the corrupted run. CPR is the area under the curve, CMD the area "
    "between it and 1 (MIB).",
}


def findings(out_dir: Path) -> list[Finding]:
    """Top heads, agreement of the estimates with exact patching, the residual share, the circuit against random
    circuits, and the duplicate-head overlap; a sentence is left out when its table is missing."""
    out_dir = Path(out_dir)
    out: list[Finding] = []
    results, agreement = read_table(out_dir, "results"), read_table(out_dir, "agreement")
    if results is not None:
        out += _top_heads(results, read_table(out_dir, "resid"))
    if agreement is not None and not agreement.empty:
        has_ci = "spearman_low" in agreement
        recall = "recall_at_10" in agreement
        parts = [f"{table.label(r.method)} {r.spearman:.2f}"
                 + (f" [{r.spearman_low:.2f}, {r.spearman_high:.2f}]" if has_ci else "")
                 + (f" (top-10 recall {r.recall_at_10:.2f})" if recall and pd.notna(r.recall_at_10) else "")
                 + (" against mean |effect|" if getattr(r, "reference", "") == "mean |effect|" else "")
                 for r in agreement.itertuples()]
        ci = "; 95% bootstrap intervals over pairs" if has_ci else ""
        out.append(Finding(
            f"Agreement with exact patching over the {int(agreement.n_heads.iloc[0])} heads (Spearman of the "
            f"mean effects{ci}; top-10 recall: the share of exact patching's 10 largest |effects| among the "
            f"estimate's 10 largest): {'; '.join(parts)}." if recall else
            f"Agreement with exact patching over the {int(agreement.n_heads.iloc[0])} heads (Spearman of the "
            f"mean effects{ci}): {'; '.join(parts)}.",
            numbers={f"spearman:{r.method}": float(r.spearman) for r in agreement.itertuples()}))
    check = read_table(out_dir, "edge_check")
    if check is not None and len(check) >= 3:
        out.append(_edge_check(check))
    circuit, areas, rand = (read_table(out_dir, n) for n in ("circuit", "areas", "random_circuits"))
    if circuit is not None and areas is not None and rand is not None and not circuit.empty:
        out.append(_circuit(circuit, areas, rand))
    overlap = read_table(out_dir, "overlap")
    if overlap is not None and not overlap.empty:
        r = overlap.iloc[0]
        out.append(Finding(
            f"The circuit's {int(r.n_found)} heads include {int(r.overlap)} of the same-token experiment's "
            f"{int(r.n_other)} duplicate heads (chance: {r.expected:.1f}; hypergeometric p = {r.p_value:.2g}).",
            numbers={"overlap": float(r.overlap), "expected": float(r.expected), "p_value": float(r.p_value)}))
    return out


def _top_heads(results: pd.DataFrame, resid: pd.DataFrame | None) -> list[Finding]:
    exact = results[results.method == "exact"]
    if exact.empty:
        return []
    top = exact.reindex(exact.normalised.abs().sort_values(ascending=False).index).head(3)
    parts = [f"{head_name(r.layer, r.head)} {fmt_ci(r.normalised, r.normalised_low, r.normalised_high)}"
             for r in top.itertuples()]
    text = (f"Patching one head at a time (corrupted into clean, {int(exact.n_pairs.iloc[0])} pairs), the heads "
            f"carrying the largest share of the term-frequency effect are {'; '.join(parts)}.")
    numbers = {f"normalised:{head_name(r.layer, r.head)}": float(r.normalised) for r in top.itertuples()}
    if resid is not None and not resid.empty:
        last = resid[resid.layer == resid.layer.max()].iloc[0]
        text += (f" The injected token's own final hidden state, patched alone, carries "
                 f"{fmt_ci(last.normalised, last.normalised_low, last.normalised_high)} of it directly through "
                 "the mean pooling.")
        numbers["resid_final_share"] = float(last.normalised)
    return [Finding(text, numbers=numbers)]


def _circuit(circuit: pd.DataFrame, areas: pd.DataFrame, rand: pd.DataFrame) -> Finding:
    f = float(circuit.faithfulness.iloc[0])
    ours = areas[areas.ordering == "scores"].iloc[0]
    others = areas[areas.ordering != "scores"]
    beaten = int((rand.faithfulness < f).sum())
    heads = sorted({head_of(n) for n in set(circuit.sender) | set(circuit.receiver) if head_of(n)})
    names = ", ".join(head_name(*h) for h in heads)
    text = (f"Greedy pruning with exact patching keeps {len(circuit)} edges ({len(heads)} heads"
            f"{': ' + names if heads else ''}) with faithfulness "
            f"{f:.2f}; {beaten} of {len(rand)} random circuits of the same size score lower (best random "
            f"{rand.faithfulness.max():.2f}). The top-edge faithfulness curve has CPR {ours.cpr:.3f} and CMD "
            f"{ours.cmd:.3f}")
    text += (f" against CPR {others.cpr.max():.3f} at best for {len(others)} random edge orders." if len(others)
             else ".")
    return Finding(text, numbers={"faithfulness": f, "cpr": float(ours.cpr), "cmd": float(ours.cmd),
                                  "random_beaten": float(beaten)})


def _edge_check(check: pd.DataFrame) -> Finding:
    rho = float(check.score.corr(check.path_patching, method="spearman"))
    top = check[check.chosen == "top"]
    share = float(top.path_patching.abs().sum() / max(check.path_patching.abs().sum(), 1e-300))
    text = (f"Path patching (the exact effect each edge score estimates) of the {len(top)} top-scored and "
            f"{len(check) - len(top)} random edges: Spearman {rho:.2f} between the {top.method.iloc[0]} edge scores "
            f"and the exact effects; the top edges carry {share:.0%} of the summed absolute effect of the sample.")
    return Finding(text, numbers={"edge_spearman": rho, "top_share": share})
