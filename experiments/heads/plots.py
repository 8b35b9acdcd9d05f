"""Figures of the `heads` experiment, drawn from the saved tables only (no model).

Reads ``results.parquet`` (or ``.csv``), ``roles.csv``, ``syntax.csv`` (if the corpus had gold trees),
``distances.parquet``, ``mds.csv`` and ``pruning.csv`` from the experiment folder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from bertscope.experiments import io
from bertscope.experiments.naming import head_name

HEATMAP_METRICS = (
    "mass_cls", "mass_sep", "mass_punct", "mass_self", "mass_prev", "mass_next",
    "sep_to_sep", "entropy_ratio", "confidence", "mean_distance", "top_offset_fraction",
    "norm_cls", "norm_sep", "norm_punct", "norm_prev", "norm_next",
)  # fmt: skip
DOT_COLUMNS = 4  # panels per row of fig_layer_dots (7 panels: a 4 + 3 grid, not one wide strip)
DOT_METRICS = ("cls", "sep", "punct", "self", "prev", "next")
TITLES = {
    "mass_cls": "attention to [CLS]", "mass_sep": "attention to [SEP]", "mass_punct": "attention to . and ,",
    "mass_self": "attention to itself", "mass_prev": "attention to previous token",
    "mass_next": "attention to next token", "sep_to_sep": "[SEP] to [SEP]",
    "entropy_ratio": "entropy / ln n", "confidence": "max weight (confidence)",
    "mean_distance": "mean attended distance (tokens)", "top_offset_fraction": "share at the top offset",
    "norm_cls": "norm-weighted: [CLS]", "norm_sep": "norm-weighted: [SEP]", "norm_punct": "norm-weighted: . and ,",
    "norm_self": "norm-weighted: itself", "norm_prev": "norm-weighted: previous", "norm_next": "norm-weighted: next",
    "cls": "[CLS]", "sep": "[SEP]", "punct": ". and ,", "self": "itself", "prev": "previous token",
    "next": "next token",
}  # fmt: skip
MEASURE_TITLES = {"hidden_cos": "token states (1 - cos)", "pooled_cos": "sentence embedding (1 - cos)",
                  "mlm_loss_change": "masked-LM loss change"}  # fmt: skip


def title_of(metric: str) -> str:
    """Readable panel title of a metric name (``ablation:zero:pooled_cos`` -> ``zero ablation: sentence ...``)."""
    if metric in TITLES:
        return TITLES[metric]
    parts = metric.split(":")
    if parts[0] == "ablation" and len(parts) == 3:
        return f"{parts[1]} ablation: {MEASURE_TITLES.get(parts[2], parts[2])}"
    if parts[0] == "grad_importance":
        kind = parts[1] if len(parts) > 1 else ""
        return "gradient importance (Michel et al., MLM)" if kind == "mlm" else "gradient (consistency check)"
    return metric
FORMATS = tuple(io.FIGURE_FORMATS)
Formats = tuple[str, ...]


def plot(out_dir: Path, formats: Formats | None = None) -> list[Path]:
    """Every figure the saved tables allow; returns the written paths (``formats``: ``FORMATS`` by default)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    formats = tuple(formats or FORMATS)
    out_dir = Path(out_dir)
    results = _read_results(out_dir)
    tables = {
        "mds": (out_dir / "mds.csv", pd.read_csv, plot_mds),
        "distances": (out_dir / "distances.parquet", pd.read_parquet, plot_distance_clusters),
        "syntax": (out_dir / "syntax.csv", pd.read_csv, plot_syntax),
        "pruning": (out_dir / "pruning.csv", pd.read_csv, plot_pruning),
    }
    paths: list[Path] = []
    for fn in (plot_heatmaps, plot_layer_dots, plot_offsets, plot_ablation):
        paths += fn(results, out_dir, formats)
    for path, read, fn in tables.values():
        if path.is_file():
            paths += fn(read(path), out_dir, formats)
    return paths


def plot_heatmaps(results: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS) -> list[Path]:
    """Layer x head heatmap of each attention statistic (shared 0..1 colour scale; distance in tokens)."""
    import matplotlib.pyplot as plt

    metrics = [m for m in HEATMAP_METRICS if m in set(results["metric"])]
    if not metrics:
        return []
    cols = 4
    rows = -(-len(metrics) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.3 * rows), squeeze=False, sharex=True, sharey=True)
    shared = None
    for ax, metric in zip(axes.flat, metrics, strict=False):
        grid = _grid(results, metric)
        if metric == "mean_distance":
            im = ax.imshow(grid, aspect="auto", cmap="cividis")
            fig.colorbar(im, ax=ax, fraction=0.05, pad=0.02)
        else:
            shared = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_title(title_of(metric), fontsize=9)
        _integer_ticks(ax, grid.shape)
    for ax in axes[-1]:
        ax.set_xlabel("head")
    for ax in axes[:, 0]:
        ax.set_ylabel("layer")
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    if shared is not None:
        fig.colorbar(shared, ax=axes, fraction=0.02, pad=0.02, label="mass / share")
    fig.suptitle("Attention statistics per head (mean over sentences)")
    return io.save_figure(fig, out_dir / "fig_heatmaps", formats=formats)


