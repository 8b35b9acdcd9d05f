"""Figures of the features experiment and its feature browser, drawn from the saved tables only (``summary``,
``sparse_probing_summary``, ``browser_*``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def plot(out_dir: Path) -> list[Path]:
    """Every figure of the experiment and ``feature_browser.html`` from the tables in ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from bertscope.experiments.features.browser import write_browser

    out_dir = Path(out_dir)
    path = out_dir / "summary.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; run `bertscope run features` first")
    written = _families(pd.read_parquet(path), out_dir)
    if (out_dir / "sparse_probing_summary.parquet").is_file():
        written += _sparse(pd.read_parquet(out_dir / "sparse_probing_summary.parquet"), out_dir)
    return written + write_browser(out_dir)


def _families(s: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Labelled units per family and site: trained latents, neurons, PCA, re-initialised latents, shuffled."""
    import matplotlib.pyplot as plt
    from bertscope.experiments.io import save_figure

    fams = ["position", "duplicate", "syntax", "special"]
    sites = list(dict.fromkeys(s["site"]))
    groups = [("trained", "latent"), ("trained", "neuron"), ("trained", "pca"), ("reinit", "latent"),
              ("trained", "latent_shuffled_labels")]
    fig, axes = plt.subplots(1, len(sites), figsize=(3.4 * len(sites), 3.2), sharey=True, squeeze=False)
    for ax, site in zip(axes[0], sites, strict=True):
        g = s[s["site"] == site]
        width = 0.8 / len(groups)
        for j, (enc, basis) in enumerate(groups):
            row = g[(g["encoder"] == enc) & (g["basis"] == basis)]
            if row.empty:
                continue
            vals = [int(row[f"n_{f}"].iloc[0]) for f in fams]
            ax.bar([i + j * width for i in range(len(fams))], vals, width, label=f"{basis} ({enc})", color=f"C{j}")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(fams))], fams, fontsize=7)
        ax.set_title(site, fontsize=8)
    axes[0][0].set_ylabel("units labelled (test MCC >= threshold)")
    axes[0][-1].legend(fontsize=6)
    fig.suptitle("How many units carry each known variable, per site")
    fig.tight_layout()
    out = save_figure(fig, out_dir / "fig_labelled_units")
    plt.close(fig)
    return out


def _sparse(p: pd.DataFrame, out_dir: Path) -> list[Path]:
    """k-sparse probing accuracy against k per variable, one line per source."""
    import matplotlib.pyplot as plt
    from bertscope.experiments.io import save_figure

    if p.empty:
        return []
    variables = list(dict.fromkeys(p["variable"]))
    sites = list(dict.fromkeys(p["site"]))
    fig, axes = plt.subplots(len(variables), len(sites), figsize=(3.0 * len(sites), 2.6 * len(variables)),
                             sharey=True, squeeze=False)
    for r, var in enumerate(variables):
        for c, site in enumerate(sites):
            ax = axes[r][c]
            g = p[(p["variable"] == var) & (p["site"] == site)]
            for j, (source, h) in enumerate(g.groupby("source", sort=False)):
                h = h.sort_values("k")
                ax.errorbar(h["k"], h["accuracy"], yerr=[h["accuracy"] - h["ci_low"], h["ci_high"] - h["accuracy"]],
                            marker="o", ms=3, label=source, color=f"C{j}", capsize=2)
            ax.set_title(f"{var} @ {site}", fontsize=7)
            ax.set_xlabel("k")
    axes[0][0].set_ylabel("balanced test accuracy")
    axes[0][-1].legend(fontsize=6)
    fig.suptitle("k-sparse probing: latents vs neurons vs PCA vs re-initialised latents")
    fig.tight_layout()
    out = save_figure(fig, out_dir / "fig_sparse_probing")
    plt.close(fig)
    return out
