"""The positions experiment's findings and figure captions, generated from its saved tables only.

`findings(out_dir)` reads ``summary_absolute.csv``, ``capacity_sweep.csv`` and ``results.parquet`` under
``out_dir`` (the experiment's folder) and formats every number it states from them; `CAPTIONS` maps each
figure's file stem to what it shows and how to read it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from bertscope.experiments.findings import Finding, fmt_ci

CAPTIONS: dict[str, str] = {
    "fig_absolute_vs_layer": "Absolute position read by a linear probe from each layer (x: word embedding, "
    "embedding output, then the output of each layer). Blue: accuracy of the position class in fixed-length "
    "windows; red dashed: the control task (a random label per word-piece type) with its memorisation ceiling "
    "(red dotted: the share of test tokens whose type was seen in training); green: word order shuffled; grey "
    "dotted: the same model with its position embeddings zeroed (the null). Bands are 95% intervals (windows, "
    "and for the headline rows also the repeated folds and control labels). Lower right: natural sentences.",
    "fig_selectivity_vs_layer": "Selectivity (task minus control task, Hewitt & Liang 2019) per layer for the "
    "position class (accuracy) and the position regression (R^2), in windows and in natural sentences; 0 means "
    "the probe does no better on position than on memorised word identity.",
    "fig_capacity_sweep": "Capacity sweep: task accuracy, control accuracy and selectivity as the probe's L2 "
    "strength grows (right = less capacity), at the embedding output and the last layer. The dashed vertical "
    "line is the operating point chosen by selectivity on separate tuning windows (never on the windows shown); "
    "the dotted line is the control task's memorisation ceiling.",
    "fig_relative_vs_layer": "Relative order of two pieces of one window (is j before i; the log2 distance "
    "bucket) from the pair [h_i; h_j] and from h_i - h_j, per layer, with the control task, shuffled order and "
    "the zeroed-position null.",
    "fig_probe_free_vs_layer": "Probe-free measures per layer: share of hidden-state variance explained by "
    "position (noise-corrected) and linear CKA with the position embeddings of the tokens' positions; the "
    "baselines permute positions inside each window, shuffle word order, or zero the position embeddings.",
    "fig_specials_vs_layer": "[CLS] and the final [SEP] in natural sentences: ridge R^2 of the [SEP]'s position "
    "and of the sentence length read from [CLS], per layer (alpha chosen by nested CV inside each training "
    "split), with word order shuffled as a baseline.",
    "fig_mdl_vs_layer": "MDL (Voita & Titov 2020): compression = uniform codelength / online codelength of "
    "absolute position (blue) and of its control task (red) per layer; 1 (dotted) is no better than a uniform "
    "code. Alpha is chosen per block from the already-transmitted prefix only.",
    "fig_confusion": "True against predicted position (row-normalised) of the position probe at three layers; "
    "a bright diagonal is exact decoding, a band around it is approximate position.",
    "fig_position_table": "The learned position-embedding table: its first principal components against "
    "position (left) and the cosine similarity between positions (right).",
}


def findings(out_dir: Path) -> list[Finding]:
    """The sentences the report states for this experiment, from the tables in ``out_dir``."""
    out_dir = Path(out_dir)
    summary_path = out_dir / "summary_absolute.csv"
    if not summary_path.is_file():
        return []
    summary = pd.read_csv(summary_path)
    out: list[Finding] = []
    embed = _row(summary, "embed.hook_out")
    last = summary.iloc[-1]
    if embed is not None:
        null_hi = float(np.nanmax([last.get("zeroed_accuracy_ci_high", np.nan), last["chance"]]))
        above = bool(last["accuracy_ci_low"] > null_hi and embed["accuracy_ci_low"] > null_hi)
        # "which the layers keep": above the null everywhere, and at least half the input's accuracy above chance
        holds = (True if _kept(embed, last) >= 0.5 else None) if above else False
        verdict = {True: "holds", None: "holds only in part", False: "does not hold"}[holds]
        out.append(Finding(
            f"The position claim {verdict} on this model: a linear probe reads the absolute position of a word "
            f"piece in windows of {int(_n(summary))} pieces with accuracy {_ci(embed, 'accuracy')} at the embedding "
            f"output and {_ci(last, 'accuracy')} after the last layer, against chance {last['chance']:.3f} and "
            f"{_null(last)} "
            f"(intervals cover {_covers(last)}); the last layer keeps {_kept(embed, last):.0%} of the embedding "
            "output's accuracy above chance.",
            claim="position", holds=holds,
            numbers={"accuracy_embed": float(embed["accuracy"]), "accuracy_last": float(last["accuracy"]),
                     "chance": float(last["chance"]), "zeroed_last": float(last["zeroed_accuracy"])},
        ))  # fmt: skip
        if "control_accuracy" in last and np.isfinite(float(last["control_accuracy"])):
            out.append(Finding(
                f"At the accuracy-tuned L2 (alpha {float(last['alpha']):g}) the control task (a random label per "
                f"word-piece type) reaches {_ci(last, 'control_accuracy')} after the last layer against a "
                f"memorisation ceiling of {float(last['memorisation_ceiling']):.3f} (the share of test tokens whose "
                f"type was seen in training), {_reading(last)}; selectivity there is {_ci(last, 'selectivity')}.",
                numbers={"control_last": float(last["control_accuracy"]),
                         "ceiling": float(last["memorisation_ceiling"]),
                         "selectivity_last": float(last["selectivity"])},
            ))  # fmt: skip
        if np.isfinite(float(last["zeroed_accuracy"])):
            out.append(Finding(
                "The random-weights baseline was dropped: its random position table passes straight through the "
                "residual stream, so it decodes position perfectly at every layer and is no floor; the trained "
                f"model with its position embeddings zeroed is the null instead ({_ci(last, 'zeroed_accuracy')} "
                "after the last layer).",
                numbers={"zeroed_last": float(last["zeroed_accuracy"])},
            ))  # fmt: skip
    out.extend(_sweep_and_mdl(out_dir))
    return out


def _sweep_and_mdl(out_dir: Path) -> list[Finding]:
    """The capacity-sweep and MDL sentences, from ``capacity_sweep.csv`` and ``results.parquet``."""
    out: list[Finding] = []
    sweep_path = out_dir / "capacity_sweep.csv"
    if sweep_path.is_file():
        sweep = pd.read_csv(sweep_path)
        chosen = sweep[sweep["chosen"].astype(bool)]
        if len(chosen):
            c = chosen.iloc[-1]
            out.append(Finding(
                f"At the capacity chosen by selectivity on the tuning windows (alpha {c['alpha']:g}), "
                f"the probe {_where(c['site'])} reaches accuracy {_ci(c, 'accuracy')}, control accuracy "
                f"{_ci(c, 'control_accuracy')} against a memorisation ceiling of {c['memorisation_ceiling']:.3f}, "
                f"and selectivity {_ci(c, 'selectivity')}; across the sweep selectivity ranges "
                f"{sweep['selectivity'].min():.2f} to {sweep['selectivity'].max():.2f}.{_edge(sweep, c)}",
                numbers={"alpha": float(c["alpha"]), "selectivity": float(c["selectivity"]),
                         "control_accuracy": float(c["control_accuracy"]),
                         "ceiling": float(c["memorisation_ceiling"])},
            ))  # fmt: skip
    results_path = out_dir / "results.parquet"
    if results_path.is_file():
        res = pd.read_parquet(results_path, columns=["probe", "control", "metric", "site", "value"])
        mdl = res[(res["probe"] == "mdl") & (res["metric"] == "compression")]
        task, ctl = mdl[mdl["control"] == "none"], mdl[mdl["control"] == "control_task"]
        if len(task):
            lo = task.loc[task["value"].idxmin()]
            out.append(Finding(
                f"MDL compression of position ranges {task['value'].min():.2f} ({_site_name(lo['site'])}) to "
                f"{task['value'].max():.2f} across sites, against {ctl['value'].min():.2f} to "
                f"{ctl['value'].max():.2f} for the control task (1 = no better than a uniform code).",
                numbers={"compression_min": float(task["value"].min()), "compression_max": float(task["value"].max()),
                         "control_min": float(ctl["value"].min()) if len(ctl) else float("nan")},
            ))  # fmt: skip
    return out


def _null(last: pd.Series) -> str:
    """The zeroed-position null in words, or why there is none."""
    if np.isfinite(float(last["zeroed_accuracy"])):
        return f"{_ci(last, 'zeroed_accuracy')} for the same model with its position embeddings zeroed"
    return "no zeroed-position null (the model adds no position embeddings)"


def _edge(sweep: pd.DataFrame, chosen: pd.Series) -> str:
    """A warning when the chosen capacity is the grid's end (selectivity had no peak inside the grid)."""
    if float(chosen["alpha"]) < float(sweep["alpha"].max()):
        return ""
    return (" The chosen L2 is the strongest in the grid: selectivity still rises there, because the control "
            "task falls towards its majority class while position, whose classes are balanced in every window, "
            "stays readable; the choice is bounded by the grid, not a peak.")


