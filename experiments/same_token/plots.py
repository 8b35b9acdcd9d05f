"""Figures of the same-token experiment, drawn from the saved tables only (``results`` and ``example_maps``).

- ``heatmaps_<corpus>``: layer x head maps of self mass, duplicate mass and the duplicate observed/null
  ratios (primary and uniform), plain attention and norm-weighted;
- ``raw_vs_learned``: raw attention on each layer's input against the spread of that layer's heads;
- ``weights_self_preference``: the context-free W_QK self-preference per head;
- ``example_maps_<corpus>``: attention maps of one repeated sentence (raw and the top heads).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from bertscope.experiments import io

MAX_LOG2_RATIO = 6.0
CONTROL = "random-control"  # repeated-random's non-repeating control (heads only)
WEIGHTING_LABEL = {"attention": "plain attention weights", "norm": "norm-weighted, Kobayashi et al. 2020"}
METRIC_LABEL = {"qk_self_top1": "share of tokens whose own key scores highest",
                "qk_self_percentile": "mean share of other keys scored below the own key"}
SITE_LABEL = {"hook_word": "word embeddings", "hook_out": "embedding output"}


def plot(out_dir: Path, formats: Sequence[str] | None = None) -> list[Path]:
    """Redraw every figure from ``out_dir/results.parquet`` (and ``example_maps.parquet`` if present), as
    ``formats`` (``io.FIGURE_FORMATS`` by default)."""
    import matplotlib

    matplotlib.use("Agg")
    out_dir = Path(out_dir)
    formats = tuple(formats or io.FIGURE_FORMATS)
    results = pd.read_parquet(out_dir / "results.parquet")
    paths: list[Path] = []
    heads = results[results.source == "head"]
    for corpus in sorted(heads.loc[heads.weighting != "weights", "corpus"].unique()):
        if corpus != CONTROL:  # the control's per-head mass is a panel of copy_specific
            paths += io.save_figure(heatmaps(results, corpus), out_dir / f"heatmaps_{_slug(corpus)}", formats=formats)
    paths += io.save_figure(raw_vs_learned(results), out_dir / "raw_vs_learned", formats=formats)
    if (results.metric == "duplicate_copy_specific").any():
        paths += io.save_figure(copy_specific_figure(results), out_dir / "copy_specific", formats=formats)
    if (results.weighting == "weights").any():
        paths += io.save_figure(weight_heatmaps(results), out_dir / "weights_self_preference", formats=formats)
    maps_path = out_dir / "example_maps.parquet"
    if maps_path.is_file():
        maps = pd.read_parquet(maps_path)
        for corpus in sorted(maps.corpus.unique()) if len(maps) else []:
            figure = example_figure(maps[maps.corpus == corpus])
            paths += io.save_figure(figure, out_dir / f"example_maps_{_slug(corpus)}", formats=formats)
    return paths


def heatmaps(results: pd.DataFrame, corpus: str):  # noqa: ANN201 - matplotlib Figure
    """Rows: attention / norm-weighted; columns: self, duplicate, duplicate/primary null, duplicate/uniform."""
    import matplotlib.pyplot as plt

    heads = results[(results.source == "head") & (results.corpus == corpus)]
    weightings = [w for w in ("attention", "norm") if (heads.weighting == w).any()]
    panels = [
        ("self", "value", "self mass"),
        ("duplicate", "value", "duplicate mass"),
        ("duplicate", "ratio", "duplicate / {kind} null"),
        ("duplicate", "ratio_uniform", "duplicate / uniform null"),
    ]
    if set(heads.loc[heads.metric == "duplicate", "null_kind"]) == {"uniform"}:
        panels = panels[:3]  # the primary null is the uniform one: the last column would repeat the third
    fig, axes = plt.subplots(len(weightings), len(panels), figsize=(4.2 * len(panels), 3.4 * len(weightings)),
                             squeeze=False)
    for r, weighting in enumerate(weightings):
        for c, (metric, column, title) in enumerate(panels):
            rows = heads[(heads.weighting == weighting) & (heads.metric == metric)]
            grid = rows.pivot(index="layer", columns="head", values=column).sort_index()
            ax = axes[r, c]
            if column.startswith("ratio"):
                with np.errstate(divide="ignore"):
                    data = np.log2(grid.to_numpy(dtype=float))
                finite = np.abs(data[np.isfinite(data)])
                # a head with ~0 mass has log2 ratio -> -inf: clip the scale at 64x either way
                span = min(float(finite.max()), MAX_LOG2_RATIO) if finite.size else 1.0
                im = ax.imshow(np.clip(data, -span, span), cmap="RdBu_r", vmin=-span, vmax=span, aspect="auto")
                fig.colorbar(im, ax=ax, label=f"log2 ratio (clipped at ±{span:.3g})")
                kind = rows.null_kind.iloc[0] if len(rows) else ""
                title = title.format(kind=kind)
            else:
                im = ax.imshow(grid.to_numpy(dtype=float), cmap="viridis", vmin=0, aspect="auto")
                fig.colorbar(im, ax=ax, label="mass (share of the query's attention)")
            ax.set_title(f"{title}\n({WEIGHTING_LABEL.get(weighting, weighting)})", fontsize=9)
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            ax.set_xticks(range(grid.shape[1]))
            ax.set_yticks(range(grid.shape[0]), grid.index)
    n = heads.n_sentences.max() if len(heads) else 0
    fig.suptitle(f"same-token attention per head, corpus {corpus} ({n} sentences)")
    fig.subplots_adjust(left=0.04, right=0.97, top=0.86, bottom=0.09, wspace=0.3, hspace=0.5)
    return fig


def raw_vs_learned(results: pd.DataFrame):  # noqa: ANN201 - matplotlib Figure
    """Self and duplicate mass: raw softmax(X X^T / sqrt(d)) on the input of layer L against the 12 heads of
    layer L (dots; plain attention weights), per corpus. The word embeddings alone sit at the far left."""
    import matplotlib.pyplot as plt

    data = results[results.weighting != "weights"]
    corpora = sorted(data.loc[data.source == "raw", "corpus"].unique())
    metrics = ["self", "duplicate"]
    fig, axes = plt.subplots(len(metrics), len(corpora), figsize=(5.5 * len(corpora), 7), squeeze=False)
    n_layers = int(data.loc[data.source == "head", "layer"].max()) + 1 if (data.source == "head").any() else 0
    # x = 0: word embeddings; x = L + 1: input of layer L (embedding output for L = 0, else resid_post L - 1)
    raw_x = {"embed.hook_word": 0, "embed.hook_out": 1}
    raw_x.update({f"blocks.{i}.hook_resid_post": i + 2 for i in range(n_layers)})
    labels = ["word emb", *(f"in L{i}" for i in range(n_layers)), f"out L{n_layers - 1}"]
    for c, corpus in enumerate(corpora):
        for r, metric in enumerate(metrics):
            ax = axes[r, c]
            raw = data[(data.source == "raw") & (data.corpus == corpus) & (data.metric == metric)]
            raw = raw.assign(x=raw.site.map(raw_x)).dropna(subset=["x"]).sort_values("x")
            ax.errorbar(raw.x, raw.value, yerr=[raw.value - raw.ci_low, raw.ci_high - raw.value], fmt="o-",
                        color="black", label="raw softmax(X X^T / sqrt(d))", zorder=3)
            heads = data[(data.source == "head") & (data.corpus == corpus) & (data.metric == metric)
                         & (data.weighting == "attention")]
            jitter = (heads["head"] - heads["head"].mean()) / (4 * max(heads["head"].max(), 1))
            ax.scatter(heads.layer + 1 + jitter, heads.value, s=12, alpha=0.6, color="tab:blue",
                       label="learned heads of layer L")
            null = heads.groupby("layer")["null_uniform"].mean()
            ax.plot(null.index + 1, null.values, "--", color="gray", label="uniform null")
            ax.set_xticks(range(len(labels)), labels, rotation=45)
            ax.set_ylim(0, 1)
            ax.set_ylabel(f"{metric} mass")
            ax.set_title(f"{metric} mass, corpus {corpus}", fontsize=10)
            if r == 0 and c == 0:
                ax.legend(fontsize=8)
    fig.suptitle("raw dot-product attention vs learned heads")
    fig.subplots_adjust(left=0.08, right=0.97, top=0.91, bottom=0.1, wspace=0.2, hspace=0.45)
    return fig


def weight_heatmaps(results: pd.DataFrame):  # noqa: ANN201 - matplotlib Figure
    """Per head, share of sampled tokens whose own key scores highest under W_QK, and the mean percentile."""
    import matplotlib.pyplot as plt

    data = results[results.weighting == "weights"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, metric in zip(axes, ("qk_self_top1", "qk_self_percentile"), strict=True):
        rows = data[(data.source == "head") & (data.metric == metric)]
        grid = rows.pivot(index="layer", columns="head", values="value").sort_index()
        im = ax.imshow(grid.to_numpy(dtype=float), cmap="viridis", vmin=0, vmax=1, aspect="auto")
        fig.colorbar(im, ax=ax, label="share of sampled tokens")
        raw = data[(data.source == "raw") & (data.metric == metric)].set_index("site")["value"]
        raw_text = ", ".join(f"{SITE_LABEL.get(s.split('.')[-1], s)} {v:.2f}" for s, v in raw.items())
        ax.set_title(f"{METRIC_LABEL.get(metric, metric)} (chance {rows.null.iloc[0]:.3g})\nraw x x^T: {raw_text}",
                     fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(grid.shape[1]))
        ax.set_yticks(range(grid.shape[0]), grid.index)
    n = int(data.n_queries.max())
    fig.suptitle(f"context-free self-preference of each head's query-key product over {n} sampled vocabulary tokens")
    fig.subplots_adjust(left=0.06, right=0.97, top=0.76, bottom=0.13, wspace=0.25)
    return fig


def example_figure(maps: pd.DataFrame):  # noqa: ANN201 - matplotlib Figure
    """One panel per saved attention map of the example sentence."""
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys(maps.panel))
    cols = min(4, len(panels))
    rows = int(np.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 4.3 * rows), squeeze=False)
    tokens = maps.drop_duplicates("key").sort_values("key").key_token.tolist()
    ticks = list(range(0, len(tokens), max(1, len(tokens) // 45)))
    labels = [tokens[i] for i in ticks]
    for i, (ax, panel) in enumerate(zip(axes.flat, panels, strict=False)):
        m = maps[maps.panel == panel]
        grid = m.pivot(index="query", columns="key", values="weight").sort_index()
        im = ax.imshow(grid.to_numpy(dtype=float), cmap="magma", vmin=0, aspect="equal")
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="attention weight")
        ax.set_title(_panel_title(panel), fontsize=9)
        # every panel shows the same tokens: name them on the outer panels only (left column, lowest row)
        bottom = i + cols >= len(panels)
        ax.set_xticks(ticks)
        ax.set_yticks(ticks)
        if bottom:  # labels only where shown: hidden tick labels are neither laid out nor drawn (the figure's cost)
            ax.set_xticklabels(labels, rotation=90, fontsize=6)
        if i % cols == 0:
            ax.set_yticklabels(labels, fontsize=6)
        ax.tick_params(labelbottom=bottom, labelleft=i % cols == 0)
        ax.set_xlabel("key" if bottom else "")
        ax.set_ylabel("query" if i % cols == 0 else "")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    text = " ".join(t for t in tokens if t not in ("[CLS]", "[SEP]")).replace(" ##", "")
    text = text if len(text) <= 90 else text[:87] + "..."
    sentence = str(maps.sentence_id.iloc[0]).rsplit("/", 1)[-1]
    fig.suptitle(f"attention on a sentence with repeated tokens ({maps.corpus.iloc[0]}, sentence {sentence}):\n"
                 f"\"{text}\"", fontsize=10)
    fig.subplots_adjust(left=0.06, right=0.98, top=1 - 0.75 / fig.get_figheight(), bottom=0.1, wspace=0.55,
                        hspace=0.25)
    return fig


def copy_specific_figure(results: pd.DataFrame):  # noqa: ANN201 - matplotlib Figure
    """Per head (plain attention): the non-repeating control's mass at the would-be copy, and the copy-specific
    mass (repeated-random minus that); then pooled against type-balanced duplicate mass on the main corpus."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    rows = results[(results.metric == "duplicate_copy_specific") & (results.weighting == "attention")]
    for ax, column, label, title in (
        (axes[0], "null", "mass at offset ±m, no copies", "random-control: mass at the would-be copy (offset ±m)"),
        (axes[1], "value", "copy-specific mass (repeated - control)", "copy-specific mass: repeated-random minus "
         "control"),
    ):  # fmt: skip
        grid = rows.pivot(index="layer", columns="head", values=column).sort_index()
        data = grid.to_numpy(dtype=float)
        span = max(float(np.nanmax(np.abs(data))), 1e-6)
        scale = {"cmap": "viridis", "vmin": 0} if column == "null" else {"cmap": "RdBu_r", "vmin": -span, "vmax": span}
        im = ax.imshow(data, aspect="auto", **scale)
        fig.colorbar(im, ax=ax, label=label)
        ax.set_title(f"{title}\n(per head, plain attention weights)", fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(grid.shape[1]))
        ax.set_yticks(range(grid.shape[0]), grid.index)
    main = [c for c in results.corpus.unique() if c not in ("repeated-random", CONTROL, "vocab-sample")]
    if main:
        _pooled_vs_balanced(axes[2], results, main[0])
    axes[2].set_xlabel("pooled duplicate mass (ratio of sums over queries)")
    axes[2].set_ylabel("type-balanced duplicate mass (mean over types)")
    fig.suptitle("what copies add beyond position, and how much frequent tokens weigh")
    fig.subplots_adjust(left=0.05, right=0.98, top=0.82, bottom=0.13, wspace=0.35)
    return fig


