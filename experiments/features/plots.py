"""Figures of the features experiment and its feature browser, drawn from the saved tables only (``summary``,
``sparse_probing_summary``, ``browser_*``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from bertscope.experiments.io import FIGURE_FORMATS


def plot(out_dir: Path, formats: Sequence[str] | None = None) -> list[Path]:
    """Every figure of the experiment and ``feature_browser.html`` from the tables in ``out_dir`` (figures as
    ``formats``, png and pdf by default)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    formats = tuple(formats or FIGURE_FORMATS)
    from bertscope.experiments.features.browser import write_browser

    out_dir = Path(out_dir)
    path = out_dir / "summary.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; run `bertscope run features` first")
    written = _families(pd.read_parquet(path), out_dir, formats)
    if (out_dir / "sparse_probing_summary.parquet").is_file():
        written += _sparse(pd.read_parquet(out_dir / "sparse_probing_summary.parquet"), out_dir, formats)
    return written + write_browser(out_dir)


#: Legend names of the (model, basis) groups and of the k-sparse probing sources.
GROUP_NAMES = {("trained", "latent"): "latents", ("trained", "neuron"): "neurons",
               ("trained", "pca"): "PCA directions", ("reinit", "latent"): "re-initialised model's latents",
               ("trained", "latent_shuffled_labels"): "latents, shuffled labels (chance)"}
SOURCE_NAMES = {"latent": "latents", "neuron": "neurons", "pca": "PCA directions",
                "reinit_latent": "re-initialised model's latents"}
VARIABLE_NAMES = {"position": "absolute position", "upos": "UPOS", "repeats_earlier": "repeats an earlier token",
                  "relation": "dependency relation", "depth": "tree depth"}


def site_words(site: str, kind: str, layer: int, short: bool = False) -> str:
    """A dictionary's place in words: ``layer 3 MLP transcoder (reads hook_resid_mid, predicts hook_mlp_out)`` or
    ``layer 0 residual-stream SAE (hook_resid_post)``; ``short``: without the parenthesis."""
    hook = site.rsplit(".", 1)[-1]
    if short:
        return f"layer {layer} {'residual-stream SAE' if 'resid' in hook else 'SAE'}" if kind == "sae" \
            else f"layer {layer} MLP transcoder"
    if kind == "sae":
        return f"layer {layer} residual-stream SAE ({hook})" if "resid" in hook else f"layer {layer} SAE ({hook})"
    return f"layer {layer} MLP transcoder (reads {hook}, predicts hook_mlp_out)"


def _site_titles(t: pd.DataFrame) -> dict[str, str]:
    first = t.drop_duplicates("site")
    return {r.site: site_words(r.site, r.kind, int(r.layer)) for r in first.itertuples()}


def _wrap(text: str, width: int = 34) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


#: The families' names on the figure's axis (`labels.FAMILIES`).
FAMILY_TICKS = {"position": "position", "duplicate": "duplicate", "syntax": "syntax",
                "special": "[CLS]/[SEP]\n& punct."}


