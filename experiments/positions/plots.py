"""Figures of the positions experiment, drawn from the saved tables only (``results.parquet`` and the
side tables ``confusion``, ``position_table_pca``, ``position_table_cosine``).

x axes: ``word`` (token embedding only), ``emb`` (embedding output), then the output of each block, labelled
with the block's index from 0 (``naming``: "after layer L"; the tables' ``layer`` column counts the embedding
output as 0, so its k is labelled k - 1); sublayer sites sit half a step before their block's output.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from bertscope.experiments import io
from bertscope.experiments.naming import residual_tick
from bertscope.hooks.sites import parse_site

CONDITION_STYLE = {
    "none": dict(color="C0", label="task"),
    "control_task": dict(color="C3", ls="--", label="control task"),
    "shuffled": dict(color="C2", ls="-.", label="shuffled order"),
    "zeroed_positions": dict(color="C7", ls=":", label="position embeddings zeroed (null)"),
    "memorisation_ceiling": dict(color="C3", ls=":", marker="", label="control ceiling (memorised types)"),
    "permuted_positions": dict(color="C5", ls="--", label="positions permuted"),
}
COMPONENT_STYLE = {
    "attn_out": dict(color="C1", marker="^", label="attention output"),
    "resid_mid": dict(color="C4", marker="s", label="residual after attention"),
    "mlp_out": dict(color="C6", marker="v", label="MLP output"),
    "resid_post": dict(color="C0", marker="o", label="residual after the layer"),
}


def plot(out_dir: Path, formats: Sequence[str] | None = None) -> list[Path]:
    """Every figure of the experiment from the tables in ``out_dir``, as ``formats`` (``io.FIGURE_FORMATS`` by
    default); returns the written files."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    out_dir = Path(out_dir)  # a str works too
    formats = tuple(formats or io.FIGURE_FORMATS)
    results_path = out_dir / "results.parquet"
    if not results_path.is_file():
        raise FileNotFoundError(f"{results_path} is missing; run `bertscope run positions` first")
    every = pd.read_parquet(results_path)
    results = every[every["probe"] != "sweep"]  # the capacity sweep has its own figure
    # builders, not figures: one figure is alive at a time
    figures = {
        "fig_absolute_vs_layer": lambda: absolute_figure(results),
        "fig_selectivity_vs_layer": lambda: selectivity_figure(results),
        "fig_relative_vs_layer": lambda: relative_figure(results),
        "fig_probe_free_vs_layer": lambda: probe_free_figure(results),
        "fig_specials_vs_layer": lambda: specials_figure(results),
    }
    if (every["probe"] == "sweep").any():
        figures["fig_capacity_sweep"] = lambda: capacity_figure(every)
    if (results["probe"] == "mdl").any():
        figures["fig_mdl_vs_layer"] = lambda: mdl_figure(results)
    if (out_dir / "confusion.parquet").is_file():
        figures["fig_confusion"] = lambda: confusion_figure(pd.read_parquet(out_dir / "confusion.parquet"))
    if (out_dir / "position_table_pca.parquet").is_file():
        figures["fig_position_table"] = lambda: position_table_figure(
            pd.read_parquet(out_dir / "position_table_pca.parquet"),
            pd.read_parquet(out_dir / "position_table_cosine.parquet"),
        )
    paths: list[Path] = []
    for name, build in figures.items():
        paths += io.save_figure(build(), out_dir / name, formats=formats)
    return paths


def site_title(site: str) -> str:
    """A readable name of a site, blocks counted from 0 as in the hook names (``naming``):
    ``embed.hook_out`` -> "embedding output", ``blocks.3.hook_resid_post`` -> "after layer 3",
    ``embed.hook_word`` -> "word embedding"."""
    fixed = {"embed.hook_word": "word embedding", "embed.hook_out": "embedding output"}
    if site in fixed:
        return fixed[site]
    parsed = parse_site(site)
    if parsed.layer is not None and "." not in parsed.suffix:
        what = {"hook_resid_post": "after layer", "hook_attn_out": "attention output of layer",
                "hook_resid_mid": "residual after attention, layer", "hook_mlp_out": "MLP output of layer"}
        return f"{what.get(parsed.suffix, parsed.suffix)} {parsed.layer}"
    return site


