"""Figures of the positions experiment, drawn from the saved tables only (``results.parquet`` and the
side tables ``confusion``, ``position_table_pca``, ``position_table_cosine``).

x axes: ``word`` (token embedding only), ``emb`` (embedding output), then layer k = output of block k-1;
sublayer sites sit between layers (``attn_out`` and ``resid_mid`` at k - 0.5).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

CONDITION_STYLE = {
    "none": dict(color="C0", label="task"),
    "control_task": dict(color="C3", ls="--", label="control task"),
    "shuffled": dict(color="C2", ls="-.", label="shuffled order"),
    "random_weights": dict(color="C7", ls=":", label="random weights"),
    "permuted_positions": dict(color="C5", ls="--", label="positions permuted"),
}
COMPONENT_STYLE = {
    "attn_out": dict(color="C1", marker="^", label="attn_out"),
    "resid_mid": dict(color="C4", marker="s", label="resid_mid"),
    "mlp_out": dict(color="C6", marker="v", label="mlp_out"),
    "resid_post": dict(color="C0", marker="o", label="resid_post"),
}


def plot(out_dir: Path) -> list[Path]:
    """Every figure of the experiment from the tables in ``out_dir``; returns the written files."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from bertscope.experiments.io import save_figure

    results_path = out_dir / "results.parquet"
    if not results_path.is_file():
        raise FileNotFoundError(f"{results_path} is missing; run `bertscope run positions` first")
    results = pd.read_parquet(results_path)
    figures = {
        "fig_absolute_vs_layer": absolute_figure(results),
        "fig_selectivity_vs_layer": selectivity_figure(results),
        "fig_relative_vs_layer": relative_figure(results),
        "fig_probe_free_vs_layer": probe_free_figure(results),
        "fig_specials_vs_layer": specials_figure(results),
    }
    if (results["probe"] == "mdl").any():
        figures["fig_mdl_vs_layer"] = mdl_figure(results)
    if (out_dir / "confusion.parquet").is_file():
        figures["fig_confusion"] = confusion_figure(pd.read_parquet(out_dir / "confusion.parquet"))
    if (out_dir / "position_table_pca.parquet").is_file():
        figures["fig_position_table"] = position_table_figure(
            pd.read_parquet(out_dir / "position_table_pca.parquet"),
            pd.read_parquet(out_dir / "position_table_cosine.parquet"),
        )
    paths: list[Path] = []
    for name, fig in figures.items():
        paths += save_figure(fig, out_dir / name)
    return paths


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
        ax.set_title(f"Selectivity ({target} {metric}: task - control task)")
        _layer_axis(ax, sel)
        ax.set_ylabel(f"selectivity ({metric})")
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
            for control in ("none", "control_task", "shuffled", "random_weights"):
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
        for control in ("none", "shuffled", "random_weights", "permuted_positions"):
            _line(ax, rows[rows["control"] == control], **CONDITION_STYLE[control])
        ax.set_title(title)
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
        ax.set_title(site, fontsize=9)
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
    rows = rows[(rows["target"] == target) & (rows["metric"] == metric)
                & rows["component"].isin(["word", "embed", "resid_post"])]  # fmt: skip
    for control in ("none", "control_task", "shuffled", "random_weights"):
        _line(ax, rows[rows["control"] == control], **CONDITION_STYLE[control])
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
    ax.set_xticklabels(["word", "emb", *map(str, range(1, n + 1))])
    ax.set_xlabel("layer")
    ax.grid(alpha=0.3)
