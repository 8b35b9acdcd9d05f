"""The long tables of the heads experiment, from the passes' arrays (``data``) and ``Settings``: plain arrays in,
pandas long tables out (the template's ``measures`` role). Topic modules hold the measures themselves
(``statistics``, ``syntax``, ``importance``, ``gradients``, ``similarity``, ``roles``); this module turns their
per-sentence arrays into the rows of ``results`` and the side tables, with bootstrap intervals over sentences."""

from __future__ import annotations

from typing import Any

import einops
import numpy as np
import pandas as pd
from bertscope.experiments.heads import gradients as grads
from bertscope.experiments.heads import importance as imp
from bertscope.experiments.heads import similarity as sim
from bertscope.experiments.heads import statistics as hs
from bertscope.experiments.heads import syntax as syn
from bertscope.experiments.heads.data import SCALARS
from bertscope.experiments.naming import head_name
from bertscope.probes.bootstrap import group_bootstrap, mean_of_groups

RESULT_COLUMNS = ["model", "corpus", "layer", "head", "metric", "value", "ci_low", "ci_high", "n"]


def attention_table(scalars: np.ndarray, offsets: np.ndarray, settings: Any, seed: int = 0) -> pd.DataFrame:
    """Long rows ``layer, head, metric, value, ci_low, ci_high, n`` from per-sentence statistics.

    Args:
        scalars: ``[sentence, layer, head, metric]`` in the order ``SCALARS``.
        offsets: ``[sentence, layer, head, 2 * max_offset + 1]`` argmax-offset fractions.
    """
    offsets = offsets.astype(np.float64)
    n_layers, n_heads = scalars.shape[1:3]
    rows = [rows_from(scalars, list(SCALARS), settings, seed)]
    max_offset = (offsets.shape[-1] - 1) // 2
    k = settings.offset_bins
    if max_offset <= k:  # short sentences: pad so that the reported bins and both tails exist
        offsets = np.pad(offsets, [(0, 0)] * 3 + [(k + 1 - max_offset,) * 2])
        max_offset = k + 1
    centre = offsets[..., max_offset - k : max_offset + k + 1]
    below = offsets[..., : max_offset - k].sum(-1, keepdims=True)
    above = offsets[..., max_offset + k + 1 :].sum(-1, keepdims=True)
    hist = np.concatenate([below, centre, above], axis=-1)
    names = [f"argmax_offset<{-k}", *(f"argmax_offset={o}" for o in range(-k, k + 1)), f"argmax_offset>{k}"]
    rows.append(rows_from(hist, names, settings, seed))
    # Most frequent argmax offset (over all offsets, not only the reported bins) and its share.
    top_bin = offsets.mean(0).argmax(-1)  # [layer, head]
    index = np.broadcast_to(top_bin[None, ..., None], (len(offsets), n_layers, n_heads, 1))
    share = np.take_along_axis(offsets, index, -1)
    rows.append(rows_from(share, ["top_offset_fraction"], settings, seed))
    layer, head = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    rows.append(pd.DataFrame({"layer": layer.ravel(), "head": head.ravel(), "metric": "top_offset",
                              "value": (top_bin - max_offset).ravel().astype(float), "n": len(offsets)}))  # fmt: skip
    return pd.concat(rows, ignore_index=True)


def head_stats_wide(results: pd.DataFrame) -> pd.DataFrame:
    """Wide table (one row per head: ``layer, head`` and one column per metric) of what the role rules read."""
    wanted = [*hs.MASS_METRICS, "entropy_ratio", "top_offset", "top_offset_fraction"]
    sel = results[results["metric"].isin(wanted) & results["head"].notna()]
    wide = sel.pivot_table(index=["layer", "head"], columns="metric", values="value").reset_index()
    wide.columns.name = None
    return wide.astype({"layer": int, "head": int})


def ratio_rows(distances: np.ndarray, n_layers: int, n_heads: int, settings: Any, seed: int) -> pd.DataFrame:
    """Within/between-layer distance ratio, overall and per layer, bootstrapped over sentences."""
    layer_of = np.repeat(np.arange(n_layers), n_heads)
    s = len(distances)
    flat = distances.reshape(s, -1).astype(np.float64)
    point = sim.within_between_ratio(distances.mean(0), layer_of)  # from the mean_distance of distances.parquet

    def ratios(counts: np.ndarray) -> np.ndarray:  # [m, sentence] -> [m, key]
        means = (counts @ flat / s).reshape(-1, *distances.shape[1:])
        return np.asarray([list(sim.within_between_ratio(m, layer_of).values()) for m in means])

    out = group_bootstrap(ratios, s, n_boot=settings.n_boot, level=settings.ci, seed=seed)
    return pd.DataFrame([
        {"layer": key, "head": None, "metric": "within_between_distance_ratio", "value": point[key],
         "ci_low": out.low[i], "ci_high": out.high[i], "n": s}
        for i, key in enumerate(point)
    ])  # fmt: skip


