"""The `similarity` experiment's statistics: plain arrays in, long tables out (no forward pass).

Intervals are 95% percentile bootstraps over pairs (texts for the negation claim), the same resamples for every row
of a table so rows can be compared. Shapes: ``n`` pairs, ``B`` bootstrap resamples, ``L`` layers, ``H`` heads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from bertscope.probes.bootstrap import percentile_interval
from scipy.stats import rankdata

SELECT, REPORT = "select", "report"


# ---------------------------------------------------------------------------------------------- correlations
def resamples(n: int, n_boot: int, seed: int, stream: int) -> np.ndarray:
    """``[B, n]`` indices of ``n_boot`` bootstrap resamples of ``n`` items (``np.random.default_rng([seed,
    stream])``)."""
    return np.random.default_rng([seed, stream]).integers(0, n, size=(n_boot, n))


def _rowwise_pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson of each row pair ``[..., n]`` -> ``[...]`` (NaN where a row is constant)."""
    xc = x - x.mean(-1, keepdims=True)
    yc = y - y.mean(-1, keepdims=True)
    den = np.sqrt((xc**2).sum(-1) * (yc**2).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (xc * yc).sum(-1) / np.where(den > 0, den, 1), np.nan)


def _ranks(x: np.ndarray) -> np.ndarray:
    return rankdata(x, axis=-1)


def correlations(pred: np.ndarray, gold: np.ndarray, idx: np.ndarray) -> dict[str, float]:
    """Spearman and Pearson of ``pred`` with ``gold`` ``[n]``, and their 95% percentile intervals over the
    resamples ``idx`` ``[B, n]``: keys ``spearman``, ``spearman_low``, ``spearman_high``, ``pearson``, ..."""
    out = {"spearman": float(_rowwise_pearson(_ranks(pred), _ranks(gold))),
           "pearson": float(_rowwise_pearson(pred, gold))}
    boot = {"spearman": _rowwise_pearson(_ranks(pred[idx]), _ranks(gold[idx])),
            "pearson": _rowwise_pearson(pred[idx], gold[idx])}
    for name, values in boot.items():
        out[f"{name}_low"], out[f"{name}_high"] = _interval(values)
    return out


def _interval(values: np.ndarray) -> tuple[float, float]:
    """95% percentile interval of bootstrap replicates ``[B]`` (`probes.bootstrap.percentile_interval`: finite
    replicates only, NaN when none)."""
    low, high = percentile_interval(values, 0.95)
    return float(low), float(high)


def benchmark_table(scores: Mapping[tuple[str, str], np.ndarray], gold: np.ndarray, select: np.ndarray, *,
                    own: tuple[str, str], n_boot: int, seed: int) -> pd.DataFrame:
    """One row per split, site and pooling: ``split`` (``select``: the pairs the best site and pooling are chosen
    on, never reported; ``report``: the held-out pairs every number is quoted from), ``site``, ``layer``,
    ``pooling``, ``spearman``, ``pearson`` with 95% bootstrap intervals over the split's pairs, ``n_pairs``,
    ``own`` (the model's own embedding: ``own = (site, pooling)``), ``chosen`` (the site and pooling of highest
    Spearman on the select split, marked on both splits' rows), ``chosen_on`` (``"select"``)."""
    rows = []
    for split, part in ((SELECT, select), (REPORT, ~select)):
        idx = resamples(int(part.sum()), n_boot, seed, 1 if split == SELECT else 2)
        for (site, pooling), pred in scores.items():
            rows.append({"split": split, "site": site, "layer": _layer(site), "pooling": pooling,
                         **correlations(pred[part], gold[part], idx), "n_pairs": int(part.sum()),
                         "own": (site, pooling) == tuple(own)})
    df = pd.DataFrame(rows)
    sel = df[df.split == SELECT]
    best = sel.loc[sel.spearman.idxmax()] if sel.spearman.notna().any() else sel.iloc[0]
    df["chosen"] = (df.site == best.site) & (df.pooling == best.pooling)
    df["chosen_on"] = SELECT
    return df


