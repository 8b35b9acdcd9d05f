"""Figures of the `circuits` experiment, drawn from the saved tables only (no model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from bertscope.experiments import io
from bertscope.hooks.circuits import table
from bertscope.hooks.naming import head_of

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
        paths += plot_circuit(circuit, out_dir, formats)
    curve = read_table(out_dir, "faithfulness")
    if curve is not None:
        paths += plot_faithfulness(curve, read_table(out_dir, "areas"), out_dir, formats)
    return paths


def read_table(out_dir: Path, name: str) -> pd.DataFrame | None:
    """``out_dir/name.parquet`` (or .csv), None when absent."""
    for suffix in (".parquet", ".csv"):
        path = Path(out_dir) / f"{name}{suffix}"
        if path.is_file():
            return pd.read_parquet(path) if suffix == ".parquet" else pd.read_csv(path)
    return None


def plot_head_maps(results: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS) -> list[Path]:
    import matplotlib.pyplot as plt

    present = set(results.method)  # the table's order, then any method no longer registered
    methods = [m for m in table.node_methods() if m in present] + sorted(present - set(table.node_methods()))
    n_layers, n_heads = int(results.layer.max()) + 1, int(results["head"].max()) + 1
    grids = {m: results[results.method == m].pivot_table(index="layer", columns="head", values="normalised")
             .reindex(index=range(n_layers), columns=range(n_heads)).to_numpy() for m in methods}
    vmax = max(float(np.nanmax(np.abs(g))) for g in grids.values()) or 1.0
    # constrained layout and one shared "layer" axis: the title and each panel's labels never overlap a neighbour
    fig, axes = plt.subplots(1, len(methods), figsize=(3.2 * len(methods), 3.0), squeeze=False, sharey=True,
                             layout="constrained")  # fmt: skip
    for ax, m in zip(axes[0], methods, strict=True):
        im = ax.imshow(grids[m], cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="auto")
        ax.set_title(table.label(m), fontsize=9)
        ax.set_xlabel("head")
    axes[0][0].set_ylabel("layer")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="share of the clean-to-corrupted change")
    fig.suptitle("Head effects on the term-frequency signal (TFC1)", fontsize=10)
    return io.save_figure(fig, out_dir / "fig_head_maps", formats)


def _position(node: str, n_layers: int) -> tuple[float, float]:
    if node == "input":
        return 0.0, -1.0
    if node == "output":
        return 0.0, 2 * n_layers
    if node.startswith("m"):
        return 7.0, 2 * int(node[1:]) + 1
    layer, head = head_of(node)
    return int(head) - 5.5, 2 * int(layer)


def plot_circuit(circuit: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS) -> list[Path]:
    import matplotlib.pyplot as plt

    nodes = sorted(set(circuit.sender) | set(circuit.receiver))
    layers = [head_of(n)[0] if head_of(n) else int(n[1:]) for n in nodes if head_of(n) or n.startswith("m")]
    n_layers = (max(layers) + 1) if layers else 1
    pos = {n: _position(n, n_layers) for n in nodes}
    fig, ax = plt.subplots(figsize=(7, 1.0 + 0.6 * n_layers))
    biggest = float(circuit.score.abs().max()) or 1.0
    for r in circuit.itertuples():
        (x0, y0), (x1, y1) = pos[r.sender], pos[r.receiver]
        ax.plot([x0, x1], [y0, y1], color="tab:red" if r.score < 0 else "tab:blue",
                lw=0.5 + 3 * abs(r.score) / biggest, alpha=0.7, zorder=1)
    for n, (x, y) in pos.items():
        ax.scatter([x], [y], s=120, color="white", edgecolor="black", zorder=2)
        ax.annotate(n, (x, y), fontsize=7, ha="center", va="center", zorder=3)
    ax.set_axis_off()
    f = float(circuit.faithfulness.iloc[0])
    ax.set_title(f"Circuit: {len(circuit)} edges, faithfulness {f:.2f}", fontsize=10)
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
