"""Figures of the `mixing` experiment, drawn from the saved tables only (no model).

Reads ``results.parquet`` (or ``.csv``) and ``example_maps.parquet`` from the experiment folder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from bertscope.experiments import io
from bertscope.experiments.mixing.findings import (
    CAPTIONS,
    GROUP_TITLES,
    LABELS,
    _short,
    per_layer_methods,
    read_results,
)

__all__ = ["CAPTIONS", "FORMATS", "GROUP_TITLES", "LABELS", "plot", "per_layer_methods", "read_results"]

FORMATS = tuple(io.FIGURE_FORMATS)
Formats = tuple[str, ...]




def plot(out_dir: Path, formats: Formats | None = None) -> list[Path]:
    """Every figure the saved tables allow; returns the written paths (``formats``: ``FORMATS`` by default)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    formats = tuple(formats or FORMATS)
    out_dir = Path(out_dir)
    results = read_results(out_dir)
    paths: list[Path] = []
    for fn in (plot_mixing_ratio, plot_special_tokens, plot_faithfulness):
        paths += fn(results, out_dir, formats)
    maps = out_dir / "example_maps.parquet"
    if maps.is_file():
        paths += plot_example_maps(pd.read_parquet(maps), out_dir, formats)
    return paths


def plot_mixing_ratio(results: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS) -> list[Path]:
    """Mixing ratio vs layer, per method (left) and rolled out (right), with bootstrap bands."""
    import matplotlib.pyplot as plt

    ratio = results[results.metric == "mixing_ratio"]
    methods = per_layer_methods(ratio)
    if not methods:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    panels = ((axes[0], "", "each layer on its own"), (axes[1], "rollout:", "rolled out from the input"))
    for ax, prefix, title in panels:
        for i, m in enumerate(methods):
            part = ratio[ratio.method == prefix + m].sort_values("layer")
            if part.empty:
                continue
            color = _color(i, m)
            ax.plot(part.layer, part.value, marker="o", color=color, label=LABELS.get(m, m))
            ax.fill_between(part.layer, part.ci_low, part.ci_high, color=color, alpha=0.2)
        ax.set_title(f"Mixing ratio, {title}")
        ax.set_xlabel("layer")
        ax.set_xticks(sorted(ratio.layer.unique()))
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share from other tokens")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.suptitle("How much of each token comes from its context", y=1.02)
    return io.save_figure(fig, out_dir / "fig_mixing_ratio", formats)


def plot_special_tokens(results: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS) -> list[Path]:
    """Share of contributions from [CLS], [SEP] and punctuation vs layer, per per-layer method."""
    import matplotlib.pyplot as plt

    methods = per_layer_methods(results)
    metrics = [m for m in GROUP_TITLES if m in set(results.metric)]
    if not methods or not metrics:
        return []
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.8), sharey=True, squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        for i, m in enumerate(methods):
            part = results[(results.method == m) & (results.metric == metric)].sort_values("layer")
            color = _color(i, m)
            ax.plot(part.layer, part.value, marker="o", color=color, label=LABELS.get(m, m),
                    linewidth=2.5 if m == "attention" else 1.5)  # fmt: skip
            ax.fill_between(part.layer, part.ci_low, part.ci_high, color=color, alpha=0.2)
        ax.set_title(f"from {GROUP_TITLES[metric]}")
        ax.set_xlabel("layer")
        ax.set_xticks(sorted(results.layer.unique()))
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("share of contributions")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=3, bbox_to_anchor=(0.5, -0.2))
    fig.suptitle("Do [CLS], [SEP] and punctuation keep their attention mass under other methods?", y=1.03)
    return io.save_figure(fig, out_dir / "fig_special_tokens", formats)


def plot_faithfulness(results: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS) -> list[Path]:
    """Horizontal bars of ``spearman_vs_loo`` per method with bootstrap intervals, best first."""
    import matplotlib.pyplot as plt

    faith = results[results.metric == "spearman_vs_loo"].sort_values("value")
    if faith.empty:
        return []
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(faith) + 1.5))
    y = np.arange(len(faith))
    colors = ["0.6" if m == "loo" else ("tab:blue" if m.startswith("rollout:") else "tab:orange")
              for m in faith.method]  # fmt: skip
    err = np.vstack([faith.value - faith.ci_low, faith.ci_high - faith.value]).clip(min=0)
    ax.barh(y, faith.value, xerr=err, color=colors, capsize=3)
    ax.set_yticks(y, [_short(m) for m in faith.method], fontsize=8)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("Spearman correlation with leave-one-out (mean over sentences)")
    n = int(faith.n.max())
    ax.set_title(f"Faithfulness of each method's input attribution ({n} sentences)")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color="tab:blue", label="rolled out over layers"),
                       Patch(color="tab:orange", label="last layer alone / input gradients"),
                       Patch(color="0.6", label="reference")], fontsize=8, loc="lower right")  # fmt: skip
    ax.grid(axis="x", alpha=0.3)
    return io.save_figure(fig, out_dir / "fig_faithfulness", formats)


def plot_example_maps(maps: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS) -> list[Path]:
    """Rows: example sentences; columns: methods; each panel the last layer's ``[query, key]`` shares."""
    import matplotlib.pyplot as plt

    if maps.empty:
        return []
    sentences = list(dict.fromkeys(maps.sentence))
    methods = list(dict.fromkeys(maps.method))
    # square panels: the figure's aspect follows the grid, so rows do not float apart
    fig, axes = plt.subplots(len(sentences), len(methods), figsize=(2.4 * len(methods), 2.1 * len(sentences) + 0.6),
                             squeeze=False)  # fmt: skip
    fig.subplots_adjust(wspace=0.45, hspace=0.6, top=0.86)
    image = None
    for r, sid in enumerate(sentences):
        for c, m in enumerate(methods):
            part = maps[(maps.sentence == sid) & (maps.method == m)]
            n = int(part["query"].max()) + 1
            grid = np.zeros((n, n))
            grid[part["query"], part["key"]] = part["value"]
            tokens = part.drop_duplicates("key").sort_values("key")["key_token"].tolist()
            ax = axes[r, c]
            image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=1)
            ax.set_xticks(range(n), tokens, rotation=90, fontsize=6)
            ax.set_yticks(range(n), tokens, fontsize=6)
            if r == 0:
                ax.set_title(_short(m), fontsize=8)
            if c == 0:
                ax.set_ylabel("receiving token", fontsize=7)
            if r == len(sentences) - 1:
                ax.set_xlabel("contributing token", fontsize=7)
    layer = int(maps.layer.max())
    fig.suptitle(f"Where each token's layer-{layer} representation comes from, by method")
    fig.colorbar(image, ax=axes, fraction=0.012, pad=0.015, label="share of the row")
    return io.save_figure(fig, out_dir / "fig_example_maps", formats)


def _color(i: int, method: str) -> str:
    return "black" if method == "attention" else f"C{i}"