def _layer(site: str) -> int:
    parts = site.split(".")
    return int(parts[1]) if len(parts) > 1 and parts[0] == "blocks" and parts[1].isdigit() else -1


# ---------------------------------------------------------------------------------------------- heads
def heads_table(shares: pd.DataFrame, ablated: np.ndarray, base: np.ndarray, gold: np.ndarray, *, n_boot: int,
                seed: int) -> pd.DataFrame:
    """One row per component of the decomposition: ``component``, ``kind`` (head, mlp, embeddings, bias),
    ``layer``, ``head``, ``share`` (mean over pairs of its share of the cosine; a pair's shares sum to its
    cosine) with a 95% bootstrap interval over pairs; for heads also ``spearman_ablated`` and
    ``spearman_change`` (Spearman with gold when the head is mean-ablated, minus the intact model's, on every
    pair) with an interval over pairs; ``n_pairs``."""
    n = len(base)
    idx = resamples(n, n_boot, seed, 3)
    wide = shares.pivot_table(index="component", columns="pair", values="share").reindex(columns=range(n))
    meta = shares.drop_duplicates("component").set_index("component")[["kind", "layer", "head"]]
    values = wide.to_numpy()  # [c, n]
    boot = values[:, idx].mean(-1)  # [c, B]
    gold_ranks, gold_boot = _ranks(gold), _ranks(gold[idx])
    base_rho = float(_rowwise_pearson(_ranks(base), gold_ranks))
    base_boot = _rowwise_pearson(_ranks(base[idx]), gold_boot)
    rows = []
    for c, name in enumerate(wide.index):
        kind, layer, head = meta.loc[name, ["kind", "layer", "head"]]
        low, high = _interval(boot[c])
        row = {"component": name, "kind": kind, "layer": int(layer), "head": int(head),
               "share": float(values[c].mean()), "share_low": low, "share_high": high}
        if kind == "head":
            pred = ablated[int(layer), int(head)]
            rho = float(_rowwise_pearson(_ranks(pred), gold_ranks))
            change_boot = _rowwise_pearson(_ranks(pred[idx]), gold_boot) - base_boot
            c_low, c_high = _interval(change_boot)
            row.update({"spearman_ablated": rho, "spearman_change": rho - base_rho, "change_low": c_low,
                        "change_high": c_high})
        rows.append(row)
    df = pd.DataFrame(rows)
    for col in ("spearman_ablated", "spearman_change", "change_low", "change_high"):
        if col not in df:
            df[col] = np.nan
    df["spearman_intact"] = base_rho
    df["n_pairs"] = n
    order = {"embeddings": 0, "head": 1, "mlp": 2, "bias": 3}
    return df.sort_values(["layer", "kind", "head"], key=lambda s: s.map(order) if s.name == "kind" else s,
                          kind="stable").reset_index(drop=True)


# ---------------------------------------------------------------------------------------------- faithfulness
def _allowed(special_a: np.ndarray, special_b: np.ndarray) -> np.ndarray:
    return ~special_a[:, None] & ~special_b[None, :]


MATCHED = "matched:"