def depth(layer: pd.Series, component: pd.Series) -> np.ndarray:
    """x coordinate of a site: word -1, emb 0, attn_out / resid_mid at layer - 0.5, others at layer."""
    x = layer.to_numpy(dtype=float).copy()
    comp = component.to_numpy()
    x[comp == "word"] = -1.0
    x[np.isin(comp, ["attn_out", "resid_mid"])] -= 0.5
    return x


# ------------------------------------------------------------------------------------------------- figures


def absolute_figure(results: pd.DataFrame):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    win = results[(results["data"] == "windows") & (results["token"] == "content")]
    _condition_panel(axes[0, 0], win, "abs_class", "accuracy", "Absolute position (windows): accuracy")
    _condition_panel(axes[0, 1], win, "abs_reg", "mae", "Absolute position (windows): ridge MAE (pieces)")
    _sublayer_panel(axes[1, 0], win, "abs_class", "accuracy")
    sent = results[(results["data"] == "sentences") & (results["token"] == "content")]
    _condition_panel(axes[1, 1], sent, "abs_class", "accuracy", "Absolute position (natural sentences): accuracy")
    fig.tight_layout()
    return fig


def selectivity_figure(results: pd.DataFrame):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    sel = results[(results["control"] == "selectivity") & (results["token"] == "content")
                  & results["component"].isin(["word", "embed", "resid_post"])]  # fmt: skip
    for ax, (target, metric) in zip(axes, (("abs_class", "accuracy"), ("abs_reg", "r2")), strict=True):
        for data, color in (("windows", "C0"), ("sentences", "C1")):
            rows = sel[(sel["data"] == data) & (sel["target"] == target) & (sel["metric"] == metric)]
            _line(ax, rows, color=color, label=data)
        ax.axhline(0, color="k", lw=0.8)
        what = "position class, accuracy" if target == "abs_class" else "position regression, R^2"
        ax.set_title(f"Selectivity = task - control task ({what})")
        _layer_axis(ax, sel)
        ax.set_ylabel(f"selectivity ({'accuracy' if metric == 'accuracy' else 'R^2'})")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def relative_figure(results: pd.DataFrame):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    pairs = results[(results["token"] == "pair") & (results["metric"] == "accuracy")]
    table = results[(results["data"] == "table") & (results["metric"] == "accuracy")]
    for row, target in enumerate(("order", "distance_bucket")):
        for col, features in enumerate(("concat", "diff")):
            ax = axes[row, col]
            rows = pairs[(pairs["target"] == target) & (pairs["features"] == features)]
            for control in ("none", "control_task", "shuffled", "zeroed_positions"):
                _line(ax, rows[rows["control"] == control], **CONDITION_STYLE[control])
            t = table[(table["target"] == target) & (table["features"] == features)]
            if len(t):
                ax.axhline(t["value"].iloc[0], color="C8", lw=1.5, label="position table (W&C)")
            _baselines(ax, rows[rows["control"] == "none"])
            what = "j before i" if target == "order" else "|i-j| bucket"
            ax.set_title(f"Relative position: {what}, {'[h_i; h_j]' if features == 'concat' else 'h_i - h_j'}")
            _layer_axis(ax, rows)
            ax.set_ylabel("accuracy")
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def probe_free_figure(results: pd.DataFrame):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    free = results[(results["probe"] == "none") & results["component"].isin(["word", "embed", "resid_post"])]
    for ax, metric, title in ((axes[0], "variance_share", "Variance explained by position"),
                              (axes[1], "cka_position_embedding", "Linear CKA with position embeddings")):  # fmt: skip
        rows = free[free["metric"] == metric]
        for control in ("none", "shuffled", "zeroed_positions", "permuted_positions"):
            _line(ax, rows[rows["control"] == control], **CONDITION_STYLE[control])
        ax.set_title(title)
        ax.set_ylabel("share of variance" if metric == "variance_share" else "linear CKA")
        _layer_axis(ax, rows)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def specials_figure(results: pd.DataFrame):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    sp = results[results["token"].isin(["cls", "sep"]) & (results["metric"] == "r2")]
    for ax, target, title in ((axes[0], "sep_position", "[SEP]: its own position (sentences)"),
                              (axes[1], "cls_length", "[CLS]: sentence length (sentences)")):  # fmt: skip
        rows = sp[sp["target"] == target]
        for control in ("none", "shuffled"):
            _line(ax, rows[rows["control"] == control], **CONDITION_STYLE[control])
        ax.axhline(0, color="k", lw=0.8)
        ax.set_title(title)
        ax.set_ylabel("ridge R^2")
        _layer_axis(ax, rows)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def mdl_figure(results: pd.DataFrame):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    rows = results[(results["probe"] == "mdl") & (results["metric"] == "compression")]
    for control in ("none", "control_task"):
        _line(ax, rows[rows["control"] == control], **CONDITION_STYLE[control])
    ax.axhline(1, color="k", lw=0.8, ls=":")
    ax.set_title("MDL: compression of absolute position (windows)")
    ax.set_ylabel("uniform / online codelength")
    _layer_axis(ax, rows)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def capacity_figure(results: pd.DataFrame):
    """Hewitt & Liang's capacity sweep: task accuracy, control accuracy and selectivity against the L2
    strength per site, the memorisation ceiling, and the operating point chosen on the tuning windows."""
    import matplotlib.pyplot as plt

    sweep = results[(results["probe"] == "sweep") & (results["metric"] == "accuracy")]
    ceiling = results[results["control"] == "memorisation_ceiling"]["value"]
    sites = list(dict.fromkeys(sweep["site"]))
    fig, axes = plt.subplots(1, len(sites), figsize=(5.2 * len(sites), 4.2), squeeze=False, sharey=True)
    for ax, site in zip(axes[0], sites, strict=True):
        rows = sweep[sweep["site"] == site]
        for control, style in (("none", dict(color="C0", label="task accuracy")),
                               ("control_task", dict(color="C3", ls="--", label="control accuracy")),
                               ("selectivity", dict(color="C2", label="selectivity"))):  # fmt: skip
            r = rows[rows["control"] == control].sort_values("alpha")
            a = r["alpha"].to_numpy(float)
            ax.plot(a, r["value"], marker="o", ms=3.5, **style)
            ax.fill_between(a, r["ci_low"], r["ci_high"], color=style["color"], alpha=0.18, lw=0)
        chosen = rows[rows["chosen"] == "tuning_selectivity"]
        if len(chosen):
            ax.axvline(float(chosen["alpha"].iloc[0]), color="k", lw=0.9, ls="--",
                       label="chosen on tuning windows (best selectivity)")  # fmt: skip
        if len(ceiling):
            ax.axhline(float(ceiling.iloc[0]), color="C3", lw=0.9, ls=":", label="control ceiling (memorised types)")
        ax.set_xscale("log")
        ax.set_xlabel("L2 strength alpha (mean loss; larger = less capacity)")
        ax.set_ylabel("accuracy / selectivity")
        ax.set_title(f"Capacity sweep: {site_title(site)}")
        ax.axhline(0.0, color="0.5", lw=0.6)
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.13, 1, 1))  # the legend sits below the panels, never over a curve
    return fig