def syntax_rows(acc: pd.DataFrame) -> pd.DataFrame:
    """Head-by-relation accuracies as ``results`` rows (``syntax:<relation>:<direction>``)."""
    out = acc.assign(metric="syntax:" + acc["relation"] + ":" + acc["direction"], value=acc["accuracy"])
    return out[["layer", "head", "metric", "value", "n"]]


def importance_rows(importance: dict[str, np.ndarray], settings: Any, seed: int) -> pd.DataFrame:
    """Ablation effects and gradient importance per head with intervals, and their rank correlations."""
    effects = importance["effects"]  # [sentence, method, layer, head, measure]
    methods, measures = importance["methods"].tolist(), importance["measures"].tolist()
    flat = einops.rearrange(effects, "s a l h m -> s l h (a m)")
    names = [f"ablation:{a}:{m}" for a in methods for m in measures]
    objective = str(importance["objective"])
    rows = [rows_from(flat, names, settings, seed)]
    if objective == "mlm":  # Michel et al.: pooled over tokens, L2-normalised per layer
        rows.append(michel_rows(importance["michel_sums"], importance["michel_tokens"], settings, seed))
    else:
        rows.append(rows_from(importance["grad"][..., None], [f"grad_importance:{objective}"], settings, seed))
    grad_mean = importance["grad"].mean(0)
    for a in methods:
        for m in measures:
            effect_mean = effects[:, methods.index(a), :, :, measures.index(m)].mean(0)
            rows.append(pd.DataFrame([{
                "layer": None, "head": None, "metric": f"spearman:grad_importance:{objective}~ablation:{a}:{m}",
                "value": imp.spearman(grad_mean, effect_mean), "n": effects.shape[0],
            }]))  # fmt: skip
    return pd.concat(rows, ignore_index=True)


def michel_rows(sums: np.ndarray, tokens: np.ndarray, settings: Any, seed: int) -> pd.DataFrame:
    """``grad_importance:mlm`` per head: Michel et al.'s score with a bootstrap over sentences (normalised in
    every replicate)."""
    s, shape = len(tokens), sums.shape[1:]
    flat = sums.reshape(s, -1)

    def score(counts: np.ndarray) -> np.ndarray:  # [m, sentence] -> [m, layer*head]
        pooled = (counts @ flat) / (counts @ tokens)[:, None]
        return grads.michel_normalise(pooled.reshape(-1, *shape)).reshape(len(counts), -1)

    out = group_bootstrap(score, s, n_boot=settings.n_boot, level=settings.ci, seed=seed)
    point, low, high = (a.reshape(shape) for a in (out.value, out.low, out.high))
    layer, head = np.meshgrid(np.arange(point.shape[0]), np.arange(point.shape[1]), indexing="ij")
    return pd.DataFrame({"layer": layer.ravel(), "head": head.ravel(), "metric": "grad_importance:mlm",
                         "value": point.ravel(), "ci_low": low.ravel(), "ci_high": high.ravel(), "n": s})  # fmt: skip


def pruning_table(importance: dict[str, np.ndarray], settings: Any, seed: int) -> pd.DataFrame:
    """Pruning curves: held-out importance orders (bootstrap over sentences) and the mean random order
    (bootstrap over sentences crossed with orders)."""
    curves = importance["pruning"]  # [sentence, order, count, measure]
    orders, counts = importance["pruning_orders"].tolist(), importance["pruning_counts"].tolist()
    mean, low, high, n = mean_over_sentences(curves, settings, seed)
    random = importance["pruning_random"]  # [sentence, random order, count, measure]
    r_mean, r_low, r_high = hs.crossed_bootstrap_mean(random, n_boot=settings.n_boot, ci=settings.ci, seed=seed)
    n_random = random.shape[1]
    rows = []
    for o, order in enumerate([*orders, f"random (mean of {n_random} orders)"]):
        for c, count in enumerate(counts):
            for m, measure in enumerate(imp.OUTPUT_MEASURES):
                if o < len(orders):
                    value = (mean[o, c, m], low[o, c, m], high[o, c, m], int(n[o, c, m]))
                    selection, variance = "held-out", "sentences"
                else:
                    value = (r_mean[c, m], r_low[c, m], r_high[c, m], random.shape[0])
                    selection, variance = "none", f"sentences x {n_random} orders"
                rows.append({"order": order, "n_removed": count, "measure": measure, "value": value[0],
                             "ci_low": value[1], "ci_high": value[2], "n": value[3], "selection": selection,
                             "interval_covers": variance})  # fmt: skip
    return pd.DataFrame(rows)