def removal_plans(matrices: Mapping[str, Sequence[np.ndarray]], special_a: Sequence[np.ndarray],
                  special_b: Sequence[np.ndarray], ks: Sequence[int], n_random: int, seed: int) -> pd.DataFrame:
    """Which token pairs each method removes: one row per method, pair, ``k`` and ``draw`` with ``positions_a``
    and ``positions_b`` (the distinct piece positions of the removed pairs on each side), ``n_removed`` (pairs
    removed: ``min(k, pairs available)``) and ``tokens_removed``. A method removes its top-k token pairs by
    attribution (largest first). Two baselines, ``n_random`` draws per pair and k: ``random`` removes k token
    pairs drawn uniformly (the issue's baseline; its pairs share fewer tokens than a method's top pairs, so it
    removes more tokens), and ``matched:METHOD`` removes as many tokens on each side as METHOD did, drawn
    uniformly (the baseline with the amount removed held equal). Special tokens ([CLS], [SEP]) are never removed
    (the reference keeps them)."""
    rows = []
    rng = np.random.default_rng([seed, 5])
    for pair in range(len(special_a)):
        allowed = _allowed(special_a[pair], special_b[pair])
        cand = np.flatnonzero(allowed.ravel())
        nb = allowed.shape[1]
        free_a, free_b = np.flatnonzero(~special_a[pair]), np.flatnonzero(~special_b[pair])
        for method, mats in matrices.items():
            flat = np.asarray(mats[pair], dtype=float).ravel()[cand]
            order = cand[np.argsort(-flat, kind="stable")]
            for k in ks:
                plan = _plan(method, pair, k, 0, order[:k], nb)
                rows.append(plan)
                for draw in range(n_random):
                    pa = sorted(rng.choice(free_a, size=len(plan["positions_a"]), replace=False).tolist())
                    pb = sorted(rng.choice(free_b, size=len(plan["positions_b"]), replace=False).tolist())
                    rows.append({**plan, "method": MATCHED + method, "draw": draw, "positions_a": pa,
                                 "positions_b": pb})
        for k in ks:
            for draw in range(n_random):
                pick = rng.choice(cand, size=min(k, cand.size), replace=False) if cand.size else cand
                rows.append(_plan("random", pair, k, draw, pick, nb))
    return pd.DataFrame(rows)


