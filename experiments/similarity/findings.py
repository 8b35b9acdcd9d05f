"""The `similarity` experiment's findings: sentences formatted from its saved tables only."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from bertscope.experiments.findings import Finding, fmt_ci
from bertscope.experiments.similarity.plots import read_table
from bertscope.hooks.naming import head_name

CAPTIONS: dict[str, str] = {
    "fig_token_heatmaps": "Which token pairs make two texts similar: for a few attributed pairs (highest, middle "
    "and lowest cosine), each cell is the attribution of a word piece of text a (rows) and one of text b "
    "(columns) by the first method of the run (integrated Jacobians by default); red cells raise the "
    "similarity, blue cells lower it. Special tokens are included.",
    "fig_spearman_layers": "Spearman correlation between the cosine of pooled embeddings and the gold scores, "
    "per layer (the output of each block) and pooling, on the held-out report split, with 95% bootstrap "
    "intervals over pairs. The circle is the model's own sentence embedding; the star is the layer and pooling "
    "chosen on the separate select split.",
    "fig_head_shares": "Left: each attention head's mean share of the cosine (the exact decomposition of the "
    "pooled embeddings under frozen LayerNorm; a pair's shares over all components sum to its cosine). Right: "
    "how much the Spearman correlation with gold changes when that head is mean-ablated (negative: the head "
    "helps the ranking).",
    "fig_faithfulness": "Faithfulness of each attribution method: the mean drop of the cosine when the method's "
    "top-k token pairs are removed, against k random token pairs (dashed). Top row: a pair's token is removed from "
    "one text at a time (the other text intact; the mean of the two), which breaks the pair's match; bottom row: "
    "from both texts at once, which leaves matched texts parallel. Left: the removed tokens are replaced by the "
    "padding token (the reference of integrated Jacobians); right: they are deleted. Above the dashed line: the "
    "method finds pairs that matter more than chance; a drop below zero means the removal made the texts more "
    "similar. Bars are 95% bootstrap intervals over pairs.",
}


def findings(out_dir: Path) -> list[Finding]:
    """The benchmark, the heads, the methods' faithfulness and the two claims; a sentence is left out when its
    table is missing."""
    out_dir = Path(out_dir)
    out: list[Finding] = []
    benchmark = read_table(out_dir, "benchmark")
    if benchmark is not None and len(benchmark):
        out.append(_benchmark(benchmark))
    heads = read_table(out_dir, "heads")
    if heads is not None and (heads.kind == "head").any():
        out.append(_heads(heads))
    aopc, methods = read_table(out_dir, "aopc"), read_table(out_dir, "methods")
    if aopc is not None and len(aopc):
        out += _faithfulness(aopc, methods, read_table(out_dir, "faithfulness"))
    claims = read_table(out_dir, "claims")
    if claims is not None:
        out += [_claim(r) for r in claims.itertuples()]
    return out


def _benchmark(df: pd.DataFrame) -> Finding:
    rep = df[df.split == "report"]
    own = rep[rep.own].iloc[0]
    chosen = rep[rep.chosen].iloc[0]
    best = rep.loc[rep.spearman.idxmax()]
    text = (f"On {int(own.n_pairs)} held-out pairs the model's own embedding ({own.site}, {own.pooling} pooling) "
            f"has Spearman {fmt_ci(own.spearman, own.spearman_low, own.spearman_high, 3)} with gold. The site and "
            f"pooling chosen on the {int(df[df.split == 'select'].n_pairs.iloc[0])} select pairs, {chosen.site} "
            f"with {chosen.pooling} pooling, reach "
            f"{fmt_ci(chosen.spearman, chosen.spearman_low, chosen.spearman_high, 3)} there; "
            f"the best row of the report split itself is "
            f"{best.site}/{best.pooling} ({best.spearman:.3f}).")
    return Finding(text, numbers={"own_spearman": float(own.spearman), "chosen_spearman": float(chosen.spearman),
                                  "best_report_spearman": float(best.spearman)})


def _heads(df: pd.DataFrame) -> Finding:
    h = df[df.kind == "head"]
    top = h.sort_values("share", ascending=False).head(3)
    hurt = h.sort_values("spearman_change").head(3)
    layers = df.groupby("layer").share.sum()
    mlp = float(df[df.kind == "mlp"].share.sum())
    text = (f"Largest shares of the cosine (mean over {int(df.n_pairs.iloc[0])} pairs): "
            + "; ".join(f"{head_name(r.layer, r['head'])} {fmt_ci(r.share, r.share_low, r.share_high, 3)}"
                        for _, r in top.iterrows())
            + f". All heads together hold {h.share.sum():.3f} and the MLPs {mlp:.3f} of a mean cosine of "
            f"{df.share.sum():.3f}. Mean-ablating one head lowers the Spearman with gold (intact "
            f"{df.spearman_intact.iloc[0]:.3f}) most for "
            + "; ".join(f"{head_name(r.layer, r['head'])} {fmt_ci(r.spearman_change, r.change_low, r.change_high, 3)}"
                        for _, r in hurt.iterrows()) + ".")
    numbers = {f"share:{head_name(r.layer, r['head'])}": float(r.share) for _, r in top.iterrows()}
    numbers.update({f"layer_share:{int(k)}": float(v) for k, v in layers.items()})
    return Finding(text, numbers=numbers)


def _faithfulness(aopc: pd.DataFrame, methods: pd.DataFrame | None,
                  faith: pd.DataFrame | None = None) -> list[Finding]:
    out = []
    aopc = aopc if "sides" in aopc else aopc.assign(sides="both")
    modes = list(dict.fromkeys(zip(aopc.removal, aopc.sides, strict=True))) if "removal" in aopc else [(None, None)]
    for mode, sides in modes:
        sub = aopc if mode is None else aopc[(aopc.removal == mode) & (aopc.sides == sides)]
        rows = sub[sub.method != "random"].sort_values("aopc", ascending=False)
        rand = float(sub.random_aopc.iloc[0])
        how = {"reference": "replaced by the padding token", "delete": "deleted"}.get(str(mode), "removed")
        where = {"one": " from one text at a time", "both": " from both texts at once"}.get(str(sides), "")
        versus = {"not distinguishable": "not distinguishable from"}
        parts = [f"{r.method} {fmt_ci(r.aopc, r.aopc_low, r.aopc_high, 3)} ({versus.get(r.vs_random, r.vs_random)} "
                 "random)" for r in rows.itertuples()]
        text = (f"With the top token pairs' tokens {how}{where} (k = {sub.ks.iloc[0]}, {int(sub.n_pairs.iloc[0])} "
                f"pairs), the mean cosine drop (AOPC) is: {'; '.join(parts)}; random pairs: {rand:.3f}.")
        losers = rows[rows.vs_random != "above"].method.tolist()
        text += (f" Not above random: {', '.join(losers)}." if losers else " Every method is above random.")
        if faith is not None and len(faith) and mode is not None:
            f = faith if "sides" in faith else faith.assign(sides="both")
            f = f[(f.removal == mode) & (f.sides == sides) & (f.method != "random")]
            every = sorted(m for m, g in f.groupby("method") if (g.vs_random == "above").all())
            if every:
                text += f" Above random at every k: {', '.join(every)}."
        numbers = {f"aopc:{r.method}": float(r.aopc) for r in sub.itertuples()}
        ij, ro = sub[sub.method == "integrated-jacobians"], sub[sub.method == "mixing:rollout:attention"]
        if len(ij) and len(ro) and not float(ro.aopc_low.iloc[0]) > 0:
            text += " Attention rollout's AOPC is not clearly above zero here, so no ratio to it is stated."
        elif len(ij) and len(ro):
            r = ij.iloc[0]
            ratio = float(r.aopc / ro.aopc.iloc[0])
            interval = ""
            if "ratio_to_rollout_low" in sub and r.ratio_to_rollout_low == r.ratio_to_rollout_low:
                interval = f" [{r.ratio_to_rollout_low:.1f}, {r.ratio_to_rollout_high:.1f}] (95%, pairs resampled)"
            text += f" Integrated Jacobians' AOPC is {ratio:.1f}{interval} times attention rollout's."
            numbers["ij_over_rollout"] = ratio
        out.append(Finding(text, numbers=numbers))
    if methods is not None and len(methods):
        errs = "; ".join(f"{r.method} {r.relative_error:.2g}" for r in methods.itertuples())
        out.append(Finding(f"Conservation error |sum - target| / |score|, mean over the {int(methods.n_pairs.iloc[0])}"
                           f" attributed pairs (path methods at {int(methods.steps.iloc[0])} steps): {errs}.",
                           numbers={f"relative_error:{r.method}": float(r.relative_error)
                                    for r in methods.itertuples()}))
    return out


def _claim(r: object) -> Finding:
    verdict = {True: "holds", False: "does not hold", None: "is undecided"}[_verdict(r.holds)]
    if r.claim.startswith("embeddings mostly ignore negation"):
        text = (f"Claim \"{r.claim}\" {verdict} here: a sentence and its negation have cosine "
                f"{fmt_ci(r.value, r.value_low, r.value_high, 3)} ({int(r.n)} sentences, {int(r.n_skipped)} "
                f"without an auxiliary skipped), against {fmt_ci(r.control_value, r.control_low, r.control_high, 3)} "
                f"for the same-length control edit and {r.reference_value:.3f} for the gold paraphrases (>= 4).")
    else:
        text = (f"Claim \"{r.claim}\" {verdict} here: the top token pairs hold "
                f"{fmt_ci(r.value, r.value_low, r.value_high, 3)} of |attribution| ({int(r.n)} pairs) against "
                f"{fmt_ci(r.control_value, r.control_low, r.control_high, 3)} for the control without pair-specific "
                f"interaction and {r.reference_value:.3f} for a uniform spread.")
    return Finding(text, numbers={"value": float(r.value), "control": float(r.control_value),
                                  "difference": float(r.difference)})


def _verdict(value: object) -> bool | None:
    if value is None or (isinstance(value, float) and value != value):
        return None
    return bool(value)
