"""Figures of the `minimal-pairs` experiment, drawn from the saved tables only (no model): accuracy per paradigm,
accuracy per layer through the logit lens, and raw against length-normalised scores."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from bertscope.experiments import io
from bertscope.experiments.io import read_table
from bertscope.experiments.minimal_pairs.measures import CHANCE, DIFFERENCE

FORMATS = tuple(io.FIGURE_FORMATS)
Formats = tuple[str, ...]
#: Colour per score (colour-blind safe pair) and per field (tab10 order).
SCORE_COLOURS = {"raw": "#1b6ca8", "normalised": "#d95f02"}
SCORE_LABELS = {"raw": "raw PLL (sum over pieces)", "normalised": "PLL per piece (length-normalised)"}


def main_method(table: pd.DataFrame) -> str:
    """The method the single-method figures show: ``original`` (Salazar et al.) when present."""
    methods = list(dict.fromkeys(table["method"]))
    return "original" if "original" in methods else methods[0]


def plot(out_dir: Path, formats: Formats | None = None) -> list[Path]:
    """Every figure the saved tables allow; returns the written paths."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    formats = tuple(formats or FORMATS)
    out_dir = Path(out_dir)
    paths: list[Path] = []
    accuracy = read_table(out_dir, "accuracy")
    if accuracy is not None and not accuracy.empty:
        paths += plot_paradigms(accuracy, out_dir, formats)
    layers = read_table(out_dir, "layers")
    if layers is not None and not layers.empty:
        paths += plot_layers(layers, out_dir, formats)
    control = read_table(out_dir, "length_control")
    if accuracy is not None and control is not None and not control.empty:
        paths += plot_raw_vs_normalised(accuracy, control, out_dir, formats)
    return paths


def _wide(table: pd.DataFrame, index: list[str]) -> pd.DataFrame:
    """Raw and normalised side by side: ``accuracy_raw``, ``low_raw``, ..., ``high_normalised``."""
    wide = table.pivot_table(index=index, columns="score", values=["accuracy", "low", "high"])
    wide.columns = [f"{a}_{b}" for a, b in wide.columns]
    return wide.reset_index()


def plot_paradigms(accuracy: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS) -> list[Path]:
    """Accuracy per paradigm (sorted by raw accuracy), raw with its interval and normalised beside it."""
    import matplotlib.pyplot as plt

    method = main_method(accuracy)
    rows = accuracy[(accuracy["method"] == method) & (accuracy["level"] == "paradigm")]
    if rows.empty:
        return []
    wide = _wide(rows, ["group"]).sort_values("accuracy_raw", ignore_index=True)
    y = np.arange(len(wide))
    fig, ax = plt.subplots(figsize=(7.0, 1.4 + 0.17 * len(wide)), layout="constrained")
    for score, shift in (("raw", 0.15), ("normalised", -0.15)):
        value = wide[f"accuracy_{score}"].to_numpy()
        err = np.abs(np.stack([value - wide[f"low_{score}"], wide[f"high_{score}"] - value]))
        ax.errorbar(value, y + shift, xerr=err, fmt="o", ms=3.5, lw=1, color=SCORE_COLOURS[score],
                    label=SCORE_LABELS[score])
    ax.axvline(CHANCE, color="grey", ls="--", lw=1, label="chance (0.5)")
    ax.set_yticks(y, wide["group"].str.replace("_", " "), fontsize=7 if len(wide) > 20 else 9)
    ax.set_ylim(-0.7, len(wide) - 0.3)
    ax.set_xlim(-0.02, 1.02)
    ax.set_xlabel("accuracy: share of pairs where the good sentence scores higher")
    fig.legend(*ax.get_legend_handles_labels(), fontsize=8, loc="outside lower center", ncols=3, frameon=False)
    ax.set_title(f"Accuracy per paradigm ({method} PLL; bars: 95% intervals over pairs)", fontsize=10)
    return io.save_figure(fig, out_dir / "fig_paradigm_accuracy", formats)