def top_heads_table(importance: dict[str, np.ndarray], n_heads: int, settings: Any, seed: int) -> pd.DataFrame:
    """Most important heads chosen on one half of the importance sentences, reported on the other."""
    effects = importance["effects"]
    methods = importance["methods"].tolist()
    zero = methods.index("zero") if "zero" in methods else 0
    rankings = {f"ablation:{methods[zero]}:pooled_cos": effects[:, zero, :, :, imp.OUTPUT_MEASURES.index("pooled_cos")]}
    if str(importance["objective"]) == "mlm":
        rankings["grad_importance:mlm (per-sentence token mean)"] = importance["grad"]
    fold = hs.heldout_folds(len(effects), seed)
    rows = []
    for name, values in rankings.items():
        for rec in hs.heldout_top(values.reshape(len(values), -1), fold, settings.top_k, n_boot=settings.n_boot,
                                  ci=settings.ci, seed=seed):  # fmt: skip
            for key in ("chosen_on_0", "chosen_on_1", "chosen_all"):
                layer, head = divmod(rec.pop(key), n_heads)
                rec[key] = head_name(layer, head)
            rows.append({"ranking": name, **rec, "selection": "held-out"})
    return pd.DataFrame(rows)


def arc_hits(arrays: dict[str, np.ndarray]) -> syn.ArcHits:
    """The attention pass's arc arrays as `syntax.ArcHits`."""
    return syn.ArcHits(arrays["head_hits"], arrays["offset_hits"], arrays["relations"].astype(object),
                       arrays["arc_sentences"])  # fmt: skip


def mean_over_sentences(values: np.ndarray, settings: Any, seed: int) -> tuple[np.ndarray, ...]:
    """``values [sentence, ...]`` (NaN = undefined) -> (mean, ci_low, ci_high, n), each ``[...]``."""
    out, n = mean_of_groups(values, n_boot=settings.n_boot, level=settings.ci, seed=seed)
    return out.value, out.low, out.high, n


def rows_from(values: np.ndarray, names: list[str], settings: Any, seed: int) -> pd.DataFrame:
    """``values [sentence, layer, head, metric]`` -> long rows with bootstrap CIs."""
    mean, low, high, n = mean_over_sentences(values, settings, seed)
    n_layers, n_heads, n_metrics = mean.shape
    layer, head, metric = np.meshgrid(np.arange(n_layers), np.arange(n_heads), np.arange(n_metrics), indexing="ij")
    return pd.DataFrame({
        "layer": layer.ravel(), "head": head.ravel(), "metric": np.asarray(names)[metric.ravel()],
        "value": mean.ravel(), "ci_low": low.ravel(), "ci_high": high.ravel(), "n": n.ravel(),
    })  # fmt: skip


def tidy(results: pd.DataFrame) -> pd.DataFrame:
    """``results`` with its columns in order and their dtypes (nullable integers for ``layer, head, n``)."""
    out = results.reindex(columns=RESULT_COLUMNS)
    for col in ("layer", "head", "n"):
        out[col] = pd.array(out[col].astype("Float64").round(), dtype="Int64")
    for col in ("value", "ci_low", "ci_high"):
        out[col] = out[col].astype(float)
    return out


def distance_table(mean_distance: np.ndarray, n_layers: int, n_heads: int, n: int) -> pd.DataFrame:
    """Head-by-head mean distances ``[layer*head, layer*head]`` as a long table (``distances.parquet``)."""
    total = n_layers * n_heads
    a, b = np.meshgrid(np.arange(total), np.arange(total), indexing="ij")
    return pd.DataFrame({
        "layer_a": a.ravel() // n_heads, "head_a": a.ravel() % n_heads,
        "layer_b": b.ravel() // n_heads, "head_b": b.ravel() % n_heads,
        "distance": mean_distance.ravel(), "n": n,
    })  # fmt: skip


def mds_table(coords: np.ndarray, n_layers: int, n_heads: int, roles: pd.DataFrame) -> pd.DataFrame:
    """The 2-D MDS coordinates of every head with its primary role (``mds.csv``)."""
    primary = roles.groupby(["layer", "head"])["primary_role"].first()
    layer, head = np.divmod(np.arange(n_layers * n_heads), n_heads)
    return pd.DataFrame({
        "layer": layer, "head": head, "x": coords[:, 0], "y": coords[:, 1],
        "primary_role": [primary.get((int(L), int(h)), "other") for L, h in zip(layer, head, strict=True)],
    })  # fmt: skip


def results_table(frames: list[pd.DataFrame], label: dict[str, str], eval_name: str | None = None) -> pd.DataFrame:
    """The ``results`` table from its parts: ``frames`` = the reported rows (attention statistics, distance ratios,
    syntax) then the importance rows (last); ``label`` sets ``model`` and ``corpus``; with ``eval_name``
    (``--eval-corpus``) the reported rows' ``corpus`` says they come from that corpus."""
    n_reported = len(frames) - 1  # attention statistics, ratios and syntax rows: from --eval-corpus when given
    results = pd.concat(frames, ignore_index=True)
    for key, value in label.items():
        results[key] = value
    if eval_name is not None:  # the corpus column says which split each row comes from
        results.loc[: sum(len(f) for f in frames[:n_reported]) - 1, "corpus"] = eval_name
    return tidy(results)