def _plan(method: str, pair: int, k: int, draw: int, flat: np.ndarray, nb: int) -> dict[str, Any]:
    pa = sorted({int(f) // nb for f in flat})
    pb = sorted({int(f) % nb for f in flat})
    return {"method": method, "pair": pair, "k": int(k), "draw": draw, "positions_a": pa, "positions_b": pb,
            "n_removed": len(flat), "tokens_removed": len(pa) + len(pb)}


#: The method whose AOPC every other method's is divided by in the ``aopc`` table (``ratio_to_rollout``).
ROLLOUT = "mixing:rollout:attention"


def faithfulness_tables(plans: pd.DataFrame, after: Mapping[Any, np.ndarray], before: np.ndarray, *, n_boot: int,
                        seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(faithfulness, aopc)`` from the plans and each plan's cosine after removal (``after``: ``(removal,
    sides)`` (or a removal mode alone, sides ``both``) -> ``[len(plans)]``; ``before``: each pair's intact cosine
    ``[n]``). ``faithfulness``: one row per removal mode, sides, method and k: ``drop`` (mean over pairs of
    ``before - after``; random: mean over draws first) with a 95% bootstrap interval over pairs,
    ``tokens_removed`` (mean), ``random_drop`` and ``vs_random`` (``above``, ``below`` or ``not
    distinguishable``: the paired bootstrap interval of ``drop - random_drop``), ``n_pairs``. ``aopc``: one row
    per removal mode, sides and method, the mean drop over the ks (AOPC, Samek et al. 2017, over the table's ks)
    with its interval, the random baseline's, ``vs_random``, ``ratio_to_random`` and ``ratio_to_rollout`` (the
    method's AOPC over attention rollout's, ``ROLLOUT``, with a 95% interval from the same pair resamples; NaN
    when rollout did not run)."""
    faith, aopc = [], []
    for key, scores in after.items():
        removal, sides = key if isinstance(key, tuple) else (key, "both")
        f, a = _faithfulness(plans, np.asarray(scores), before, n_boot=n_boot, seed=seed)
        faith.append(f.assign(removal=removal, sides=sides))
        aopc.append(a.assign(removal=removal, sides=sides))
    front = ["removal", "sides", "method"]
    faith_df, aopc_df = pd.concat(faith, ignore_index=True), pd.concat(aopc, ignore_index=True)
    return (faith_df[front + [c for c in faith_df if c not in front]],
            aopc_df[front + [c for c in aopc_df if c not in front]])


def _faithfulness(plans: pd.DataFrame, after: np.ndarray, before: np.ndarray, *, n_boot: int, seed: int
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    df = plans.assign(drop=before[plans.pair.to_numpy()] - after)
    per = df.groupby(["method", "k", "pair"], sort=False)[["drop", "tokens_removed"]].mean().reset_index()
    n = int(per.pair.nunique())
    idx = resamples(n, n_boot, seed, 6)
    pairs = np.sort(per.pair.unique())
    ks = sorted(per.k.unique())
    methods = [m for m in dict.fromkeys(per.method) if m != "random" and not m.startswith(MATCHED)] + ["random"]
    grid = {m: per[per.method == m].pivot_table(index="k", columns="pair", values="drop")
            .reindex(index=ks, columns=pairs).to_numpy() for m in dict.fromkeys(per.method)}  # [k, n]
    removed = per.groupby(["method", "k"]).tokens_removed.mean()
    rows, aopc = [], []
    rollout = grid[ROLLOUT].mean(0) if ROLLOUT in grid else None  # [n] per-pair AOPC of rollout
    for m in methods:
        g, r = grid[m], grid["random"]
        mt = grid.get(MATCHED + m, np.full_like(g, np.nan))
        for i, k in enumerate(ks):
            low, high = _interval(g[i][idx].mean(-1))
            d_low, d_high = _interval((g[i] - r[i])[idx].mean(-1))
            m_low, m_high = _interval((g[i] - mt[i])[idx].mean(-1))
            rows.append({"method": m, "k": int(k), "drop": float(g[i].mean()), "drop_low": low, "drop_high": high,
                         "tokens_removed": float(removed[(m, k)]), "random_drop": float(r[i].mean()),
                         "vs_random": _versus(d_low, d_high, m), "matched_drop": float(mt[i].mean()),
                         "vs_matched": _versus(m_low, m_high, m), "n_pairs": n})
        per_pair, rand, matched = g.mean(0), r.mean(0), mt.mean(0)
        low, high = _interval(per_pair[idx].mean(-1))
        d_low, d_high = _interval((per_pair - rand)[idx].mean(-1))
        m_low, m_high = _interval((per_pair - matched)[idx].mean(-1))
        if rollout is None:
            r_ratio, r_low, r_high = math.nan, math.nan, math.nan
        else:
            r_ratio = _ratio(per_pair.mean(), rollout.mean())
            with np.errstate(divide="ignore", invalid="ignore"):
                r_low, r_high = _interval(per_pair[idx].mean(-1) / rollout[idx].mean(-1))
        aopc.append({"method": m, "aopc": float(per_pair.mean()), "aopc_low": low, "aopc_high": high,
                     "random_aopc": float(rand.mean()), "ratio_to_random": _ratio(per_pair.mean(), rand.mean()),
                     "ratio_to_rollout": r_ratio, "ratio_to_rollout_low": r_low, "ratio_to_rollout_high": r_high,
                     "vs_random": _versus(d_low, d_high, m), "matched_aopc": float(matched.mean()),
                     "vs_matched": _versus(m_low, m_high, m), "ks": ",".join(str(int(k)) for k in ks),
                     "n_pairs": n})
    return pd.DataFrame(rows), pd.DataFrame(aopc)


def _versus(low: float, high: float, method: str) -> str:
    if method == "random":
        return "baseline"
    if low != low:
        return "n/a"
    if low > 0:
        return "above"
    if high < 0:
        return "below"
    return "not distinguishable"


def _ratio(x: float, y: float) -> float:
    return float(x / y) if y != 0 else math.nan


# ---------------------------------------------------------------------------------------------- the two claims
def top_share(matrix: np.ndarray, fraction: float) -> float:
    """Share of ``sum |matrix|`` held by its ``ceil(fraction * size)`` largest ``|entries|``."""
    v = np.sort(np.abs(np.asarray(matrix, dtype=float)).ravel())[::-1]
    total = v.sum()
    return float(v[:max(1, math.ceil(fraction * v.size))].sum() / total) if total > 0 else math.nan


def marginals(matrix: np.ndarray) -> np.ndarray:
    """The control matrix: ``|A|``'s row sums times its column sums over its total, the attribution each token
    pair would get if a token's weight did not depend on which token of the other text it meets (the top share
    of a matrix is unchanged by any shuffling of its entries, so shuffling cannot serve as the control)."""
    a = np.abs(np.asarray(matrix, dtype=float))
    total = a.sum()
    return np.outer(a.sum(1), a.sum(0)) / total if total > 0 else a


def concentration_table(matrices: Mapping[str, Sequence[np.ndarray]], fraction: float) -> pd.DataFrame:
    """One row per method and pair: ``top_share`` (share of ``|attribution|`` in the top ``fraction`` of token
    pairs, special tokens included), ``control_share`` (the same of the ``marginals`` control), ``uniform`` (the
    share if every pair had the same attribution), ``n_entries``."""
    rows = []
    for method, mats in matrices.items():
        for pair, m in enumerate(mats):
            m = np.asarray(m, dtype=float)
            rows.append({"method": method, "pair": pair, "top_share": top_share(m, fraction),
                         "control_share": top_share(marginals(m), fraction),
                         "uniform": max(1, math.ceil(fraction * m.size)) / m.size, "n_entries": int(m.size)})
    return pd.DataFrame(rows)


def _mean_ci(values: np.ndarray, idx: np.ndarray) -> tuple[float, float, float]:
    low, high = _interval(values[idx].mean(-1)) if values.size else (math.nan, math.nan)
    return float(values.mean()) if values.size else math.nan, low, high


def claims_table(negation: pd.DataFrame, n_skipped: int, paraphrase: np.ndarray, concentration: pd.DataFrame,
                 method: str, fraction: float, *, n_boot: int, seed: int) -> pd.DataFrame:
    """The two published claims beside their controls, one row each: ``claim``, ``measure``, ``value`` with
    interval, ``control``, ``control_value`` with interval, ``difference`` (value - control) with a paired
    interval, ``reference`` and ``reference_value``, ``n``, ``n_skipped``, ``holds``.

    Negation: ``value`` = mean ``cos(original, negated)``, control = the same with "not" swapped for a
    same-length word; ``reference`` = mean cosine of the corpus pairs with gold >= 4 (``paraphrase``); holds when
    the negations are on average at least as close to their originals as those paraphrases are to each other.
    Concentration: ``value`` = mean top-``fraction`` share of ``method``'s ``|attribution|``, control = the
    ``marginals`` matrix's; holds when the share is above one half and above the control (interval of the
    difference above 0)."""
    rows = []
    neg_idx = resamples(len(negation), n_boot, seed, 7)
    v = negation.cos_negated.to_numpy(float) if len(negation) else np.zeros(0)
    c = negation.cos_control.to_numpy(float) if len(negation) else np.zeros(0)
    value, c_v, diff = _mean_ci(v, neg_idx), _mean_ci(c, neg_idx), _mean_ci(v - c, neg_idx)
    ref = float(np.mean(paraphrase)) if len(paraphrase) else math.nan
    holds = None if not len(negation) or math.isnan(ref) else bool(value[0] >= ref)
    rows.append(_claim("embeddings mostly ignore negation", "cos(original, negated), mean over sentences",
                       value, "cos(original, control: 'not' swapped for 'now')", c_v, diff,
                       "cos of the corpus pairs with gold >= 4, mean", ref, len(negation), n_skipped, holds))
    conc = concentration[concentration.method == method]
    idx = resamples(len(conc), n_boot, seed, 8)
    t = conc.top_share.to_numpy(float)
    ctl = conc.control_share.to_numpy(float)
    value, c_v, diff = _mean_ci(t, idx), _mean_ci(ctl, idx), _mean_ci(t - ctl, idx)
    uniform = float(conc.uniform.mean()) if len(conc) else math.nan
    holds = None if not len(conc) else bool(value[0] > 0.5 and diff[1] > 0)
    rows.append(_claim("a few token pairs dominate",
                       f"share of |attribution| ({method}) in the top {fraction:.0%} of token pairs, mean over pairs",
                       value, "same share of the row-sum x column-sum matrix (no pair-specific interaction)", c_v,
                       diff, "share if every token pair had the same attribution", uniform, len(conc), 0, holds))
    return pd.DataFrame(rows)


def _claim(claim: str, measure: str, value: tuple, control: str, c_v: tuple, diff: tuple, reference: str,
           ref: float, n: int, skipped: int, holds: bool | None) -> dict[str, Any]:
    return {"claim": claim, "measure": measure, "value": value[0], "value_low": value[1], "value_high": value[2],
            "control": control, "control_value": c_v[0], "control_low": c_v[1], "control_high": c_v[2],
            "difference": diff[0], "difference_low": diff[1], "difference_high": diff[2], "reference": reference,
            "reference_value": ref, "n": int(n), "n_skipped": int(skipped), "holds": holds}


def matrices_table(attributions: Mapping[str, Sequence[Any]], pair_ids: Sequence[int]) -> pd.DataFrame:
    """Long table of the attribution matrices: ``pair`` (the corpus pair id), ``method``, ``i``, ``token_a``,
    ``j``, ``token_b``, ``value``; plus per pair and method ``score``, ``target``, ``error``."""
    parts = []
    for method, results in attributions.items():
        for pid, r in zip(pair_ids, results, strict=True):
            f = r.frame()
            f.insert(0, "method", method)
            f.insert(0, "pair", int(pid))
            parts.append(f.assign(score=r.score, target=r.target, error=r.error))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["pair", "method", "i", "token_a", "j", "token_b", "value", "score", "target", "error"])


def matrices_by_method(matrices: pd.DataFrame, pair_ids: Sequence[int]) -> dict[str, list[np.ndarray]]:
    """``{method: [matrix [p_a, p_b] per pair, in pair_ids order]}`` from the long ``matrices`` table."""
    out: dict[str, list[np.ndarray]] = {}
    for method, df in matrices.groupby("method", sort=False):
        by_pair = {pid: g for pid, g in df.groupby("pair")}
        out[str(method)] = [by_pair[pid].pivot(index="i", columns="j", values="value").sort_index()
                            .sort_index(axis=1).to_numpy() for pid in pair_ids]
    return out


def intact_plans(n: int) -> pd.DataFrame:
    """Plans that remove nothing (each pair's intact cosine through the same passes as the removals)."""
    return pd.DataFrame({"pair": range(n), "positions_a": [[] for _ in range(n)],
                         "positions_b": [[] for _ in range(n)]})


def methods_table(matrices: pd.DataFrame, steps: int) -> pd.DataFrame:
    """One row per method: ``target`` (what its matrix sums to, mean over pairs), ``score`` (the model's
    cosine, mean), ``abs_error`` (mean ``|sum - target|``), ``relative_error`` (mean ``|sum - target| /
    |score|``: the conservation error), ``seconds_per_pair``, ``steps`` (of the path methods), ``n_pairs``."""
    per = matrices.drop_duplicates(["method", "pair"])
    rows = []
    for method, g in per.groupby("method", sort=False):
        rel = (g.error.abs() / g.score.abs().clip(lower=1e-12)).to_numpy(float)
        rows.append({"method": method, "target": float(g.target.mean()), "score": float(g.score.mean()),
                     "abs_error": float(g.error.abs().mean()), "relative_error": float(rel.mean()),
                     "seconds_per_pair": float(g.seconds_per_pair.mean()) if "seconds_per_pair" in g else math.nan,
                     "steps": steps, "n_pairs": int(len(g))})
    return pd.DataFrame(rows)
