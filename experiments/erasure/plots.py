"""Figures of the erasure experiment, drawn from the saved tables only (``results``, ``probing``). The tables'
``layer`` and ``erase_layer`` count the embeddings as 0; the axes say it the convention's way
(`experiments.naming.residual_tick`: "emb", then the block the residual stream leaves)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from bertscope.experiments.io import FIGURE_FORMATS
from bertscope.experiments.naming import residual_name, residual_tick

#: One colour per method in every figure (the equal-rank random subspace: the method's colour, dashed).
METHOD_COLOURS = {"leace": "C0", "inlp": "C1", "mean": "C2"}
METHOD_NAMES = {"leace": "LEACE", "inlp": "INLP", "mean": "mean projection"}
LAYER_AXIS = "residual stream after layer (emb = embeddings)"


def plot(out_dir: Path, formats: Sequence[str] | None = None) -> list[Path]:
    """Every figure of the experiment from the tables in ``out_dir``; returns the written files (figures as
    ``formats``, png and pdf by default)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    formats = tuple(formats or FIGURE_FORMATS)
    path = Path(out_dir) / "results.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; run `bertscope run erasure` first")
    results = pd.read_parquet(path)
    written = _uuas(results, Path(out_dir), formats) + _probes(results, Path(out_dir), formats)
    if (Path(out_dir) / "probing.parquet").is_file():
        written += _probing(pd.read_parquet(Path(out_dir) / "probing.parquet"), Path(out_dir), formats)
    return written


def _layer_axis(ax, layers, label: bool = True) -> None:
    ticks = sorted({int(k) for k in layers})
    ax.set_xticks(ticks, [residual_tick(k) for k in ticks])
    if label:
        ax.set_xlabel(LAYER_AXIS, fontsize=8)


def _rank_of(r: pd.DataFrame, concept: str, layer: int, method: str) -> int | None:
    g = r[(r["concept"] == concept) & (r["erase_layer"] == layer) & (r["method"] == method)]
    return int(g["rank"].iloc[0]) if len(g) else None


def _uuas(r: pd.DataFrame, out_dir: Path, formats: Sequence[str] = FIGURE_FORMATS) -> list[Path]:
    """UUAS (not its change: the bands are the erased values' intervals) per erased concept (rows) and erasure
    layer (columns): clean, each method, each method's equal-rank random subspace, trees reading no vectors."""
    import matplotlib.pyplot as plt
    from bertscope.experiments.io import save_figure

    u = r[r["measure"] == "uuas"]
    erased = u[u["method"] != "none"]
    if erased.empty:
        return []
    clean = u[u["method"] == "none"].sort_values("layer")
    concepts, layers = list(dict.fromkeys(erased["concept"])), sorted(set(erased["erase_layer"]))
    fig, axes = plt.subplots(len(concepts), len(layers), figsize=(3.3 * len(layers), 2.7 * len(concepts) + 0.9),
                             sharex=True, sharey=True, squeeze=False)
    last = int(r["layer"].max())
    base = {m: _one_value(r, f"uuas_{m}", last) for m in ("random_tree", "linear_chain")}
    for i, concept in enumerate(concepts):
        for j, layer in enumerate(layers):
            ax = axes[i][j]
            ax.plot(clean["layer"], clean["value"], color="k", marker="o", ms=2.5, lw=1.2, label="clean")
            ax.fill_between(clean["layer"], clean["ci_low"], clean["ci_high"], color="k", alpha=0.12, lw=0)
            g = erased[(erased["concept"] == concept) & (erased["erase_layer"] == layer)]
            for method, colour in METHOD_COLOURS.items():
                h = g[g["method"] == method].sort_values("layer")
                if h.empty:
                    continue
                rank = int(h["rank"].iloc[0])
                ctrl = g[(g["method"] == "random") & (g["rank"] == rank)].sort_values("layer")
                ax.plot(h["layer"], h["value"], color=colour, marker="o", ms=2.5, lw=1.2)
                ax.fill_between(h["layer"], h["ci_low"], h["ci_high"], color=colour, alpha=0.15, lw=0)
                if len(ctrl):
                    ax.plot(ctrl["layer"], ctrl["value"], color=colour, ls="--", lw=1.0)
            for m, ls in (("random_tree", ":"), ("linear_chain", "-.")):
                if base[m] is not None:
                    ax.axhline(base[m], color="grey", ls=ls, lw=0.9)
            ax.axvline(layer, color="grey", lw=0.6, alpha=0.6)
            ax.set_title(_panel_title(r, concept, layer), fontsize=8)
            ax.tick_params(labelsize=7)
            if i == len(concepts) - 1:
                _layer_axis(ax, clean["layer"])
        axes[i][0].set_ylabel("UUAS (distance probe)", fontsize=8)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color="k", marker="o", ms=3, label="clean run")]
    handles += [Line2D([], [], color=c, marker="o", ms=3, label=METHOD_NAMES[m]) for m, c in METHOD_COLOURS.items()
                if m in set(erased["method"])]
    handles += [Line2D([], [], color="grey", ls="--", label="random subspace of the same rank (method's colour)")]
    handles += [Line2D([], [], color="grey", ls=ls, label=f"{name} (reads no vectors)")
                for m, ls, name in (("random_tree", ":", "random tree"), ("linear_chain", "-.", "linear chain"))
                if base[m] is not None]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=7, frameon=False)
    fig.suptitle("Erasing a concept at one layer: the distance probe's parse trees downstream", fontsize=10)
    fig.tight_layout(rect=(0, 0.1 if len(concepts) == 1 else 0.06, 1, 1))
    out = save_figure(fig, out_dir / "erasure_uuas", formats=formats)
    plt.close(fig)
    return out


