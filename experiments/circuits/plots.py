"""Figures of the `circuits` experiment, drawn from the saved tables only (no model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from bertscope.experiments import io
from bertscope.experiments.io import read_table
from bertscope.hooks.circuits import table
from bertscope.hooks.naming import head_name, head_of

FORMATS = tuple(io.FIGURE_FORMATS)
Formats = tuple[str, ...]


def __getattr__(name: str) -> Any:
    """The old name ``LABELS``, read from the node table when asked for."""
    if name == "LABELS":  # old name: node method -> figure label, read from the node table when asked for
        return {m: table.label(m) for m in table.node_methods()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def plot(out_dir: Path, formats: Formats | None = None) -> list[Path]:
    """Every figure the saved tables allow; returns the written paths."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    formats = tuple(formats or FORMATS)
    out_dir = Path(out_dir)
    paths: list[Path] = []
    results = read_table(out_dir, "results")
    if results is not None:
        paths += plot_head_maps(results, out_dir, formats)
    circuit = read_table(out_dir, "circuit")
    if circuit is not None and not circuit.empty:
        drawing = {} if results is None else {"n_layers": int(results.layer.max()) + 1,
                                            "n_heads": int(results["head"].max()) + 1}
        edges = read_table(out_dir, "edges")
        if edges is not None and "method" in edges and len(edges):
            drawing["method"] = str(edges.method.iloc[0])
        paths += plot_circuit(circuit, out_dir, formats, **drawing)
    curve = read_table(out_dir, "faithfulness")
    if curve is not None:
        paths += plot_faithfulness(curve, read_table(out_dir, "areas"), out_dir, formats)
    return paths


def plot_head_maps(results: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS) -> list[Path]:
    import matplotlib.pyplot as plt

    present = set(results.method)  # the table's order, then any method no longer registered
    methods = [m for m in table.node_methods() if m in present] + sorted(present - set(table.node_methods()))
    n_layers, n_heads = int(results.layer.max()) + 1, int(results["head"].max()) + 1
    grids = {m: results[results.method == m].pivot_table(index="layer", columns="head", values="normalised")
             .reindex(index=range(n_layers), columns=range(n_heads)).to_numpy() for m in methods}
    magnitude = {m for m in methods if m in table.NODE_TABLE and not table.NODE_TABLE[m].signed}
    for m in magnitude:  # AtP*'s GradDrop is a magnitude: its share divided by a signed total has no sign to show
        grids[m] = np.abs(grids[m])
    vmax = max(float(np.nanmax(np.abs(g))) for g in grids.values()) or 1.0
    # constrained layout and one shared "layer" axis: the title and each panel's labels never overlap a neighbour
    fig, axes = plt.subplots(1, len(methods), figsize=(3.2 * len(methods), 3.0), squeeze=False, sharey=True,
                             layout="constrained")  # fmt: skip
    for ax, m in zip(axes[0], methods, strict=True):
        im = ax.imshow(grids[m], cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="auto")
        ax.set_title(table.label(m) + (" (magnitude)" if m in magnitude else ""), fontsize=9)
        ax.set_xlabel("head")
    axes[0][0].set_ylabel("layer")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="share of the clean-to-corrupted change")
    fig.suptitle("Head effects on the term-frequency signal (TFC1)", fontsize=10)
    return io.save_figure(fig, out_dir / "fig_head_maps", formats)


#: Edge colours by the sign of the score (colour-blind safe pair): score < 0, score > 0.
EDGE_COLOURS = {"lowers": "#d95f02", "raises": "#1b6ca8"}


def _rows(n_layers: int) -> list[str]:
    """The graph's rows bottom to top: embeddings, then each layer's attention and MLP, then the output."""
    return ["embeddings"] + [f"layer {L} {part}" for L in range(n_layers) for part in ("attention", "MLP")] + ["output"]


def _position(node: str, n_layers: int, n_heads: int) -> tuple[float, float]:
    """``(x, y)`` of a circuit node: y = its row in :func:`_rows` (embeddings 0, layer L's heads 2L + 1, its MLP
    2L + 2, output 2 n_layers + 1); x = the head's number, MLPs in a column right of the heads, input and output
    in a column left of them (so the input->output edge crosses no node)."""
    if node == "input":
        return -1.5, 0.0
    if node == "output":
        return -1.5, 2.0 * n_layers + 1
    head = head_of(node)
    if head is not None:
        return float(head[1]), 2.0 * head[0] + 1
    return n_heads + 0.5, 2.0 * int(node[1:]) + 2


def _shape(circuit: pd.DataFrame, n_layers: int | None, n_heads: int | None) -> tuple[int, int]:
    """The model's layers and heads: as given (from the head table), else the largest the circuit names."""
    nodes = set(circuit.sender) | set(circuit.receiver)
    heads = [h for h in map(head_of, nodes) if h is not None]
    mlps = [int(n[1:]) for n in nodes if n.startswith("m") and n[1:].isdigit()]
    layers = [h[0] for h in heads] + mlps
    return (n_layers or (max(layers) + 1 if layers else 1)), (n_heads or (max(h[1] for h in heads) + 1 if heads else 1))


