"""Figures of the structure experiment, drawn from the saved tables only (``results``, ``rank_sweep``,
``examples``, ``example_edges``). The tables' ``layer`` counts the embedding output as 0 and the output of
block k - 1 as k (``hidden_states[k]``, Hewitt & Manning's numbering); the axes are labelled with the report's
convention (``naming``): "emb", then the block the stream leaves ("after layer L", blocks from 0). Sublayer
sites inside a block sit between its input and its output.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from bertscope.experiments.naming import model_name, residual_name, residual_tick

METRIC_LABEL = {"uuas": "UUAS (distance probe)", "dspr": "DSpr. (distance Spearman)",
                "root_acc": "root accuracy (depth probe)", "nspr": "NSpr. (norm Spearman)"}
FORMATS = ("png", "pdf")  # figure files written per figure
SUBLAYER_X = {"attn_out": -0.65, "resid_mid": -0.5, "mlp_out": -0.35}  # inside block k: between k - 1 and k
SUBLAYER_STYLE = {"attn_out": dict(color="C1", marker="^"), "resid_mid": dict(color="C4", marker="s"),
                  "mlp_out": dict(color="C6", marker="v")}


def plot(out_dir: Path, formats: Sequence[str] | None = None) -> list[Path]:
    """Every figure of the experiment from the tables in ``out_dir``, as ``formats`` (``FORMATS`` by default);
    returns the written files."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    out_dir = Path(out_dir)  # a str works too
    formats = tuple(formats or FORMATS)
    path = out_dir / "results.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; run `bertscope run structure` first")
    results = pd.read_parquet(path)
    written = _layers(results, out_dir, formats)
    if (out_dir / "rank_sweep.parquet").is_file():
        sweep = pd.read_parquet(out_dir / "rank_sweep.parquet")
        if "encoder" in sweep:
            sweep = sweep[sweep["encoder"] == "trained"]
        written += _ranks(sweep[sweep["metric"] == "uuas"], out_dir, formats)
    if (out_dir / "example_edges.parquet").is_file():
        written += _trees(pd.read_parquet(out_dir / "examples.parquet"),
                          pd.read_parquet(out_dir / "example_edges.parquet"), out_dir, formats)
    return written


def _band(ax, x, g, **style) -> None:
    ax.plot(x, g["value"], **style)
    ax.fill_between(x, g["ci_low"], g["ci_high"], color=style.get("color"), alpha=0.15, lw=0)


def _layers(results: pd.DataFrame, out_dir: Path, formats: Sequence[str] = FORMATS) -> list[Path]:
    import matplotlib.pyplot as plt
    from bertscope.experiments.io import save_figure

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    base = results[results["encoder"].str.startswith("baseline:")]
    n_test = int(results["n_test"].iloc[0])
    for ax, metric in zip(axes.flat, METRIC_LABEL, strict=True):
        rows = results[results["metric"] == metric]
        for encoder, style in (("trained", dict(color="C0", marker="o", label="trained model")),
                               ("random_weights", dict(color="C7", marker=".", ls=":", label="random weights"))):
            g = rows[(rows["encoder"] == encoder) & rows["component"].isin(["embed", "resid_post"])]
            g = g.sort_values("layer")
            if len(g):
                _band(ax, g["layer"].to_numpy(), g, **style)
        sub = rows[(rows["encoder"] == "trained") & rows["component"].isin(list(SUBLAYER_X))]
        for comp, g in sub.groupby("component"):
            x = g["layer"].to_numpy() + SUBLAYER_X[comp]
            ax.errorbar(x, g["value"], yerr=[g["value"] - g["ci_low"], g["ci_high"] - g["value"]], ls="none",
                        ms=4, label=f"{comp} (inside block)", **SUBLAYER_STYLE[comp])
        if metric == "uuas":
            for name, ls in (("linear_chain", "--"), ("random_tree", "-.")):  # trees using no vectors
                b = base[base["encoder"] == f"baseline:{name}"]
                if len(b):
                    ax.axhline(b["value"].iloc[0], color="C3", ls=ls, lw=1,
                               label=f"{name.replace('_', ' ')} ({b['value'].iloc[0]:.2f})")
        ax.set_title(METRIC_LABEL[metric])
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    ticks = sorted(int(v) for v in results.loc[results["component"].isin(["embed", "resid_post"]), "layer"].unique())
    for ax in axes[1]:
        ax.set_xticks(ticks, [residual_tick(t) for t in ticks])
        ax.set_xlabel("residual stream: embeddings (emb), then after layer L (blocks from 0)")
    axes[0, 0].legend(fontsize=7, loc="best")
    model, corpus = results["model"].iloc[0], results["corpus"].iloc[0]
    fig.suptitle(f"Structural probes per layer: {model_name(str(model))} on {corpus} "
                 f"(test: {n_test} sentences; bands: 95% bootstrap over sentences)", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_dir / "structure_layers", formats=formats)