def plot_layers(layers: pd.DataFrame, out_dir: Path, formats: Formats = FORMATS) -> list[Path]:
    """Raw accuracy per stream through the logit lens: overall (black) and per field, one panel per method."""
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(layers["method"]))
    raw = layers[(layers["score"] == "raw") & layers["level"].isin(("overall", "field"))]
    fig, axes = plt.subplots(1, len(methods), figsize=(4.4 * len(methods), 3.6), squeeze=False, sharey=True,
                             layout="constrained")  # fmt: skip
    colours = plt.get_cmap("tab10")
    for ax, method in zip(axes[0], methods, strict=True):
        rows = raw[raw["method"] == method]
        groups = [("overall", "all")] + [("field", g) for g in sorted(rows.loc[rows["level"] == "field", "group"]
                                                                      .unique()) if g != "all"]
        for k, (level, group) in enumerate(groups):
            line = rows[(rows["level"] == level) & (rows["group"] == group)].sort_values("stream")
            colour = "black" if level == "overall" else colours(k - 1)
            label = "all pairs" if level == "overall" else group  # the file's own labels
            ax.plot(line["stream"], line["accuracy"], marker="o", ms=4, color=colour, lw=2 if k == 0 else 1.2,
                    label=label)
            ax.fill_between(line["stream"], line["low"], line["high"], color=colour, alpha=0.12, lw=0)
        ax.axhline(CHANCE, color="grey", ls="--", lw=1, label="chance (0.5)")
        streams = sorted(rows["stream"].unique())
        ax.set_xticks(streams, ["emb" if s == 0 else str(s) for s in streams])
        ax.set_title(f"{method} PLL", fontsize=10)
        ax.set_ylim(-0.02, 1.02)
    axes[0][0].set_ylabel("accuracy (good sentence scores higher)")
    fig.legend(*axes[0][0].get_legend_handles_labels(), fontsize=8, loc="outside right center", frameon=False)
    fig.supxlabel("layer read through the logit lens (emb = the embeddings; the last = the model's own output)",
                  fontsize=9)
    fig.suptitle("From which layer on is the good sentence preferred? (shading: 95% intervals over pairs)",
                 fontsize=10)
    return io.save_figure(fig, out_dir / "fig_layer_accuracy", formats)


def plot_raw_vs_normalised(accuracy: pd.DataFrame, control: pd.DataFrame, out_dir: Path,
                           formats: Formats = FORMATS) -> list[Path]:
    """Left: each paradigm's raw against normalised accuracy. Right: accuracy by whether the bad sentence has
    more, as many or fewer pieces than the good one, raw and normalised, with intervals."""
    import matplotlib.pyplot as plt

    method = main_method(accuracy)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 4.0), layout="constrained")
    rows = accuracy[(accuracy["method"] == method) & (accuracy["level"] == "paradigm")]
    if not rows.empty:
        wide = _wide(rows, ["group"])
        left.scatter(wide["accuracy_raw"], wide["accuracy_normalised"], s=16, color="#444444")
    left.plot([0, 1], [0, 1], color="grey", lw=1, ls=":", label="equal")
    left.axvline(CHANCE, color="grey", ls="--", lw=0.8)
    left.axhline(CHANCE, color="grey", ls="--", lw=0.8)
    left.set(xlim=(-0.02, 1.02), ylim=(-0.02, 1.02), xlabel="raw PLL accuracy", ylabel="PLL-per-piece accuracy")
    left.set_title("Each paradigm: raw against length-normalised", fontsize=10)
    part = control[(control["method"] == method) & (control["unit"] == "pieces")]
    order = [d for d in DIFFERENCE.values() if d in set(part["difference"])]
    x = np.arange(len(order))
    for score, shift in (("raw", -0.18), ("normalised", 0.18)):
        bars = part[part["score"] == score].set_index("difference").reindex(order)
        err = np.abs(np.stack([bars["accuracy"] - bars["low"], bars["high"] - bars["accuracy"]]))
        drawn = right.bar(x + shift, bars["accuracy"], width=0.34, color=SCORE_COLOURS[score], yerr=err, capsize=3,
                          label=SCORE_LABELS[score])
        right.bar_label(drawn, fmt="%.2f", fontsize=7, padding=2)
    counts = part.drop_duplicates("difference").set_index("difference").reindex(order)["n_pairs"]
    labels = [f"{d}\n({int(n):,} pair{'s' if n != 1 else ''})" for d, n in zip(order, counts, strict=True)]
    right.set_xticks(x, labels, fontsize=8)
    right.axhline(CHANCE, color="grey", ls="--", lw=1, label="chance (0.5)")
    right.set(ylim=(0, 1.12), ylabel="accuracy (good sentence scores higher)")
    right.set_title("By word pieces of the bad sentence vs the good one", fontsize=10)
    right.legend(fontsize=7, loc="upper right", framealpha=0.9)
    fig.suptitle(f"Does sentence length decide the pair? ({method} PLL)", fontsize=10)
    return io.save_figure(fig, out_dir / "fig_raw_vs_normalised", formats)