def plot_layer_dots(results: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS) -> list[Path]:
    """Per-layer dot plots, one dot per head: attention-weight mass (filled) vs norm-weighted (hollow)."""
    import matplotlib.pyplot as plt

    present = set(results["metric"])
    metrics = [m for m in DOT_METRICS if f"mass_{m}" in present]
    extra = ["entropy"] if "entropy" in present else []
    panels = metrics + extra
    if not panels:
        return []
    n_cols = min(DOT_COLUMNS, len(panels))
    n_rows = -(-len(panels) // n_cols)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(3.2 * n_cols, 2.9 * n_rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    rng = np.random.default_rng(0)  # jitter only
    for ax, name in zip(axes.flat, panels, strict=False):
        if name == "entropy":
            grid = _grid(results, "entropy")
            layers = np.arange(grid.shape[0])
            for layer in layers:
                ax.scatter(layer + rng.uniform(-0.2, 0.2, grid.shape[1]), grid[layer], s=10, color="C0")
            ref = _grid(results, "entropy_max").mean(1)
            ax.plot(layers, ref, "k--", lw=1, label="ln n")
            ax.set_title("entropy (nats)", fontsize=9)
            ax.set_ylabel("nats")
        else:
            styles = ((f"mass_{name}", {"color": "C0"}), (f"norm_{name}", {"facecolor": "none", "edgecolor": "C3"}))
            for metric, style in styles:
                if metric not in present:
                    continue
                grid = _grid(results, metric)
                for layer in range(grid.shape[0]):
                    label = ("attention" if metric.startswith("mass") else "norm-weighted") if layer == 0 else None
                    ax.scatter(layer + rng.uniform(-0.2, 0.2, grid.shape[1]), grid[layer], s=10, label=label, **style)
            ax.set_ylim(-0.03, 1.03)
            ax.set_title(f"attention to {TITLES.get(name, name)}", fontsize=9)
            ax.set_ylabel("mean attention mass")
        ax.set_xlabel("layer")
        ax.set_xticks(range(int(results["layer"].max()) + 1))
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Attention mass per head, by layer (one dot per head)")
    fig.tight_layout()
    return io.save_figure(fig, out_dir / "fig_layer_dots", formats=formats)


def plot_offsets(results: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS) -> list[Path]:
    """Argmax-offset histogram of every head (rows, grouped by layer) as a heatmap, with the mass on [CLS]."""
    import matplotlib.pyplot as plt

    sel = results[results["metric"].str.startswith("argmax_offset")]
    if sel.empty:
        return []
    names = list(dict.fromkeys(sel["metric"]))  # saved order: tail, -k..k, tail
    wide = sel.pivot_table(index=["layer", "head"], columns="metric", values="value")[names]
    grid = wide.to_numpy()
    labels = [n.removeprefix("argmax_offset").lstrip("=") for n in names]
    labels[0] += "\n(incl.\n[CLS])"
    cls = results[(results["metric"] == "mass_cls") & results["head"].notna()]
    if len(cls):
        cls_mass = cls.pivot_table(index=["layer", "head"], values="value").reindex(wide.index).to_numpy()
        grid = np.concatenate([grid, np.full((len(grid), 1), np.nan), cls_mass], axis=1)
        labels += ["", "mass\non\n[CLS]"]
    n_rows = len(wide)
    fig, ax = plt.subplots(figsize=(8, max(5, 0.13 * n_rows)))
    im = ax.imshow(grid, aspect="auto", cmap="magma", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks(range(len(labels)), labels, fontsize=6)
    ax.set_yticks(range(n_rows), [head_name(layer, head) for layer, head in wide.index], fontsize=5)
    layers = wide.index.get_level_values(0).to_numpy()
    for i in np.flatnonzero(np.diff(layers)):  # white lines between layers
        ax.axhline(i + 0.5, color="white", lw=1.2)
    ax.axvline(0.5, color="white", lw=0.8, ls=":")
    ax.set_ylabel("head (L{layer}H{head})")
    ax.set_xlabel("offset of the argmax key from the query (tokens; the left tail includes argmaxes on [CLS])")
    ax.set_title("Where each head's strongest weight falls")
    fig.colorbar(im, ax=ax, fraction=0.046, label="share of queries / attention mass")
    fig.tight_layout()
    return io.save_figure(fig, out_dir / "fig_argmax_offsets", formats=formats)


def plot_mds(mds: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS) -> list[Path]:
    """MDS map of the sqrt-JSD distances, coloured by layer and by primary role."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.8))
    sc = a.scatter(mds["x"], mds["y"], c=mds["layer"], cmap="viridis", s=28)
    fig.colorbar(sc, ax=a, label="layer")
    a.set_title("Heads by layer")
    for i, (role, group) in enumerate(mds.groupby("primary_role")):
        b.scatter(group["x"], group["y"], s=28, label=role, color=f"C{i % 10}")
    _label_without_overlap(b, mds)
    b.legend(fontsize=7, loc="best")
    b.set_title("Heads by primary role")
    for ax in (a, b):
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle("MDS of head distances (sqrt Jensen-Shannon, averaged over tokens)")
    fig.tight_layout()
    return io.save_figure(fig, out_dir / "fig_mds", formats=formats)


def plot_distance_clusters(distances: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS) -> list[Path]:
    """Distance matrix reordered by average-linkage hierarchical clustering, with its dendrogram."""
    import matplotlib.pyplot as plt
    from scipy.cluster.hierarchy import dendrogram, linkage
    from scipy.spatial.distance import squareform

    labels = distances.drop_duplicates(["layer_a", "head_a"])[["layer_a", "head_a"]]
    names = [head_name(layer, head) for layer, head in labels.itertuples(index=False)]
    d = distances.pivot_table(index=["layer_a", "head_a"], columns=["layer_b", "head_b"], values="distance").to_numpy()
    d = 0.5 * (d + d.T)
    np.fill_diagonal(d, 0.0)
    tree = linkage(squareform(d, checks=False), method="average")
    fig = plt.figure(figsize=(9, 10))
    ax_tree = fig.add_axes([0.1, 0.8, 0.75, 0.15])
    order = dendrogram(tree, ax=ax_tree, no_labels=True, color_threshold=0)["leaves"]
    ax_tree.axis("off")
    ax = fig.add_axes([0.1, 0.05, 0.75, 0.74])
    im = ax.imshow(d[np.ix_(order, order)], cmap="viridis_r", aspect="auto")
    fontsize = 4 if len(names) > 40 else 7
    ax.set_xticks(range(len(order)), [names[i] for i in order], rotation=90, fontsize=fontsize)
    ax.set_yticks(range(len(order)), [names[i] for i in order], fontsize=fontsize)
    fig.colorbar(im, cax=fig.add_axes([0.87, 0.05, 0.02, 0.74]), label="sqrt JSD (bits)")
    fig.suptitle("Head distances, clustered (heads named L{layer}H{head})")
    return io.save_figure(fig, out_dir / "fig_distance_clusters", formats=formats)


def plot_syntax(syntax: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS) -> list[Path]:
    """Per relation: held-out accuracy of the best head vs the best offset baseline, with intervals."""
    import matplotlib.pyplot as plt

    t = syntax[~syntax["relation"].isin(["punct", "root"])]
    if t.empty:
        return []
    t = t.iloc[::-1].reset_index(drop=True)
    y = np.arange(len(t))
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(t) + 1.5))
    acc = t["heldout_accuracy"].to_numpy(dtype=float)
    err = accuracy_error_bars(acc, t["heldout_accuracy_low"].to_numpy(dtype=float),
                              t["heldout_accuracy_high"].to_numpy(dtype=float))  # fmt: skip
    ax.barh(y + 0.2, t["heldout_accuracy"], height=0.4, xerr=np.nan_to_num(err), label="best head (held-out)",
            color="C0", error_kw={"lw": 0.8})  # fmt: skip
    ax.barh(y - 0.2, t["heldout_baseline_accuracy"], height=0.4, label="best offset baseline (held-out)", color="C7")
    labels = []
    for rec in t.to_dict("records"):
        where = "" if pd.isna(rec["layer"]) else f"  {head_name(rec['layer'], rec['head'])} {rec['direction']}"
        labels.append(f"{rec['relation']} (n={rec['n']}){where}")
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_xlabel("accuracy on the held-out half (arcs whose head the argmax names)")
    ax.set_ylabel("relation (arcs)  head chosen on all sentences")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    ax.set_title("Dependency relations: best attention head vs fixed-offset baseline\n(punct and root left out)")
    fig.tight_layout()
    return io.save_figure(fig, out_dir / "fig_syntax", formats=formats)


def accuracy_error_bars(value: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """``xerr [2, n]`` for bars of accuracies: the interval clipped to the metric's range [0, 1] (an accuracy
    cannot pass 1 whatever its bootstrap says), never negative, and 0 where there is no interval (NaN)."""
    low, high = np.clip(low, 0.0, 1.0), np.clip(high, 0.0, 1.0)
    err = np.stack([value - low, high - value])
    return np.clip(np.nan_to_num(err, nan=0.0), 0.0, None)


def plot_ablation(results: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS) -> list[Path]:
    """Layer x head heatmaps of ablation effects (one per method and measure) and gradient importance."""
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(results["metric"]))  # saved order: method by method, then gradients
    metrics = [m for m in names if m.startswith(("ablation:", "grad_importance:"))]
    if not metrics:
        return []
    cols = max(1, len({m.rsplit(":", 1)[-1] for m in metrics if m.startswith("ablation:")}))  # one per measure
    rows = -(-len(metrics) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.3 * cols, 2.9 * rows), squeeze=False)
    for ax, metric in zip(axes.flat, metrics, strict=False):
        grid = _grid(results, metric)
        im = ax.imshow(grid, aspect="auto", cmap="inferno")
        _integer_ticks(ax, grid.shape)
        ax.set_title(title_of(metric), fontsize=8)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        fig.colorbar(im, ax=ax, fraction=0.046)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    fig.suptitle("Output change when one head is ablated (cosine distance), and gradient importance")
    fig.tight_layout()
    return io.save_figure(fig, out_dir / "fig_ablation", formats=formats)


def plot_pruning(pruning: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS) -> list[Path]:
    """Output change against the number of heads removed (zero ablation), one curve per order."""
    import matplotlib.pyplot as plt

    measures = list(dict.fromkeys(pruning["measure"]))
    fig, axes = plt.subplots(1, len(measures), figsize=(5.5 * len(measures), 4), squeeze=False)
    for ax, measure in zip(axes[0], measures, strict=True):
        for i, (order, group) in enumerate(pruning[pruning["measure"] == measure].groupby("order", sort=False)):
            group = group.sort_values("n_removed")
            ax.plot(group["n_removed"], group["value"], marker="o", ms=3, label=order, color=f"C{i}")
            ax.fill_between(group["n_removed"], group["ci_low"], group["ci_high"], alpha=0.2, color=f"C{i}")
        ax.set_xlabel("heads removed (zeroed)")
        ax.set_ylabel("1 - cosine to the clean output")
        ax.set_title(MEASURE_TITLES.get(measure, measure))
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Pruning curves")
    fig.tight_layout()
    return io.save_figure(fig, out_dir / "fig_pruning", formats=formats)


# ----------------------------------------------------------------------------------------------- helpers


def _label_without_overlap(ax: object, mds: pd.DataFrame, min_gap: float = 0.045) -> None:
    """Label points ``L{layer}H{head}``, skipping a label that would land within ``min_gap`` (share of the axis
    span) of one already placed; the skipped count is stated in the corner."""
    span = np.array([np.ptp(mds["x"]) or 1.0, np.ptp(mds["y"]) or 1.0])
    placed: list[np.ndarray] = []
    skipped = 0
    for rec in mds.to_dict("records"):
        at = np.array([rec["x"], rec["y"]]) / span
        if any(np.abs(at - p).max() < min_gap for p in placed):
            skipped += 1
            continue
        placed.append(at)
        ax.annotate(head_name(rec["layer"], rec["head"]), (rec["x"], rec["y"]), xytext=(3, 2),
                    textcoords="offset points", fontsize=6, alpha=0.8)  # fmt: skip
    if skipped:
        ax.text(0.01, 0.01, f"{skipped} crowded labels omitted", transform=ax.transAxes, fontsize=6, alpha=0.7)


def _read_results(out_dir: Path) -> pd.DataFrame:
    for name in ("results.parquet", "results.csv"):
        path = out_dir / name
        if path.is_file():
            return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    raise FileNotFoundError(f"{out_dir} has no results.parquet or results.csv; run `bertscope run heads` first")


def _integer_ticks(ax: object, shape: tuple[int, int]) -> None:
    """Integer layer (y) and head (x) ticks on a ``[layer, head]`` image."""
    ax.set_xticks(range(0, shape[1], max(1, shape[1] // 6)))
    ax.set_yticks(range(0, shape[0], max(1, shape[0] // 6)))


def _grid(results: pd.DataFrame, metric: str) -> np.ndarray:
    """``[layer, head]`` values of one per-head metric."""
    sel = results[(results["metric"] == metric) & results["head"].notna()]
    return sel.pivot_table(index="layer", columns="head", values="value").to_numpy(dtype=float)