def _families(s: pd.DataFrame, out_dir: Path, formats: Sequence[str] = FIGURE_FORMATS) -> list[Path]:
    """Labelled units per family and site: trained latents, neurons, PCA, re-initialised latents, shuffled. Each
    panel has its own count axis (the counts differ by orders of magnitude between dictionaries) and every bar
    carries its count, zeros included."""
    import matplotlib.pyplot as plt
    from bertscope.experiments.io import save_figure

    fams = ["position", "duplicate", "syntax", "special"]
    sites = list(dict.fromkeys(s["site"]))
    groups = [("trained", "latent"), ("trained", "neuron"), ("trained", "pca"), ("reinit", "latent"),
              ("trained", "latent_shuffled_labels")]
    titles = _site_titles(s)
    fig, axes = plt.subplots(1, len(sites), figsize=(3.6 * len(sites), 3.9), squeeze=False)
    handles, names = [], []
    for ax, site in zip(axes[0], sites, strict=True):
        g = s[s["site"] == site]
        width = 0.8 / len(groups)
        top = 0
        for j, (enc, basis) in enumerate(groups):
            row = g[(g["encoder"] == enc) & (g["basis"] == basis)]
            if row.empty:
                continue
            vals = [int(row[f"n_{f}"].iloc[0]) for f in fams]
            xs = [i + j * width for i in range(len(fams))]
            label = GROUP_NAMES[(enc, basis)]
            if "d_sae" in row and basis == "latent":
                label += f" ({int(row['d_sae'].iloc[0])} latents)" if enc == "reinit" else ""
            bars = ax.bar(xs, vals, width, label=label, color=f"C{j}")
            for x, v in zip(xs, vals, strict=True):
                ax.text(x, v, str(v), ha="center", va="bottom", fontsize=5.5, rotation=90 if v >= 1000 else 0)
            top = max(top, *vals)
            if label not in names:
                handles.append(bars)
                names.append(label)
        ax.set_ylim(0, max(1, top) * 1.25)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(fams))], [FAMILY_TICKS[f] for f in fams], fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        title = titles[site]
        lat = g[(g["encoder"] == "trained") & (g["basis"] == "latent")]
        if len(lat) and "d_sae" in lat:
            title += f", {int(lat['d_sae'].iloc[0])} latents"
        ax.set_title(_wrap(title), fontsize=8)
    threshold = float(s["threshold"].iloc[0]) if "threshold" in s and len(s) else float("nan")
    axes[0][0].set_ylabel(f"units labelled (test MCC \u2265 {threshold:g})\n(own scale per panel)", fontsize=8)
    fig.legend(handles, names, loc="lower center", ncol=3, fontsize=7, frameon=False)
    fig.suptitle("Units whose best label (chosen on dev) holds on test, per family and dictionary", fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    out = save_figure(fig, out_dir / "fig_labelled_units", formats=formats)
    plt.close(fig)
    return out


def _sparse(p: pd.DataFrame, out_dir: Path, formats: Sequence[str] = FIGURE_FORMATS) -> list[Path]:
    """k-sparse probing accuracy against k per variable, one line per source."""
    import matplotlib.pyplot as plt
    from bertscope.experiments.io import save_figure

    if p.empty:
        return []
    variables = list(dict.fromkeys(p["variable"]))
    sites = list(dict.fromkeys(p["site"]))
    titles = _site_titles(p)
    fig, axes = plt.subplots(len(variables), len(sites), figsize=(3.2 * len(sites), 2.8 * len(variables) + 0.5),
                             sharey=True, squeeze=False)
    colours = {source: f"C{j}" for j, source in enumerate(SOURCE_NAMES)}
    for r, var in enumerate(variables):
        for c, site in enumerate(sites):
            ax = axes[r][c]
            g = p[(p["variable"] == var) & (p["site"] == site)]
            for source, h in g.groupby("source", sort=False):
                h = h.sort_values("k")
                ax.errorbar(h["k"], h["accuracy"], yerr=[h["accuracy"] - h["ci_low"], h["ci_high"] - h["accuracy"]],
                            marker="o", ms=3, label=SOURCE_NAMES.get(source, source),
                            color=colours.get(source, "C7"), capsize=2)
            ax.set_xticks(sorted(set(p["k"])))
            ax.set_title(_wrap(f"{VARIABLE_NAMES.get(var, var)}: {titles[site]}", 40), fontsize=7)
            if r == len(variables) - 1:
                ax.set_xlabel("k (units in the probe)", fontsize=8)
        axes[r][0].set_ylabel("balanced test accuracy", fontsize=8)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(names), fontsize=7, frameon=False)
    fig.suptitle("k-sparse probing (SAEBench): the best k units of each kind predicting each variable")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    out = save_figure(fig, out_dir / "fig_sparse_probing", formats=formats)
    plt.close(fig)
    return out
