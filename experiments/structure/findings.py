"""Findings of the structure experiment: sentences generated from its saved tables (``summary``, ``results``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from bertscope.experiments.findings import Finding, fmt_ci
from bertscope.experiments.naming import residual_name

CAPTIONS = {
    "structure_layers": "Structural probes per layer on held-out sentences: UUAS and distance Spearman (distance "
    "probe), root accuracy and norm Spearman (depth probe); the random-weights model, sublayer sites and, for "
    "UUAS, the linear-chain and random-tree baselines beside them. Bands: 95% bootstrap over sentences.",
    "structure_rank": "UUAS of the distance probe against its rank k, per layer: the smallest k that reaches the "
    "full-rank interval is the dimension the tree needs.",
    "structure_trees": "Gold trees (above) and the minimum spanning trees of the predicted distances (below) for "
    "a few test sentences at the layer with the highest UUAS on the dev sentences.",
}


def findings(out_dir: Path) -> list[Finding]:
    """Where UUAS peaks, against the embedding layer, the random-weights model and the linear-chain baseline,
    with intervals; the smallest sufficient rank; the depth probe's best layer."""
    path = Path(out_dir) / "summary.parquet"
    if not path.is_file():
        return []
    s = pd.read_parquet(path)
    if s.empty or "uuas" not in s:
        return []
    out = []
    best = s.loc[_chosen(s, "uuas")]
    emb = s[s["layer"] == 0]
    layer = int(best["layer"])
    where = ("Chosen on the dev sentences" if "dev_uuas" in s
             else "Chosen on the test sentences themselves (this table predates dev scores)")
    text = (f"{where}, the residual stream {residual_name(layer)} (of {int(s['layer'].max())} layers) has the "
            f"distance probe's best UUAS; on the test sentences it reaches "
            f"{fmt_ci(best['uuas'], best['uuas_ci_low'], best['uuas_ci_high'])}")
    nums = {"peak_layer": layer, "peak_uuas": float(best["uuas"])}
    if len(emb):
        e = emb.iloc[0]
        text += f", against {fmt_ci(e['uuas'], e['uuas_ci_low'], e['uuas_ci_high'])} at the embeddings"
        nums["embedding_uuas"] = float(e["uuas"])
    lin = float(best["linear_chain_uuas"])
    text += (f", the linear-chain tree's {lin:.2f} and a random tree's {float(best['random_tree_uuas']):.2f}")
    nums["linear_chain_uuas"] = lin
    if "random_uuas" in s and pd.notna(best.get("random_uuas")):
        text += f"; the random-weights model reaches {float(s['random_uuas'].max()):.2f} at its best layer"
        nums["random_weights_best_uuas"] = float(s["random_uuas"].max())
    verdict = "above" if best["uuas_ci_low"] > lin else "not clearly above"
    out.append(Finding(text + f" (the chosen layer is {verdict} the linear baseline).", numbers=nums))
    if "dspr" in s:
        b = s.loc[_chosen(s, "dspr")]
        out.append(Finding(f"Distance Spearman is best {_at(b['layer'])} (chosen on dev): "
                           f"{fmt_ci(b['dspr'], b['dspr_ci_low'], b['dspr_ci_high'])} on test.",
                           numbers={"dspr_layer": int(b["layer"]), "dspr": float(b["dspr"])}))
    if "root_acc" in s:
        b = s.loc[_chosen(s, "root_acc")]
        out.append(Finding(f"The depth probe finds the root best {_at(b['layer'])} (chosen on dev): root "
                           f"accuracy {fmt_ci(b['root_acc'], b['root_acc_ci_low'], b['root_acc_ci_high'])}, NSpr "
                           f"{fmt_ci(b['nspr'], b['nspr_ci_low'], b['nspr_ci_high'])} on test.",
                           numbers={"root_layer": int(b["layer"]), "root_acc": float(b["root_acc"])}))
    out += _training(Path(out_dir))
    if pd.notna(best.get("smallest_rank")):
        out.append(Finding(f"{_at(layer).capitalize()} a rank-{int(best['smallest_rank'])} probe already reaches the "
                           f"full-rank probe's dev interval; its test UUAS is "
                           f"{float(best['uuas_at_smallest_rank']):.2f}.",
                           numbers={"smallest_rank": int(best["smallest_rank"])}))
    return out


def _at(index: int) -> str:
    """The summary's ``layer`` (0 = embeddings, k = after block k - 1) as words: "at the embeddings" /
    "after layer 2"."""
    name = residual_name(int(index))
    return "at the embeddings" if name == "embeddings" else name


def _chosen(s: pd.DataFrame, metric: str) -> int:
    """The summary row of the layer chosen for ``metric``: highest on the dev split (tables written before dev
    scores existed: highest on test, the only split they hold)."""
    col = f"dev_{metric}"
    return int(s[col].idxmax()) if col in s and s[col].notna().any() else int(s[metric].idxmax())


def _training(out_dir: Path) -> list[Finding]:
    """How the probes stopped (from ``training``): all early-stopped, or how many hit the epoch cap."""
    path = out_dir / "training.parquet"
    if not path.is_file():
        return []
    t = pd.read_parquet(path)
    if t.empty:
        return []
    n, early = len(t), int(t["early_stopped"].sum())
    lo, hi = int(t["stopped_epoch"].min()), int(t["stopped_epoch"].max())
    cap = int(t["max_epochs"].iloc[0])
    text = (f"All {n} probes stopped early on the dev loss, after {lo} to {hi} epochs (cap {cap})." if early == n
            else f"{n - early} of {n} probes reached the {cap}-epoch cap before early stopping (epochs {lo} to "
            f"{hi}): their numbers are those of probes still improving.")
    return [Finding(text, numbers={"probes": n, "early_stopped": early, "stopped_epoch_min": lo,
                                   "stopped_epoch_max": hi})]
