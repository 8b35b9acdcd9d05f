"""Figures of the `similarity` experiment, drawn from the saved tables only (no model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from bertscope.experiments import io
from bertscope.experiments.io import read_table

FORMATS = tuple(io.FIGURE_FORMATS)
Formats = tuple[str, ...]
POOLING_STYLE = {"mean": ("#1f77b4", "o"), "cls": ("#d62728", "s"), "max": ("#2ca02c", "^")}


def plot(out_dir: Path, formats: Formats | None = None) -> list[Path]:
    """Every figure the saved tables allow; returns the written paths."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    formats = tuple(formats or FORMATS)
    out_dir = Path(out_dir)
    paths: list[Path] = []
    matrices = read_table(out_dir, "matrices")
    if matrices is not None and len(matrices):
        paths += plot_token_heatmaps(matrices, out_dir, formats)
    benchmark = read_table(out_dir, "benchmark")
    if benchmark is not None and len(benchmark):
        paths += plot_layers(benchmark, out_dir, formats)
    heads = read_table(out_dir, "heads")
    if heads is not None and (heads.kind == "head").any():
        paths += plot_head_shares(heads, out_dir, formats)
    faith = read_table(out_dir, "faithfulness")
    if faith is not None and len(faith):
        paths += plot_faithfulness(faith, out_dir, formats)
    return paths


def example_pairs(matrices: pd.DataFrame, method: str, n: int = 3) -> list[int]:
    """Up to ``n`` attributed pairs for the heatmaps: the highest, a middle and the lowest model score."""
    scores = matrices[matrices.method == method].drop_duplicates("pair").sort_values("score", ascending=False)
    pids = scores.pair.tolist()
    if len(pids) <= n:
        return pids
    picks = [pids[round(i * (len(pids) - 1) / (n - 1))] for i in range(n)] if n > 1 else pids[:1]
    return list(dict.fromkeys(picks))


def plot_token_heatmaps(matrices: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS,
                        method: str | None = None) -> list[Path]:
    """Token x token attribution of a few pairs (one panel each) by ``method`` (default: the first in the
    table, integrated Jacobians in the default run)."""
    import matplotlib.pyplot as plt

    method = method or str(matrices.method.iloc[0])
    pids = example_pairs(matrices, method)
    sub = matrices[matrices.method == method]
    grids = []
    for pid in pids:
        g = sub[sub.pair == pid]
        grid = g.pivot(index="i", columns="j", values="value").sort_index().sort_index(axis=1).to_numpy()
        ta = g.drop_duplicates("i").sort_values("i").token_a.tolist()
        tb = g.drop_duplicates("j").sort_values("j").token_b.tolist()
        grids.append((pid, grid, ta, tb, float(g.score.iloc[0])))
    widths = [max(len(t[3]), 4) for t in grids]
    height = max(len(t[2]) for t in grids)
    fig, axes = plt.subplots(1, len(grids), figsize=(min(0.42 * sum(widths) + 2.2 * len(grids), 22),
                                                     0.36 * height + 2.6),
                             gridspec_kw={"width_ratios": widths}, squeeze=False, layout="constrained")
    for ax, (pid, grid, ta, tb, score) in zip(axes[0], grids, strict=True):
        vmax = float(np.abs(grid).max()) or 1.0
        im = ax.imshow(grid, cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="equal")
        ax.set_xticks(range(len(tb)), tb, rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(len(ta)), ta, fontsize=8)
        ax.set_xlabel("text b (word pieces)", fontsize=8)
        ax.set_ylabel("text a (word pieces)", fontsize=8)
        ax.set_title(f"pair {pid}: cosine {score:.2f}", fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.7, label="attribution")
    fig.suptitle(f"Which token pairs make the texts similar ({method})", fontsize=10)
    return io.save_figure(fig, out_dir / "fig_token_heatmaps", formats)