def _pooled_vs_balanced(ax, results: pd.DataFrame, corpus: str) -> None:  # noqa: ANN001 - matplotlib Axes
    """Scatter per head of pooled against type-balanced duplicate mass on ``corpus``, with the diagonal."""
    heads = results[(results.corpus == corpus) & (results.source == "head") & (results.weighting == "attention")]
    pooled = heads[heads.metric == "duplicate"].set_index(["layer", "head"]).value
    balanced = heads[heads.metric == "duplicate_type_balanced"].set_index(["layer", "head"]).value
    pair = pd.concat({"pooled": pooled, "balanced": balanced}, axis=1).dropna()
    ax.scatter(pair.pooled, pair.balanced, s=14, alpha=0.7, color="tab:blue", label="learned heads")
    top = float(max(pair.max().max(), 1e-6)) * 1.05
    ax.plot([0, top], [0, top], "--", color="gray", label="equal")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.legend(fontsize=8)
    ax.set_title(f"duplicate mass per head on {corpus}:\npooled vs type-balanced (plain attention weights)",
                 fontsize=9)


def _panel_title(panel: str) -> str:
    """'L3H5: duplicate / uniform null = 12.3' -> 'L3H5: duplicate mass 12.3x its uniform null'."""
    match = re.fullmatch(r"L(\d+)H(\d+): (\w+) / (\w+) null = (.+)", panel)
    if not match:
        return panel.replace("raw:", "raw softmax(X X^T / sqrt(d)) on the").replace("  ", " ")
    layer, head, metric, kind, ratio = match.groups()
    return f"L{layer}H{head}: {metric} mass\n{ratio}x its {kind} null"


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")