def confusion_figure(confusion: pd.DataFrame):
    import matplotlib.pyplot as plt

    sites = list(dict.fromkeys(confusion["site"]))
    fig, axes = plt.subplots(1, len(sites), figsize=(4.4 * len(sites), 4.2), squeeze=False)
    for ax, site in zip(axes[0], sites, strict=True):
        rows = confusion[confusion["site"] == site]
        n = int(max(rows["true"].max(), rows["pred"].max())) + 1
        m = np.zeros((n, n))
        np.add.at(m, (rows["true"].to_numpy(int), rows["pred"].to_numpy(int)), rows["count"].to_numpy(float))
        m = m / np.maximum(m.sum(1, keepdims=True), 1)
        im = ax.imshow(m, origin="lower", cmap="viridis", vmin=0, vmax=1)
        ax.set_title(site_title(site), fontsize=10)
        ax.set_xlabel("predicted position")
        ax.set_ylabel("true position")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="share of true position")
    return fig


def position_table_figure(pca: pd.DataFrame, cosine: pd.DataFrame):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for comp, rows in pca.groupby("component"):
        ev = rows["explained_variance"].iloc[0]
        axes[0].plot(rows["position"], rows["score"], lw=1, label=f"PC{comp} ({100 * ev:.1f}%)")
    axes[0].set_xlabel("position")
    axes[0].set_ylabel("component score")
    axes[0].set_title("PCA of the position-embedding table")
    axes[0].legend(fontsize=8)
    n = int(cosine["i"].max()) + 1
    m = np.zeros((n, n))
    m[cosine["i"].to_numpy(int), cosine["j"].to_numpy(int)] = cosine["cosine"].to_numpy(float)
    im = axes[1].imshow(m, origin="lower", cmap="RdBu_r", vmin=-1, vmax=1)
    axes[1].set_title("Cosine similarity between position embeddings")
    axes[1].set_xlabel("position j")
    axes[1].set_ylabel("position i")
    fig.colorbar(im, ax=axes[1], shrink=0.85)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------------- helpers