def _ranks(sweep: pd.DataFrame, out_dir: Path, formats: Sequence[str] = FORMATS) -> list[Path]:
    import matplotlib.pyplot as plt
    from bertscope.experiments.io import save_figure

    fig, ax = plt.subplots(figsize=(7, 4.5))
    layers = sorted(sweep["layer"].unique())
    cmap = plt.get_cmap("viridis")
    for n, layer in enumerate(layers):
        g = sweep[sweep["layer"] == layer].sort_values("rank")
        _band(ax, g["rank"].to_numpy(), g, color=cmap(n / max(1, len(layers) - 1)), marker="o", ms=3,
              label=residual_name(layer))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("probe rank k (columns of B)")
    ax.set_ylabel("UUAS (test)")
    ax.set_title("UUAS against probe rank (Hewitt & Manning Fig. 2)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return save_figure(fig, out_dir / "structure_rank", formats=formats)


def _arcs(ax, edges: pd.DataFrame, sign: float, color: str, gold: set) -> None:
    from matplotlib.patches import Arc

    for r in edges.itertuples():
        width = abs(r.j - r.i)
        hit = (r.i, r.j) in gold
        ax.add_patch(Arc(((r.i + r.j) / 2, 0), width, width * 0.6, theta1=0 if sign > 0 else 180,
                         theta2=180 if sign > 0 else 360, color=color if hit or sign > 0 else "C3",
                         lw=1.5, ls="-" if hit or sign > 0 else "--"))


def _tree_legend() -> list:
    """Legend entries of ``structure_trees``: one per colour and line style the arcs and words use."""
    from matplotlib.lines import Line2D

    return [Line2D([], [], color="C0", lw=1.5, label="gold edge (above)"),
            Line2D([], [], color="C2", lw=1.5, label="predicted edge that is gold (below)"),
            Line2D([], [], color="C3", lw=1.5, ls="--", label="predicted edge not in the gold tree (below)"),
            Line2D([], [], color="0.6", marker="s", ls="none", label="punctuation (grey; left out)")]


def _trees(words: pd.DataFrame, edges: pd.DataFrame, out_dir: Path,
           formats: Sequence[str] = FORMATS) -> list[Path]:
    import matplotlib.pyplot as plt
    from bertscope.experiments.io import save_figure

    if words.empty:
        return []
    examples = sorted(words["example"].unique())
    fig, axes = plt.subplots(len(examples), 1, figsize=(11, 2.6 * len(examples) + 0.9), squeeze=False)
    for ax, e in zip(axes[:, 0], examples, strict=True):
        w = words[words["example"] == e].sort_values("word_index")
        ed = edges[edges["example"] == e]
        gold = ed[ed["source"] == "gold"]
        pred = ed[ed["source"] == "predicted"]
        gold_set = set(zip(gold["i"], gold["j"], strict=True))
        _arcs(ax, gold, 1, "C0", gold_set)
        _arcs(ax, pred, -1, "C2", gold_set)
        for r in w.itertuples():
            ax.text(r.word_index, 0, r.word, ha="center", va="center", fontsize=9,
                    color="0.6" if r.punct else "black", bbox=dict(fc="white", ec="none", pad=1))
        n = len(w)
        span = max(2.0, (w["word_index"].max() if n else 1) * 0.35)
        ax.set_xlim(-0.7, n - 0.3)
        ax.set_ylim(-span, span)
        ax.axis("off")
        hits = len(set(zip(pred["i"], pred["j"], strict=True)) & gold_set)
        ax.set_title(f"test sentence {e}: {hits} of {len(gold)} gold edges found", fontsize=9)
    layer = residual_name(int(edges["layer"].iloc[0]))
    fig.suptitle(f"Gold trees (above each sentence) and minimum spanning trees of the distance probe's predicted "
                 f"distances (below), residual stream {layer}", fontsize=10)
    fig.legend(handles=_tree_legend(), loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06 / len(examples) ** 0.5, 1, 1))
    return save_figure(fig, out_dir / "structure_trees", formats=formats)


