"""Findings of the erasure experiment: sentences generated from its saved tables (``results``, ``summary``,
``probing``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from bertscope.experiments.findings import Finding, fmt_ci

CAPTIONS = {
    "erasure_uuas": "Change in the distance probe's UUAS at every layer after erasing each concept at one layer "
    "(solid: the erasure method; dashed: a random subspace of the same rank). Bands: 95% bootstrap over "
    "evaluation sentences.",
    "erasure_probes": "Change in the accuracy of clean-trained word-level probes at the last layer after each "
    "erasure, per probed concept, beside the equal-rank random subspace. Bars: 95% bootstrap over evaluation "
    "sentences.",
    "erasure_probing": "Clean word-level probes per layer on the evaluation sentences: task accuracy, the Hewitt "
    "& Liang control task, and their difference (selectivity). Bands: 95% bootstrap over sentences.",
}


def findings(out_dir: Path) -> list[Finding]:
    """For each erased concept and layer with LEACE: the UUAS change at the last layer against the random
    subspace; the same concept's probe; and INLP's extra removal measured by the control task."""
    path = Path(out_dir) / "results.parquet"
    if not path.is_file():
        return []
    r = pd.read_parquet(path)
    s = pd.read_parquet(Path(out_dir) / "summary.parquet") if (Path(out_dir) / "summary.parquet").is_file() else None
    out: list[Finding] = []
    last = int(r["layer"].max())
    for (concept, layer), g in r[r["method"] == "leace"].groupby(["concept", "erase_layer"], sort=False):
        rank = int(g["rank"].iloc[0])
        u = _one(g, "uuas", last)
        ctrl = _one(r[(r["concept"] == concept) & (r["erase_layer"] == layer) & (r["method"] == "random")
                      & (r["rank"] == rank)], "uuas", last)
        if u is None or ctrl is None:
            continue
        same = _one(g, "probe_accuracy", last, concept)
        text = (f"Erasing {concept} with LEACE at layer {layer} (rank {rank}) changes layer-{last} UUAS by "
                f"{u['delta']:+.3f} (erased {fmt_ci(u['value'], u['ci_low'], u['ci_high'])}), against "
                f"{ctrl['delta']:+.3f} for a random subspace of the same rank")
        nums = {"concept": concept, "erase_layer": int(layer), "uuas_delta": float(u["delta"]),
                "random_uuas_delta": float(ctrl["delta"])}
        if same is not None:
            text += (f"; the clean layer-{last} {concept} probe changes by "
                     f"{fmt_ci(same['delta'], same['delta_ci_low'], same['delta_ci_high'], 3)}")
            nums["same_probe_delta"] = float(same["delta"])
        out.append(Finding(text + ".", numbers=nums))
    if s is not None and not s.empty and {"inlp", "leace"} <= set(s["method"]):
        for (concept, layer), g in s.groupby(["concept", "erase_layer"], sort=False):
            m = g.set_index("method")
            if not {"inlp", "leace"} <= set(m.index):
                continue
            li, ll = m.loc["inlp"], m.loc["leace"]
            out.append(Finding(
                f"At layer {layer}, INLP removes rank {int(li['rank'])} for {concept} (LEACE: {int(ll['rank'])}); "
                f"the word-identity control task there changes by {li['site_control_delta']:+.3f} after INLP, "
                f"{ll['site_control_delta']:+.3f} after LEACE and {li['random_site_control_delta']:+.3f} after "
                f"INLP's equal-rank random subspace.",
                numbers={"concept": concept, "erase_layer": int(layer), "inlp_rank": int(li["rank"]),
                         "inlp_control_delta": float(li["site_control_delta"]),
                         "leace_control_delta": float(ll["site_control_delta"])}))
    return out


def _one(g: pd.DataFrame, measure: str, layer: int, target: str | None = None) -> pd.Series | None:
    m = g[(g["measure"] == measure) & (g["layer"] == layer)]
    if target is not None:
        m = m[m["target"] == target]
    return m.iloc[0] if len(m) else None
