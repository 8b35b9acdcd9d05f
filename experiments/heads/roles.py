"""Rule-based head roles with explicit thresholds.

Each rule compares one aggregated statistic of a head with a threshold; a head may hold several roles. The
output is a long table with the statistic, its value and the threshold on every row, so that the labels can
be re-derived (or disputed) from the file alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class RoleRule:
    role: str
    statistic: str
    threshold: float
    meaning: str


# In priority order: a head's primary role is its first assigned one. The syntactic role comes first: it is
# the only one earned on held-out sentences with a false-discovery-rate control, and a syntactic head rests on
# [CLS]/[SEP] wherever its relation is absent (Clark et al. 2019, section 3), so a sink mass of 0.5 does not
# contradict it; the report's text, the role counts and the MDS colours all read this one primary role. Then
# sink-like and positional patterns.
DEFAULT_RULES: tuple[RoleRule, ...] = (
    RoleRule(
        "syntactic",
        "syntax_gain",
        0.10,
        "held-out gain over the relation's best offset baseline (-3..+3) above 10 points: the 95% interval's lower "
        "end above it and Benjamini-Hochberg (FDR 0.05) over every head x relation candidate; punct/root never count",
    ),
    RoleRule("[CLS]", "mass_cls", 0.5, "mean attention mass to [CLS] >= 0.5"),
    RoleRule("[SEP]", "mass_sep", 0.5, "mean attention mass to [SEP] >= 0.5"),
    RoleRule("punctuation", "mass_punct", 0.5, "mean attention mass to '.' and ',' >= 0.5"),
    RoleRule("previous-token", "mass_prev", 0.5, "mean A[i, i-1] >= 0.5"),
    RoleRule("next-token", "mass_next", 0.5, "mean A[i, i+1] >= 0.5"),
    RoleRule("self", "mass_self", 0.5, "mean A[i, i] >= 0.5"),
    RoleRule("positional", "top_offset_fraction", 0.9, ">= 90% of argmaxes at one offset"),
    RoleRule("broad", "entropy_ratio", 0.8, "mean entropy >= 0.8 ln n"),
)
NO_ROLE = "other"
SYNTAX_THRESHOLD = next(r.threshold for r in DEFAULT_RULES if r.statistic == "syntax_gain")


def assign_roles(
    head_stats: pd.DataFrame,
    syntax: pd.DataFrame | None = None,
    *,
    rules: tuple[RoleRule, ...] = DEFAULT_RULES,
    min_arcs: int = 50,
    fdr: float = 0.05,
) -> pd.DataFrame:
    """Apply the role rules to every head.

    Args:
        head_stats: one row per head with ``layer, head`` and the statistics the rules name (``mass_*``,
            ``entropy_ratio``, ``top_offset``, ``top_offset_fraction``).
        syntax: optional held-out table from ``syntax.heldout_head_gains`` (``layer, head, relation, n,
            heldout_gain, ci_low, p_value``, the p-value testing ``gain <= threshold``); without it no head can
            be syntactic. ``punct`` and ``root`` rows are ignored.
        min_arcs: relations with fewer arcs do not count for the syntactic rule (too noisy).
        fdr: false-discovery rate of the Benjamini-Hochberg step over all head x relation candidates.

    Returns:
        Long table ``layer, head, role, statistic, value, threshold, assigned, detail, primary_role``: one row
        per (head, rule); ``detail`` names the offset (positional) or relations (syntactic);
        ``primary_role`` is the first assigned role in rule order (``"other"`` when none).
    """
    required = {"layer", "head"} | {r.statistic for r in rules if r.statistic != "syntax_gain"}
    if "positional" in {r.role for r in rules}:
        required.add("top_offset")
    missing = required - set(head_stats.columns)
    if missing:
        raise ValueError(f"assign_roles: head_stats lacks columns {sorted(missing)}; have {list(head_stats.columns)}")
    gains = _syntax_gains(syntax, min_arcs, fdr)
    rows = []
    for rec in head_stats.sort_values(["layer", "head"]).to_dict("records"):
        key = (int(rec["layer"]), int(rec["head"]))
        for rule in rules:
            value, assigned, detail = _apply_rule(rule, rec, gains.get(key, {}))
            rows.append({
                "layer": key[0], "head": key[1], "role": rule.role, "statistic": rule.statistic, "value": value,
                "threshold": rule.threshold, "assigned": assigned, "detail": detail if assigned else "",
                "meaning": rule.meaning
                + (f" on a relation with >= {min_arcs} arcs" if rule.statistic == "syntax_gain" else ""),
                "selection": "held-out" if rule.statistic == "syntax_gain" else "fixed threshold, all sentences",
            })  # fmt: skip
    table = pd.DataFrame(rows)
    primary = (
        table[table["assigned"]].groupby(["layer", "head"], sort=False)["role"].first().rename("primary_role")
    )
    table = table.join(primary, on=["layer", "head"])
    table["primary_role"] = table["primary_role"].fillna(NO_ROLE)
    return table


def _apply_rule(
    rule: RoleRule, rec: dict, rel_gains: dict[str, tuple[float, float, bool]]
) -> tuple[float, bool, str]:
    """``(value, assigned, detail)`` of one rule for one head (``rec``: its row of ``head_stats``)."""
    if rule.statistic == "syntax_gain":
        value = max((g for g, _, _ in rel_gains.values()), default=np.nan)
        passing = {r: g for r, (g, low, ok) in rel_gains.items() if ok and low > rule.threshold}
        return value, bool(passing), ",".join(sorted(passing, key=lambda r: -passing[r]))
    value = float(rec[rule.statistic])
    detail = f"offset {int(rec['top_offset']):+d}" if rule.role == "positional" else ""
    return value, bool(np.isfinite(value) and value >= rule.threshold), detail


def role_summary(roles: pd.DataFrame) -> pd.DataFrame:
    """One row per head: ``layer, head, primary_role, roles`` (assigned roles with details, ``;``-joined)."""

    def describe(group: pd.DataFrame) -> str:
        got = group[group["assigned"]]
        return "; ".join(f"{r} ({d})" if d else r for r, d in zip(got["role"], got["detail"], strict=True)) or NO_ROLE

    out = roles.groupby(["layer", "head"], sort=True).apply(describe, include_groups=False).rename("roles")
    primary = roles.groupby(["layer", "head"], sort=True)["primary_role"].first()
    return pd.concat([primary, out], axis=1).reset_index()


def _syntax_gains(
    syntax: pd.DataFrame | None, min_arcs: int, fdr: float
) -> dict[tuple[int, int], dict[str, tuple[float, float, bool]]]:
    """``{(layer, head): {relation: (held-out gain, ci_low, BH-rejected)}}`` over relations with enough arcs."""
    if syntax is None or syntax.empty:
        return {}
    from bertscope.experiments.heads.syntax import ALL_RELATIONS, HEADLINE_EXCLUDED, benjamini_hochberg

    s = syntax[(syntax["n"] >= min_arcs) & ~syntax["relation"].isin([ALL_RELATIONS, *HEADLINE_EXCLUDED])]
    rejected = benjamini_hochberg(s["p_value"].to_numpy(), fdr)
    out: dict[tuple[int, int], dict[str, tuple[float, float, bool]]] = {}
    for rec, ok in zip(s.to_dict("records"), rejected, strict=True):
        key = (int(rec["layer"]), int(rec["head"]))
        out.setdefault(key, {})[rec["relation"]] = (float(rec["heldout_gain"]), float(rec["ci_low"]), bool(ok))
    return out
