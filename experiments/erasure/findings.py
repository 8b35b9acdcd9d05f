"""Findings of the erasure experiment: sentences generated from its saved tables (``results``, ``summary``),
largest effect first. Layers are named as everywhere (`experiments.naming`): the tables' ``layer`` and
``erase_layer`` count the embeddings as 0, so index k is the residual stream "after layer k-1"."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from bertscope.experiments.findings import Finding, fmt_ci
from bertscope.experiments.naming import residual_name

CAPTIONS = {
    "erasure_uuas": "UUAS of the clean-trained distance probe at every later layer after erasing a concept at one "
    "layer (rows: erased concept; columns: where it is erased, marked by the vertical line), for each method "
    "(solid) and a random subspace of the same rank (dashed, same colour; methods of equal rank share one random "
    "subspace, so their dashed lines coincide); black: the clean run; grey dotted: a "
    "random tree and the linear chain, trees that read no vectors. Bands: 95% bootstrap over evaluation sentences. "
    "Layers: emb = the embeddings, L = the residual stream after layer L.",
    "erasure_probes": "Change in the accuracy of clean-trained word-level probes in the last layer's residual "
    "stream after each erasure (panels: erased concept and where; groups: the probed concept; bars: methods, "
    "ranks in the legend), with the equal-rank random subspace of each method as a black tick. Error bars: "
    "paired 95% bootstrap over evaluation sentences.",
    "erasure_probing": "Clean word-level probes (ridge regression on one-hot labels, arg-max) in the residual "
    "stream at every layer, on the evaluation sentences. Top: task accuracy, the Hewitt & Liang control task (one "
    "random label per word type) and the majority baseline; bottom: selectivity (task minus control). Bands: "
    "95% bootstrap over sentences. The position target is the word's index in its sentence (20+ pooled), read "
    "from the mean of the word's pieces: a word sits at a piece position shifted by the extra pieces of the "
    "words before it, which its own vector does not carry, so this probe stays near 0.5 even at the embeddings, "
    "where the positions experiment reads a piece's own position at 0.99 (docs/experiments/erasure.md).",
}

METHODS = {"leace": "LEACE", "inlp": "INLP", "mean": "mean projection"}


def _at(index: int) -> str:
    """Where an erasure happens, in words: ``"at the embeddings"`` or ``"after layer 2"``."""
    name = residual_name(index)
    return "at the embeddings" if name == "embeddings" else name


def findings(out_dir: Path) -> list[Finding]:
    """Every sentence, ordered by the size of the effect it cites: per erased concept, how much its own probe in
    the last layer loses under each method (against the equal-rank random subspace); what else goes (other
    probes, the sentence embedding); the parse tree's UUAS against trees that read no vectors; INLP's extra
    removal by the control task."""
    out_dir = Path(out_dir)
    path, spath = out_dir / "results.parquet", out_dir / "summary.parquet"
    if not path.is_file() or not spath.is_file():
        return []
    r, s = pd.read_parquet(path), pd.read_parquet(spath)
    if s.empty:
        return []
    last = int(r["layer"].max())
    sized: list[tuple[float, Finding]] = []
    sized += _removal(s, last)
    sized += _collateral(s, last)
    sized += _tree(r, s, last)
    sized += _control(s)
    return [f for _, f in sorted(sized, key=lambda t: -t[0])]


def _removal(s: pd.DataFrame, last: int) -> list[tuple[float, Finding]]:
    out = []
    for concept, g in s.groupby("concept", sort=False):
        g = g.dropna(subset=["same_delta"])
        if g.empty:
            continue
        top = g.loc[g["same_delta"].abs().idxmax()]
        rest = [f"{row.same_delta:+.3f} ({METHODS.get(row.method, row.method)} {_at(row.erase_layer)}, rank "
                f"{int(row.rank)})" for row in g.sort_values(["erase_layer", "method"]).itertuples()
                if row.Index != top.name]
        text = (f"Erasing {concept} {_at(int(top['erase_layer']))} with {METHODS.get(top['method'], top['method'])} "
                f"(rank {int(top['rank'])}) changes the clean {concept} probe's accuracy {residual_name(last)} by "
                f"{fmt_ci(top['same_delta'], top['same_delta_ci_low'], top['same_delta_ci_high'], 3)}, against "
                f"{top['random_same_delta']:+.3f} for a random subspace of the same rank")
        text += f"; the other erasures of {concept}: " + ", ".join(rest) + "." if rest else "."
        out.append((abs(float(top["same_delta"])), Finding(text, numbers={
            "concept_same_delta": float(top["same_delta"]), "random_same_delta": float(top["random_same_delta"]),
            "erase_layer": int(top["erase_layer"])})))
    return out


def _collateral(s: pd.DataFrame, last: int) -> list[tuple[float, Finding]]:
    g = s.dropna(subset=["embedding_cosine"])
    if g.empty:
        return []
    worst = g.loc[g["embedding_cosine"].idxmin()]
    same = g[(g["concept"] == worst["concept"]) & (g["erase_layer"] == worst["erase_layer"])]
    others = ", ".join(f"{METHODS.get(m, m)} {c:.3f}" for m, c in zip(same["method"], same["embedding_cosine"],
                                                                        strict=True) if m != worst["method"])
    text = (f"{METHODS.get(worst['method'], worst['method'])} removes the most besides the concept: erasing "
            f"{worst['concept']} {_at(int(worst['erase_layer']))} (rank {int(worst['rank'])}) leaves the sentence "
            f"embedding a cosine of {worst['embedding_cosine']:.3f} to the clean one (a random subspace of the same "
            f"rank: "
            f"{worst['random_embedding_cosine']:.3f}{'; ' + others if others else ''}) and changes the other "
            f"concepts' probes {residual_name(last)} by {worst['other_delta']:+.3f} on average (random: "
            f"{worst['random_other_delta']:+.3f}).")
    size = max(1.0 - float(worst["embedding_cosine"]), abs(float(worst["other_delta"])))
    return [(size, Finding(text, numbers={"embedding_cosine": float(worst["embedding_cosine"]),
                                          "other_delta": float(worst["other_delta"])}))]


def _tree(r: pd.DataFrame, s: pd.DataFrame, last: int) -> list[tuple[float, Finding]]:
    """The largest UUAS change at any later layer (where the clean probe is strong, not only the last layer),
    against its random subspace; the last layer's range; the clean probe at its best against the trees that read
    no vectors."""
    u = r[r["measure"] == "uuas"]
    clean = u[u["method"] == "none"].set_index("layer")
    erased = u[~u["method"].isin(["none", "random"])]
    if clean.empty or erased.empty:
        return []
    top = erased.loc[erased["delta"].abs().idxmax()]
    ctrl = u[(u["method"] == "random") & (u["concept"] == top["concept"]) & (u["erase_layer"] == top["erase_layer"])
             & (u["rank"] == top["rank"]) & (u["layer"] == top["layer"])]
    k = int(top["layer"])
    text = (f"The parse tree read by the distance probe changes most when {top['concept']} is erased "
            f"{_at(int(top['erase_layer']))} with {METHODS.get(top['method'], top['method'])} (rank "
            f"{int(top['rank'])}): UUAS {residual_name(k)} goes from {clean.loc[k, 'value']:.3f} to "
            f"{fmt_ci(top['value'], top['ci_low'], top['ci_high'], 3)} ({top['delta']:+.3f}")
    if len(ctrl):
        text += f"; a random subspace of the same rank: {float(ctrl['delta'].iloc[0]):+.3f}"
    text += ")"
    nums = {"uuas_delta": float(top["delta"]), "uuas_layer": k}
    g = s.dropna(subset=["uuas_delta"])
    if len(g):
        lo, hi = float(g["uuas_delta"].min()), float(g["uuas_delta"].max())
        text += f"; {residual_name(last)} the erasures move it by {lo:+.3f} to {hi:+.3f}"
        nums.update(uuas_delta_last_min=lo, uuas_delta_last_max=hi)
    best = clean["value"].idxmax()
    b = clean.loc[best]
    text += (f". The clean probe is best {_at(int(best))} "
             f"({fmt_ci(b['value'], b['ci_low'], b['ci_high'], 3)})")
    nums["clean_uuas_best"] = float(b["value"])
    rt, chain = _one(r, "uuas_random_tree", last), _one(r, "uuas_linear_chain", last)
    if rt is not None and chain is not None:
        text += f", against {rt['value']:.3f} for a random tree and {chain['value']:.3f} for the linear chain"
        nums.update(random_tree_uuas=float(rt["value"]), linear_chain_uuas=float(chain["value"]))
        if float(b["ci_high"]) <= float(chain["value"]):
            text += (" (trees that read no vectors): at this size the probe does not beat the chain, so UUAS "
                     "changes are weaker evidence about syntax than the probe accuracies")
    return [(abs(float(top["delta"])), Finding(text + ".", numbers=nums))]


def _control(s: pd.DataFrame) -> list[tuple[float, Finding]]:
    out = []
    if not {"inlp", "leace"} <= set(s["method"]):
        return out
    for (concept, layer), g in s.groupby(["concept", "erase_layer"], sort=False):
        m = g.set_index("method")
        if not {"inlp", "leace"} <= set(m.index) or np.isnan(m.loc["inlp", "site_control_delta"]):
            continue
        li, ll = m.loc["inlp"], m.loc["leace"]
        out.append((abs(float(li["site_control_delta"])), Finding(
            f"Erasing {concept} {_at(int(layer))}, INLP removes rank {int(li['rank'])} (LEACE: {int(ll['rank'])}); "
            f"the word-identity control task there changes by {li['site_control_delta']:+.3f} after INLP, "
            f"{ll['site_control_delta']:+.3f} after LEACE and {li['random_site_control_delta']:+.3f} after "
            f"a random subspace of the same rank as INLP's.",
            numbers={"concept": concept, "erase_layer": int(layer), "inlp_rank": int(li["rank"]),
                     "inlp_control_delta": float(li["site_control_delta"]),
                     "leace_control_delta": float(ll["site_control_delta"])})))
    return out


def _one(g: pd.DataFrame, measure: str, layer: int, target: str | None = None) -> pd.Series | None:
    m = g[(g["measure"] == measure) & (g["layer"] == layer)]
    if target is not None:
        m = m[m["target"] == target]
    return m.iloc[0] if len(m) else None