def _panel_title(r: pd.DataFrame, concept: str, layer: int) -> str:
    """``"upos erased after layer 2"`` and, below, each method's rank there (ranks differ by panel)."""
    where = "at the embeddings" if layer == 0 else residual_name(layer)
    ranks = [f"{METHOD_NAMES[m]} {rank}" for m in METHOD_COLOURS
             if (rank := _rank_of(r, concept, layer, m)) is not None]
    return f"{concept} erased {where}" + (f"\nrank: {', '.join(ranks)}" if ranks else "")


def _one_value(r: pd.DataFrame, measure: str, layer: int) -> float | None:
    m = r[(r["measure"] == measure) & (r["layer"] == layer)]
    return float(m["value"].iloc[0]) if len(m) else None


def _probes(r: pd.DataFrame, out_dir: Path, formats: Sequence[str] = FIGURE_FORMATS) -> list[Path]:
    """Per erasure (panel: concept and layer) the change of every clean probe at the last layer, one bar per
    method, with the equal-rank random subspace of each method as a black tick."""
    import matplotlib.pyplot as plt
    from bertscope.experiments.io import save_figure

    last = int(r["layer"].max())
    p = r[(r["measure"] == "probe_accuracy") & (r["method"] != "none") & (r["layer"] == last)]
    if p.empty:
        return []
    concepts, layers = list(dict.fromkeys(p["concept"])), sorted(set(p["erase_layer"]))
    targets = list(dict.fromkeys(p["target"]))
    methods = [m for m in METHOD_COLOURS if m in set(p["method"])]
    fig, axes = plt.subplots(len(concepts), len(layers), figsize=(max(3.6, 0.75 * len(targets)) * len(layers),
                                                                  2.7 * len(concepts) + 0.6),
                             sharey=True, squeeze=False)
    width = 0.8 / max(1, len(methods))
    for i, concept in enumerate(concepts):
        for j, layer in enumerate(layers):
            ax = axes[i][j]
            g = p[(p["concept"] == concept) & (p["erase_layer"] == layer)]
            for mi, method in enumerate(methods):
                h = g[g["method"] == method].set_index("target").reindex(targets)
                if h["delta"].isna().all():
                    continue
                rank = int(h["rank"].dropna().iloc[0])
                x = np.arange(len(targets)) + (mi - (len(methods) - 1) / 2) * width
                err = np.array([h["delta"] - h["delta_ci_low"], h["delta_ci_high"] - h["delta"]])
                ax.bar(x, h["delta"], width, yerr=np.nan_to_num(err), color=METHOD_COLOURS[method],
                       error_kw={"lw": 0.6})
                c = g[(g["method"] == "random") & (g["rank"] == rank)].set_index("target").reindex(targets)
                ax.plot(x, c["delta"], ls="none", marker="_", ms=9, mew=1.6, color="k")
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_xticks(np.arange(len(targets)), targets, fontsize=8)
            ax.set_title(_panel_title(r, concept, layer), fontsize=8)
            ax.tick_params(axis="y", labelsize=8)
            if i == len(concepts) - 1:
                ax.set_xlabel("probed concept", fontsize=8)
        axes[i][0].set_ylabel(f"probe accuracy change\n{residual_name(last)}", fontsize=8)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(color=METHOD_COLOURS[m], label=METHOD_NAMES[m]) for m in methods]
    handles.append(Line2D([], [], ls="none", marker="_", ms=9, mew=1.6, color="k",
                          label="random subspace of the same rank"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7, frameon=False)
    fig.suptitle("Clean-trained probes read the erased run (last layer)", fontsize=10)
    fig.tight_layout(rect=(0, 0.08 if len(concepts) == 1 else 0.05, 1, 1))
    out = save_figure(fig, out_dir / "erasure_probes", formats=formats)
    plt.close(fig)
    return out


def _probing(p: pd.DataFrame, out_dir: Path, formats: Sequence[str] = FIGURE_FORMATS) -> list[Path]:
    """Per probed concept: accuracy (task, control task, majority) on top, selectivity on its own axis below."""
    import matplotlib.pyplot as plt
    from bertscope.experiments.io import save_figure

    if "component" in p:  # the residual stream per layer (sublayer outputs are in the table, not drawn)
        p = p[p["component"].isin(["embed", "resid_post"])]
    if p.empty:
        return []
    targets = list(dict.fromkeys(p["target"]))
    fig, axes = plt.subplots(2, len(targets), figsize=(2.9 * len(targets), 4.6), sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": [3, 2]})
    for j, t in enumerate(targets):
        g = p[p["target"] == t]
        top, bottom = axes[0][j], axes[1][j]
        for label, color, ax in (("task", "C0", top), ("control", "C1", top), ("selectivity", "C2", bottom)):
            h = g[g["label"] == label].sort_values("layer")
            name = {"task": "task accuracy", "control": "control task (word type)",
                    "selectivity": "selectivity"}[label]
            ax.plot(h["layer"], h["value"], marker="o", ms=3, color=color, label=name)
            ax.fill_between(h["layer"], h["ci_low"], h["ci_high"], color=color, alpha=0.2, lw=0)
        top.axhline(float(g["majority"].iloc[0]), color="grey", ls=":", lw=0.9, label="majority class")
        bottom.axhline(0, color="grey", lw=0.6)
        top.set_ylim(0, 1)
        top.set_title(t, fontsize=9)
        _layer_axis(bottom, g["layer"], label=False)
        for ax in (top, bottom):
            ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("accuracy (evaluation words)", fontsize=8)
    axes[1][0].set_ylabel("selectivity\n(task \u2212 control)", fontsize=8)
    handles, names = [], []
    for ax in (axes[0][0], axes[1][0]):
        h, n = ax.get_legend_handles_labels()
        handles, names = handles + h, names + n
    fig.legend(handles, names, loc="lower center", ncol=len(names), fontsize=7, frameon=False)
    fig.supxlabel(LAYER_AXIS, fontsize=8, y=0.07)
    fig.suptitle("Word-level probes with control tasks, per layer (clean run)", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    out = save_figure(fig, out_dir / "erasure_probing", formats=formats)
    plt.close(fig)
    return out