def plot_layers(benchmark: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS) -> list[Path]:
    """Spearman with gold per layer and pooling on the report split, with intervals; the model's own embedding
    and the chosen site and pooling marked."""
    import matplotlib.pyplot as plt

    rep = benchmark[benchmark.split == "report"]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), layout="constrained")
    for pooling, g in rep.groupby("pooling", sort=False):
        g = g.sort_values("layer")
        color, marker = POOLING_STYLE.get(str(pooling), ("#555555", "d"))
        ax.plot(g.layer, g.spearman, marker=marker, color=color, label=f"{pooling} pooling")
        ax.fill_between(g.layer, g.spearman_low, g.spearman_high, color=color, alpha=0.15, linewidth=0)
    own = rep[rep.own]
    if len(own):
        ax.scatter(own.layer, own.spearman, s=160, facecolors="none", edgecolors="black", linewidths=1.5,
                   label="the model's own embedding", zorder=3)
    chosen = rep[rep.chosen]
    if len(chosen):
        ax.scatter(chosen.layer, chosen.spearman, marker="*", s=150, color="black",
                   label="chosen on the select split", zorder=4)
    ax.set_xlabel("layer (output of block)")
    ax.set_ylabel("Spearman with gold (report split)")
    ax.set_xticks(sorted(rep.layer.unique()))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(f"Which layer serves similarity best ({int(rep.n_pairs.iloc[0])} held-out pairs)", fontsize=10)
    return io.save_figure(fig, out_dir / "fig_spearman_layers", formats)


def plot_head_shares(heads: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS) -> list[Path]:
    """Layer x head maps: each head's mean share of the cosine, and the Spearman change when it is
    mean-ablated."""
    import matplotlib.pyplot as plt

    h = heads[heads.kind == "head"]
    n_layers, n_heads = int(h.layer.max()) + 1, int(h["head"].max()) + 1
    fig, axes = plt.subplots(1, 2, figsize=(max(7.0, 0.5 * n_heads * 2 + 2.5), 0.45 * n_layers + 2.2),
                             layout="constrained")
    panels = (("share", "share of the cosine (mean over pairs)"),
              ("spearman_change", "Spearman change when mean-ablated"))
    for ax, (col, label) in zip(axes, panels, strict=True):
        grid = h.pivot_table(index="layer", columns="head", values=col).reindex(
            index=range(n_layers), columns=range(n_heads)).to_numpy()
        vmax = float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 1.0
        im = ax.imshow(grid, cmap="RdBu_r", vmin=-(vmax or 1.0), vmax=vmax or 1.0, aspect="auto")
        ax.set_xticks(range(n_heads))
        ax.set_yticks(range(n_layers))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(label, fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle("What each attention head contributes to the similarity", fontsize=10)
    return io.save_figure(fig, out_dir / "fig_head_shares", formats)


def plot_faithfulness(faith: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS) -> list[Path]:
    """Mean similarity drop against k for each method, the random baseline dashed; one panel per removal mode
    (columns) and sides (rows: one text at a time, both texts)."""
    import matplotlib.pyplot as plt

    faith = faith if "sides" in faith else faith.assign(sides="both")
    modes = list(dict.fromkeys(faith.removal)) if "removal" in faith else [None]
    sides = list(dict.fromkeys(faith.sides))
    fig, axes = plt.subplots(len(sides), len(modes), figsize=(6.0 * len(modes), 4.2 * len(sides)), squeeze=False,
                             sharey="row", layout="constrained")
    colors = plt.get_cmap("tab10")
    ks = sorted(faith.k.unique())
    for row, side in enumerate(sides):
        for ax, mode in zip(axes[row], modes, strict=True):
            sub = faith[faith.sides == side]
            sub = sub if mode is None else sub[sub.removal == mode]
            for n, (method, g) in enumerate(sub.groupby("method", sort=False)):
                g = g.sort_values("k")
                style = {"color": "black", "linestyle": "--"} if method == "random" else {"color": colors(n % 10)}
                ax.errorbar(g.k, g["drop"], yerr=[g["drop"] - g.drop_low, g.drop_high - g["drop"]], marker="o",
                            capsize=3, label=str(method), **style)
            ax.axhline(0, color="grey", linewidth=0.8)
            ax.set_xscale("log")
            ax.set_xticks(ks, [str(k) for k in ks])
            ax.minorticks_off()
            ax.set_xlabel("token pairs removed (top k by the method)")
            how = {"reference": "tokens replaced by the padding token", "delete": "tokens deleted"}.get(str(mode), "")
            where = {"one": "from one text at a time (mean of a's and b's)", "both": "from both texts at once"}
            ax.set_title(f"{how}, {where.get(str(side), str(side))}", fontsize=9)
            ax.grid(alpha=0.3)
        axes[row][0].set_ylabel("mean drop of the cosine")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle(f"Faithfulness: removing each method's top token pairs ({int(faith.n_pairs.iloc[0])} pairs)",
                 fontsize=10)
    return io.save_figure(fig, out_dir / "fig_faithfulness", formats)