def plot_circuit(circuit: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS, *, n_layers: int | None = None,
                 n_heads: int | None = None, method: str = "eap-ig") -> list[Path]:
    """``fig_circuit``: the circuit's nodes placed by layer (embeddings at the bottom, output at the top; heads by
    number, MLPs in their own column, every node of the model a faint dot), each labelled beside it (``L5H8``,
    ``MLP 4``); an edge's width is its score's size, its colour the score's sign, both in the legend.
    ``n_layers``/``n_heads``: the model's (default: the largest the circuit names); ``method``: the edge method
    that scored the edges (the ``edges`` table's), named in the legend."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyArrowPatch

    n_layers, n_heads = _shape(circuit, n_layers, n_heads)
    rows = _rows(n_layers)
    nodes = sorted(set(circuit.sender) | set(circuit.receiver))
    pos = {n: _position(n, n_layers, n_heads) for n in nodes}
    fig, ax = plt.subplots(figsize=(1.9 + 0.42 * (n_heads + 3), 1.6 + 0.3 * len(rows)))
    everything = [_position(head_name(L, h), n_layers, n_heads) for L in range(n_layers) for h in range(n_heads)]
    everything += [_position(f"m{L}", n_layers, n_heads) for L in range(n_layers)]
    ax.scatter(*zip(*everything, strict=True), s=6, color="0.85", zorder=0)
    biggest = float(circuit.score.abs().max()) or 1.0

    def width(size: float) -> float:
        return 0.8 + 4.0 * size / biggest

    for r in circuit.itertuples():
        colour = EDGE_COLOURS["lowers" if r.score < 0 else "raises"]
        straight = pos[r.sender][0] == pos[r.receiver][0]
        ax.add_patch(FancyArrowPatch(pos[r.sender], pos[r.receiver], arrowstyle="-|>", mutation_scale=8,
                                     connectionstyle="arc3,rad=0" if straight else "arc3,rad=0.12",
                                     lw=width(abs(r.score)), color=colour, alpha=0.75, shrinkA=6, shrinkB=6,
                                     zorder=1))
    for n, (x, y) in pos.items():
        ax.scatter([x], [y], s=70, color="white", edgecolor="black", lw=1.2, zorder=2)
        head = head_of(n)
        label = head_name(*head) if head else {"input": "embeddings", "output": "output"}.get(n, f"MLP {n[1:]}")
        ax.annotate(label, (x, y), xytext=(6, 5), textcoords="offset points", fontsize=7.5, ha="left",
                    va="bottom", zorder=3, bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none",
                                                 "alpha": 0.85})
    ax.set_yticks(range(len(rows)), rows, fontsize=7.5)
    ax.set_xticks([*range(n_heads), n_heads + 0.5], [*map(str, range(n_heads)), "MLP"], fontsize=7.5)
    ax.set_xlabel("head (attention rows); MLPs in the right-hand column", fontsize=8)
    ax.set_xlim(-2.3, n_heads + 1.6)
    ax.set_ylim(-0.6, len(rows) - 0.3)
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.grid(axis="y", color="0.93", lw=0.6, zorder=-1)
    m = circuit.iloc[0]
    toward = float(m.m_empty) < float(m.m_full)  # corrupted below clean: lowering the metric is the corrupted way
    colours = [Line2D([], [], color=EDGE_COLOURS["lowers"], lw=2.5,
                      label="score < 0: corrupting the edge lowers the metric" + (" (toward the corrupted run)"
                                                                                  if toward else "")),
               Line2D([], [], color=EDGE_COLOURS["raises"], lw=2.5,
                      label="score > 0: corrupting the edge raises the metric" + ("" if toward else
                                                                                  " (toward the corrupted run)"))]
    sizes = [Line2D([], [], color="0.3", lw=width(f * biggest), label=f"|score| = {f * biggest:.2g}")
             for f in (1.0, 0.5, 0.1)]
    ax.legend(handles=colours + sizes, loc="upper center", bbox_to_anchor=(0.5, -0.08), fontsize=7.5, frameon=False,
              title_fontsize=8, title=f"edge colour: the sign of its {method.upper()} score (the estimated change of "
              "the metric when only that edge is corrupted);\nedge width: the size of the score")
    n_head = sum(head_of(n) is not None for n in nodes)
    n_mlp = len(nodes) - n_head - len({"input", "output"} & set(nodes))
    ax.set_title(f"Circuit found by greedy pruning: {len(circuit)} edges, {n_head} head(s), {n_mlp} MLP(s)\n"
                 f"faithfulness {float(m.faithfulness):.2f} (metric: full model {float(m.m_full):.3f}, circuit "
                 f"alone {float(m.m_circuit):.3f}, corrupted run {float(m.m_empty):.3f})", fontsize=9)
    return io.save_figure(fig, out_dir / "fig_circuit", formats)


def plot_faithfulness(curve: pd.DataFrame, areas: pd.DataFrame | None, out_dir: Path,
                      formats: Formats = FORMATS) -> list[Path]:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for name, part in curve.groupby("ordering", sort=False):
        ours = name == "scores"
        label = "top edges by score" if ours else ("random edge orders" if name == "random0" else None)
        ax.plot(part.percent, part.faithfulness, marker="o" if ours else None, color="black" if ours else "grey",
                lw=1.5 if ours else 0.8, label=label)
    ax.axhline(1.0, color="black", lw=0.5, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("% of edges kept")
    ax.set_ylabel("faithfulness")
    if areas is not None and not areas.empty:
        a = areas[areas.ordering == "scores"].iloc[0]
        ax.set_title(f"Faithfulness curve (CPR {a.cpr:.2f}, CMD {a.cmd:.2f})", fontsize=10)
    ax.legend(fontsize=8)
    return io.save_figure(fig, out_dir / "fig_faithfulness", formats)