def _row(df: pd.DataFrame, site: str) -> pd.Series | None:
    hit = df[df["site"] == site]
    return None if hit.empty else hit.iloc[0]


def _ci(row: pd.Series, prefix: str) -> str:
    return fmt_ci(float(row[prefix]), float(row[f"{prefix}_ci_low"]), float(row[f"{prefix}_ci_high"]), digits=3)


def _kept(embed: pd.Series, last: pd.Series) -> float:
    """(last - chance) / (embedding output - chance): the share of the input's position accuracy kept."""
    chance = float(last["chance"])
    return (float(last["accuracy"]) - chance) / max(float(embed["accuracy"]) - chance, 1e-12)


def _reading(row: pd.Series) -> str:
    """How to read selectivity given how close control accuracy is to its memorisation ceiling."""
    if float(row["control_accuracy"]) >= 0.8 * float(row["memorisation_ceiling"]):
        return "close to full memorisation, so selectivity at this L2 mostly measures word identity"
    return "well below full memorisation, so selectivity at this L2 is not just word identity"


def _covers(row: pd.Series) -> str:
    """The variance an interval covers, in words (``ci_covers`` and ``repeats`` of a summary row)."""
    covers = str(row.get("ci_covers", ""))
    if covers == "groups+repeats":
        return f"window resampling and {int(row.get('repeats', 0))} repeated fold / control-label seeds"
    return {"groups": "window resampling"}.get(covers, covers)


def _n(summary: pd.DataFrame) -> float:
    return round(1 / float(summary["chance"].iloc[0])) if float(summary["chance"].iloc[0]) > 0 else float("nan")


def _where(site: str) -> str:
    """``after layer 5`` / ``at the embedding output`` (blocks from 0, ``naming``)."""
    name = _site_name(site)
    return name if name.startswith("after") else f"at the {name}"


def _site_name(site: str) -> str:
    from bertscope.experiments.positions.plots import site_title

    return site_title(site)
