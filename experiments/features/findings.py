"""Findings of the features experiment: sentences generated from its saved tables (``summary``, ``results``,
``baselines``, ``sparse_probing_summary``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from bertscope.experiments.features.plots import SOURCE_NAMES, VARIABLE_NAMES, site_words
from bertscope.experiments.findings import Finding, fmt_ci

CAPTIONS = {
    "fig_labelled_units": "Units whose dev-chosen label reaches test MCC at or above the stated threshold, per "
    "concept family (position: word pieces' position and distance to [SEP]; [CLS] and [SEP] detectors count as "
    "special tokens, not position), one panel per dictionary (its layer and the hooks it reads; a transcoder also "
    "names the hook it predicts): the dictionary's latents, the site's neurons (a transcoder's: the MLP's own), "
    "its PCA directions, "
    "the re-initialised model's latents (a dictionary of the same width and training rows), and the latents against "
    "shuffled labels (chance; zero bars are expected). Each panel has its own count axis; the numbers are the "
    "counts.",
    "fig_sparse_probing": "k-sparse probing (SAEBench's protocol: top-k units by mean difference on train, logistic "
    "probe, balanced test accuracy) averaged over a variable's one-vs-rest concepts, one row per variable and one "
    "column per dictionary, one line per kind of unit. Error bars: 95% bootstrap over test sentences (all concepts "
    "resampled together; the training of the dictionary is not resampled).",
}
FAMILIES = ("position", "duplicate", "syntax", "special")
#: A family in a sentence: special tokens are token identities, counted apart from position (`labels`).
FAMILY_WORDS = {"special": "special-token ([CLS], [SEP]) or punctuation"}


def findings(out_dir: Path) -> list[Finding]:
    """Per site: labelled latents per family against neurons, PCA, the re-initialised model and shuffled labels;
    the share of alive latents beating both single-unit baselines; the best position and duplicate latents with
    intervals beside the best neuron; k-sparse probing at the smallest and largest k per variable."""
    out_dir = Path(out_dir)
    if not (out_dir / "summary.parquet").is_file():
        return []
    s = pd.read_parquet(out_dir / "summary.parquet")
    r = pd.read_parquet(out_dir / "results.parquet") if (out_dir / "results.parquet").is_file() else None
    b = pd.read_parquet(out_dir / "baselines.parquet") if (out_dir / "baselines.parquet").is_file() else None
    out: list[Finding] = []
    for site, g in s.groupby("site", sort=False):
        rows = {(e, basis): row for (e, basis), row in zip(zip(g["encoder"], g["basis"], strict=True),
                                                          g.to_dict("records"), strict=True)}
        lat = rows.get(("trained", "latent"))
        if lat is None:
            continue
        t = lat["threshold"]
        fams = ", ".join(f"{lat[f'n_{f}']} {FAMILY_WORDS.get(f, f)}" for f in FAMILIES)
        where = site_words(site, lat["kind"], int(lat["layer"]), short=True)
        where += f" ({site})" if lat["kind"] == "sae" else f" ({site} -> blocks.{int(lat['layer'])}.hook_mlp_out)"
        text = (f"At the {where}, {lat['n_labelled']} of {lat['n_units']} alive latents carry a label "
                f"at test MCC >= {t:.2f} ({fams})")
        nums = {"n_labelled": float(lat["n_labelled"]), "n_alive": float(lat["n_units"])}
        for key, name in ((("trained", "neuron"), "neurons"), (("trained", "pca"), "PCA directions"),
                          (("reinit", "latent"), "re-initialised-model latents"),
                          (("trained", "latent_shuffled_labels"), "latents against shuffled labels")):
            if key in rows:
                text += f"; {rows[key]['n_labelled']} of {rows[key]['n_units']} {name}"
                nums[f"n_labelled_{key[0]}_{key[1]}"] = float(rows[key]["n_labelled"])
        text += (f". {100 * lat['share_beating_neuron_and_pca']:.0f}% of its alive latents score higher on test "
                 "than the best single neuron and the best PCA direction for their own label (both chosen on dev).")
        nums["share_beating"] = float(lat["share_beating_neuron_and_pca"])
        out.append(Finding(text, numbers=nums))
        if r is not None and b is not None:
            out += _best(r, b, site)
    p_path = out_dir / "sparse_probing_summary.parquet"
    if p_path.is_file():
        out += _sparse(pd.read_parquet(p_path))
    return out


def _best(r: pd.DataFrame, b: pd.DataFrame, site: str) -> list[Finding]:
    out = []
    lat = r[(r["site"] == site) & (r["encoder"] == "trained") & (r["basis"] == "latent")]
    for fam in ("position", "duplicate"):
        g = lat[lat["family"] == fam]
        if g.empty:
            continue
        top = g.loc[g["test_mcc"].idxmax()]
        ref = b[(b["site"] == site) & (b["encoder"] == "trained") & (b["label"] == top["label"])]
        nb = ref[ref["basis"] == "neuron"]
        if nb.empty:
            continue
        nb = nb.iloc[0]
        out.append(Finding(
            f"At {site}, the best {fam} latent ({int(top['unit'])}, labelled {top['label']} on dev) reaches test MCC "
            f"{fmt_ci(top['test_mcc'], top['ci_low'], top['ci_high'])}; the best single neuron for {top['label']} "
            f"reaches {fmt_ci(nb['test_mcc'], nb['ci_low'], nb['ci_high'])}.",
            numbers={"latent_mcc": float(top["test_mcc"]), "neuron_mcc": float(nb["test_mcc"])}))
    return out


def _sparse(p: pd.DataFrame) -> list[Finding]:
    out = []
    if p.empty:
        return out
    for (site, var), g in p.groupby(["site", "variable"], sort=False):
        for k in sorted({int(g["k"].min()), int(g["k"].max())}):
            h = g[g["k"] == k].set_index("source")
            if "latent" not in h.index:
                continue
            parts = [f"{SOURCE_NAMES[src]} "
                     f"{fmt_ci(h.loc[src, 'accuracy'], h.loc[src, 'ci_low'], h.loc[src, 'ci_high'])}"
                     for src in ("latent", "neuron", "pca", "reinit_latent") if src in h.index]
            n = int(h.loc["latent", "n_concepts"])
            out.append(Finding(
                f"At {site}, {k}-sparse probes for {VARIABLE_NAMES.get(var, var)} ({n} one-vs-rest "
                f"concept{'s' if n != 1 else ''}, balanced test accuracy): " + ", ".join(parts) + ".",
                numbers={f"{src}_accuracy": float(h.loc[src, "accuracy"]) for src in h.index}))
    return out