def _condition_panel(ax, rows: pd.DataFrame, target: str, metric: str, title: str) -> None:
    full = rows
    rows = rows[(rows["target"] == target) & (rows["metric"] == metric)
                & rows["component"].isin(["word", "embed", "resid_post"])]  # fmt: skip
    for control in ("none", "control_task", "shuffled", "zeroed_positions"):
        _line(ax, rows[rows["control"] == control], **CONDITION_STYLE[control])
    if metric == "accuracy":
        _line(ax, full[(full["control"] == "memorisation_ceiling") & (full["target"] == target)
                       & full["component"].isin(["word", "embed", "resid_post"])],
              **CONDITION_STYLE["memorisation_ceiling"])  # fmt: skip
    _baselines(ax, rows[rows["control"] == "none"])
    ax.set_title(title)
    ax.set_ylabel(metric)
    _layer_axis(ax, rows)
    ax.legend(fontsize=7)


def _sublayer_panel(ax, rows: pd.DataFrame, target: str, metric: str) -> None:
    rows = rows[(rows["target"] == target) & (rows["metric"] == metric) & (rows["control"] == "none")]
    embed = rows[rows["component"] == "embed"]
    for comp, style in COMPONENT_STYLE.items():
        part = pd.concat([embed, rows[rows["component"] == comp]]) if comp == "resid_post" else rows[
            rows["component"] == comp]
        _line(ax, part, **style)
    _baselines(ax, rows)
    ax.set_title(f"Absolute position (windows) by sublayer: {metric}")
    ax.set_xlabel("after layer L (blocks from 0); a block's sublayers sit half a step before its output")
    ax.set_ylabel(metric)
    _layer_axis(ax, rows)
    ax.legend(fontsize=7)


def _line(ax, rows: pd.DataFrame, **style) -> None:
    if rows.empty:
        return
    x = depth(rows["layer"], rows["component"])
    order = np.argsort(x, kind="stable")
    x, y = x[order], rows["value"].to_numpy(float)[order]
    lo, hi = rows["ci_low"].to_numpy(float)[order], rows["ci_high"].to_numpy(float)[order]
    ax.plot(x, y, marker=style.pop("marker", "o"), ms=3.5, **style)
    if np.isfinite(lo).any():
        ax.fill_between(x, lo, hi, color=style.get("color"), alpha=0.18, lw=0)


def _baselines(ax, rows: pd.DataFrame) -> None:
    if rows.empty:
        return
    chance, majority = rows["baseline_chance"].median(), rows["baseline_majority"].median()
    if np.isfinite(chance):
        ax.axhline(chance, color="k", lw=0.9, ls=":", label=f"chance ({chance:.3g})")
    if np.isfinite(majority):
        ax.axhline(majority, color="0.45", lw=0.9, ls="--", label=f"majority ({majority:.3g})")


def _layer_axis(ax, rows: pd.DataFrame) -> None:
    n = int(rows["layer"].max()) if len(rows) else 0
    ax.set_xticks([-1, 0, *range(1, n + 1)])
    ax.set_xticklabels(["word", "emb", *(residual_tick(k) for k in range(1, n + 1))])
    ax.set_xlabel(ax.get_xlabel() or "after layer L (blocks from 0; emb = embedding output)")
    ax.grid(alpha=0.3)
