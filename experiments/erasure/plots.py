"""Figures of the erasure experiment, drawn from the saved tables only (``results``, ``probing``). Layer 0 =
embedding output, layer k = output of block k."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def plot(out_dir: Path) -> list[Path]:
    """Every figure of the experiment from the tables in ``out_dir``; returns the written files."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    path = Path(out_dir) / "results.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; run `bertscope run erasure` first")
    results = pd.read_parquet(path)
    written = _uuas(results, Path(out_dir)) + _probes(results, Path(out_dir))
    if (Path(out_dir) / "probing.parquet").is_file():
        written += _probing(pd.read_parquet(Path(out_dir) / "probing.parquet"), Path(out_dir))
    return written


def _uuas(r: pd.DataFrame, out_dir: Path) -> list[Path]:
    import matplotlib.pyplot as plt
    from bertscope.experiments.io import save_figure

    u = r[(r["measure"] == "uuas") & (r["method"] != "none")]
    if u.empty:
        return []
    concepts = list(dict.fromkeys(u["concept"]))
    fig, axes = plt.subplots(1, len(concepts), figsize=(3.6 * len(concepts), 3.2), sharey=True, squeeze=False)
    for ax, concept in zip(axes[0], concepts, strict=True):
        g = u[u["concept"] == concept]
        for i, ((layer, method, rank), h) in enumerate(g.groupby(["erase_layer", "method", "rank"], sort=False)):
            h = h.sort_values("layer")
            style = "--" if method == "random" else "-"
            ax.plot(h["layer"], h["delta"], style, marker="o", ms=3, label=f"L{layer} {method} (rank {rank})",
                    color=f"C{i % 10}")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_title(f"erase {concept}")
        ax.set_xlabel("layer")
    axes[0][0].set_ylabel("UUAS change from clean")
    axes[0][-1].legend(fontsize=6, loc="lower left")
    fig.suptitle("Erasing a concept at one layer: what happens to the parse tree downstream")
    fig.tight_layout()
    out = save_figure(fig, out_dir / "erasure_uuas")
    plt.close(fig)
    return out


def _probes(r: pd.DataFrame, out_dir: Path) -> list[Path]:
    import matplotlib.pyplot as plt
    from bertscope.experiments.io import save_figure

    last = int(r["layer"].max())
    p = r[(r["measure"] == "probe_accuracy") & (r["method"] != "none") & (r["layer"] == last)]
    if p.empty:
        return []
    groups = list(p.groupby(["concept", "erase_layer", "method", "rank"], sort=False))
    targets = list(dict.fromkeys(p["target"]))
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(groups)), 3.6))
    width = 0.8 / len(targets)
    for j, t in enumerate(targets):
        xs, ys, lo, hi = [], [], [], []
        for i, (_, g) in enumerate(groups):
            row = g[g["target"] == t]
            if len(row):
                xs.append(i + j * width)
                ys.append(float(row["delta"].iloc[0]))
                lo.append(ys[-1] - float(row["delta_ci_low"].iloc[0]))
                hi.append(float(row["delta_ci_high"].iloc[0]) - ys[-1])
        ax.bar(xs, ys, width, yerr=[lo, hi], label=t, color=f"C{j}", error_kw={"lw": 0.6})
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))])
    ax.set_xticklabels([f"{c} L{layer}\n{m} r{rank}" for (c, layer, m, rank), _ in groups], rotation=90, fontsize=6)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_ylabel(f"layer-{last} probe accuracy change")
    ax.set_title("Clean probes read the erased run (erased concept, method, rank)")
    ax.legend(fontsize=7, title="probed")
    fig.tight_layout()
    out = save_figure(fig, out_dir / "erasure_probes")
    plt.close(fig)
    return out


def _probing(p: pd.DataFrame, out_dir: Path) -> list[Path]:
    import matplotlib.pyplot as plt
    from bertscope.experiments.io import save_figure

    if "component" in p:  # the residual stream per layer (sublayer outputs are in the table, not drawn)
        p = p[p["component"].isin(["embed", "resid_post"])]
    if p.empty:
        return []
    targets = list(dict.fromkeys(p["target"]))
    fig, axes = plt.subplots(1, len(targets), figsize=(3.2 * len(targets), 3.0), sharey=True, squeeze=False)
    for ax, t in zip(axes[0], targets, strict=True):
        g = p[p["target"] == t]
        for label, color in (("task", "C0"), ("control", "C1"), ("selectivity", "C2")):
            h = g[g["label"] == label].sort_values("layer")
            ax.plot(h["layer"], h["value"], marker="o", ms=3, color=color, label=label)
            ax.fill_between(h["layer"], h["ci_low"], h["ci_high"], color=color, alpha=0.2)
        ax.axhline(float(g["majority"].iloc[0]), color="grey", ls=":", lw=0.8, label="majority")
        ax.set_title(t)
        ax.set_xlabel("layer")
    axes[0][0].set_ylabel("accuracy (evaluation sentences)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("Word-level probes with control tasks")
    fig.tight_layout()
    out = save_figure(fig, out_dir / "erasure_probing")
    plt.close(fig)
    return out
