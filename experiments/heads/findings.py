"""Findings and figure captions of the `heads` experiment, generated from its saved tables only.

``findings(out_dir)`` reads ``syntax.csv``, ``roles.csv``, ``top_heads.csv`` and ``pruning.csv`` (whichever
exist) and formats every number it states from them; the "specialisation" claim is answered from held-out
syntax scores and the syntactic role (itself held-out, with a false-discovery-rate control).
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
from bertscope.experiments.findings import Finding, fmt_ci
from bertscope.experiments.naming import head_name

CAPTIONS: dict[str, str] = {
    "fig_heatmaps": "Mean attention statistics of every head (rows: layers, columns: heads), averaged over "
    "sentences: the share of attention to [CLS], [SEP], punctuation, the token itself, the previous and next "
    "token, the entropy relative to uniform, and their norm-weighted versions (Kobayashi et al.). Bright = high.",
    "fig_layer_dots": "One dot per head, by layer: attention mass to each kind of token (filled) and the "
    "norm-weighted mass (hollow), which discounts attention to tokens whose transformed values are small. "
    "Entropy is in nats against ln n (dashed).",
    "fig_argmax_offsets": "Where each head's strongest weight falls, relative to the query (columns: offsets; "
    "rows: heads, layer by layer between white lines). The left tail also counts argmaxes on [CLS] (at the start of "
    "the sequence); the last column gives each head's attention mass on [CLS] to read it against. A bright column "
    "at -1 or +1 is a previous- or next-token head.",
    "fig_mds": "Heads placed so that distances on the page follow the mean Jensen-Shannon distance between their "
    "attention maps (MDS): left coloured by layer, right by the primary role from roles.csv. Nearby heads attend "
    "alike.",
    "fig_distance_clusters": "Distances between heads' attention maps, reordered by average-linkage clustering "
    "(dendrogram on top); dark blocks are groups of heads that attend alike.",
    "fig_syntax": "Per dependency relation (punct and root left out, as in Clark et al.): the head chosen on half "
    "the sentences, scored on the other half (both ways), against the best fixed-offset baseline chosen the same "
    "way; bars are held-out accuracies with 95% sentence-bootstrap intervals. The label names the head chosen "
    "on all sentences.",
    "fig_ablation": "Change of the model's output when one head is ablated (zero, mean or uniform attention; "
    "1 - cosine of the token states or the mean-pooled embedding), and gradient importance. Without a masked-LM "
    "head the gradient panel is a consistency check, not Michel et al.'s score.",
    "fig_pruning": "Output change as heads are removed together (zeroed) in order of importance (the order chosen "
    "on half the sentences, read on the other) or at random (mean of the random orders; the band covers "
    "sentences and orders). A curve under the random one means the ranking found heads that matter less.",
}

_HEADLINE_ROWS = ("ALL", "PER-RELATION")


def findings(out_dir: Path) -> list[Finding]:
    """Sentences about head specialisation, each with the numbers behind it (empty when no table exists)."""
    out_dir = Path(out_dir)
    out: list[Finding] = []
    syntax = _read(out_dir / "syntax.csv")
    roles = _read(out_dir / "roles.csv")
    if syntax is not None and not syntax.empty:
        out.append(_specialisation(syntax, roles))
    if roles is not None and not roles.empty:
        out.append(_roles(roles))
    top = _read(out_dir / "top_heads.csv")
    if top is not None and not top.empty:
        out.append(_top_head(top))
    pruning = _read(out_dir / "pruning.csv")
    if pruning is not None and not pruning.empty:
        finding = _pruning(pruning)
        if finding is not None:
            out.append(finding)
    return out


def _where_chosen(syntax: pd.DataFrame) -> str:
    """How the syntax table's heads were chosen and scored: halves of one corpus, or --corpus / --eval-corpus."""
    if "eval_corpus" in syntax and "selection_corpus" in syntax and len(syntax):
        return (f"{syntax['selection_corpus'].iloc[0]} beats the best fixed-offset baseline (offset also chosen "
                f"there) on {syntax['eval_corpus'].iloc[0]}")
    return "half the sentences beats the best fixed-offset baseline on the other half"


def _specialisation(syntax: pd.DataFrame, roles: pd.DataFrame | None) -> Finding:
    rel = syntax[~syntax["relation"].isin(_HEADLINE_ROWS)].dropna(subset=["heldout_gain_low"])
    threshold = _syntax_threshold(roles)
    beats = rel[rel["heldout_gain_low"] > 0]
    clear = rel[rel["heldout_gain_low"] > threshold]
    n_syntactic = _n_assigned(roles, "syntactic")
    n_primary = _n_primary(roles, "syntactic")
    numbers: dict[str, float] = {
        "relations": float(len(rel)),
        "beat_baseline": float(len(beats)),
        "clear_threshold": float(len(clear)),
        "syntactic_heads": float(n_syntactic),
        "syntactic_primary": float(n_primary),
    }
    if rel.empty:
        return Finding("No relation had enough arcs for a held-out syntax score.", "specialisation", None, numbers)
    best = rel.loc[rel["heldout_gain"].idxmax()]
    where = f"{head_name(best['layer'], best['head'])}, {best['direction']}"
    numbers.update(best_gain=float(best["heldout_gain"]), best_accuracy=float(best["heldout_accuracy"]),
                   best_baseline=float(best["heldout_baseline_accuracy"]))  # fmt: skip
    pooled = syntax[syntax["relation"] == "PER-RELATION"]
    pooled_text = ""
    if len(pooled):
        p = pooled.iloc[0]
        numbers.update(per_relation_accuracy=float(p["heldout_accuracy"]),
                       per_relation_baseline=float(p["heldout_baseline_accuracy"]))  # fmt: skip
        pooled_text = (
            f" Pooled over relations, each relation's held-out head scores "
            f"{fmt_ci(p['heldout_accuracy'], p['heldout_accuracy_low'], p['heldout_accuracy_high'])} against "
            f"{p['heldout_baseline_accuracy']:.2f} for the best offsets."
        )
    # "each head focuses on one aspect": a few syntactic heads among many is support in part (mixed), not a
    # verdict that the claim holds; False when no head beats the offsets on any relation
    holds = None if len(beats) else False
    verdict = "holds in part" if (len(clear) and n_syntactic) else ("is weak" if len(beats) else "does not hold")
    text = (
        f"Specialisation {verdict} on this model and corpus: for {len(beats)} of {len(rel)} dependency relations "
        f"(punct and root aside) a head chosen on {_where_chosen(syntax)} (interval above 0), {len(clear)} by more "
        f"than {threshold * 100:.0f} points; largest: "
        f"{best['relation']} ({where}) at {fmt_ci(best['heldout_accuracy'], best['heldout_accuracy_low'], best['heldout_accuracy_high'])} "  # noqa: E501
        f"vs {best['heldout_baseline_accuracy']:.2f}. {_syntactic_heads(roles, n_syntactic, n_primary)}"
        f"{pooled_text}"
    )
    return Finding(text, "specialisation", holds, numbers)


def _roles(roles: pd.DataFrame) -> Finding:
    primary = roles.groupby(["layer", "head"])["primary_role"].first()
    counts = primary.value_counts()
    parts = ", ".join(f"{role} {int(n)}" for role, n in counts.items())
    numbers = {f"primary:{role}": float(n) for role, n in counts.items()}
    numbers["heads"] = float(len(primary))
    return Finding(f"Primary roles of the {len(primary)} heads (first rule met, thresholds in roles.csv): {parts}.",
                   None, None, numbers)  # fmt: skip


def _top_head(top: pd.DataFrame) -> Finding:
    first = top[top["rank"] == 1].iloc[0]
    numbers = {"heldout_value": float(first["heldout_value"]), "in_sample_value": float(first["value"])}
    a, b, whole = (_head_text(first[c]) for c in ("chosen_on_0", "chosen_on_1", "chosen_all"))
    stable = a == b
    text = (
        f"Most important head by {ranking_words(str(first['ranking']))}: chosen on each half of the sentences "
        f"({a} and {b}{', the same head' if stable else ''}), its effect on the "
        f"other half is {fmt_ci(first['heldout_value'], first['ci_low'], first['ci_high'], 3)} "
        f"(in-sample {first['value']:.3f} for {whole})."
    )
    return Finding(text, None, None, numbers)


_METHOD_WORDS = {"zero": "zeroing its output", "mean": "replacing its output by its mean",
                 "uniform": "making its attention uniform"}
_MEASURE_WORDS = {"pooled_cos": "the change of the mean-pooled sentence embedding (1 - cosine)",
                  "hidden_cos": "the change of the token states (1 - cosine)"}


def ranking_words(key: str) -> str:
    """A ranking's table key in words: ``ablation:zero:pooled_cos`` -> "ablation (zeroing its output), read as
    the change of the mean-pooled sentence embedding (1 - cosine)"; ``grad_importance:mlm (...)`` -> "gradient
    importance on the masked-LM loss (...)"; any other key unchanged."""
    parts = key.split(":")
    if len(parts) == 3 and parts[0] == "ablation":
        method = _METHOD_WORDS.get(parts[1], parts[1])
        return f"ablation ({method}), read as {_MEASURE_WORDS.get(parts[2], parts[2])}"
    if parts[0] == "grad_importance":
        rest = parts[1] if len(parts) > 1 else ""
        tail = rest.split(" ", 1)[1] if " " in rest else ""
        return "gradient importance on the masked-LM loss" + (f" {tail}" if tail else "")
    return key


def _head_text(value: object) -> str:
    """A head as the table holds it (``L2H8``, or ``2-8`` in tables written before the convention) -> ``L2H8``."""
    text = str(value)
    if re.fullmatch(r"\d+-\d+", text):
        layer, head = text.split("-")
        return head_name(int(layer), int(head))
    return text


def _pruning(pruning: pd.DataFrame) -> Finding | None:
    sel = pruning[pruning["measure"] == "pooled_cos"]
    random = sel[sel["order"].str.startswith("random")]
    least = sel[sel["order"].str.contains("least important first") & sel["order"].str.startswith("ablation")]
    if random.empty or least.empty:
        return None
    counts = sorted(set(random["n_removed"]))
    k = counts[len(counts) // 2]
    r = random[random["n_removed"] == k].iloc[0]
    q = least[least["n_removed"] == k].iloc[0]
    numbers = {"n_removed": float(k), "random": float(r["value"]), "least_first": float(q["value"])}
    text = (
        f"Removing {k} heads at once changes the sentence embedding by {fmt_ci(q['value'], q['ci_low'], q['ci_high'], 3)} "  # noqa: E501
        f"(1 - cosine) when the least important go first ({q['order']}, held-out), against "
        f"{fmt_ci(r['value'], r['ci_low'], r['ci_high'], 3)} for {r['order']}."
    )
    return Finding(text, None, None, numbers)


def _syntax_threshold(roles: pd.DataFrame | None) -> float:
    if roles is not None and "threshold" in roles:
        rows = roles[roles["role"] == "syntactic"]
        if len(rows):
            return float(rows["threshold"].iloc[0])
    from bertscope.experiments.heads.roles import SYNTAX_THRESHOLD

    return SYNTAX_THRESHOLD


def _syntactic_heads(roles: pd.DataFrame | None, n_syntactic: int, n_primary: int) -> str:
    """The sentence on the syntactic role, with the same counts the role table and the MDS colours show."""
    heads = "head earns" if n_syntactic == 1 else "heads earn"
    text = f"{n_syntactic} {heads} the syntactic role (held-out, Benjamini-Hochberg over head x relation candidates)"
    if n_syntactic == 0:
        return text + "."
    names = _assigned_heads(roles, "syntactic")
    text += f": {', '.join(names)}"
    if n_primary == n_syntactic:
        return text + f"; it is the primary role of {'that head' if n_syntactic == 1 else 'each of them'}."
    return text + f"; it is the primary role of {n_primary} of them."


def _assigned_heads(roles: pd.DataFrame | None, role: str) -> list[str]:
    if roles is None or roles.empty:
        return []
    rows = roles[(roles["role"] == role) & roles["assigned"]].sort_values(["layer", "head"])
    return [head_name(r.layer, r.head) for r in rows.itertuples()]


def _n_primary(roles: pd.DataFrame | None, role: str) -> int:
    if roles is None or roles.empty or "primary_role" not in roles:
        return 0
    primary = roles.groupby(["layer", "head"])["primary_role"].first()
    return int((primary == role).sum())


def _n_assigned(roles: pd.DataFrame | None, role: str) -> int:
    if roles is None or roles.empty:
        return 0
    return int(roles[(roles["role"] == role) & roles["assigned"]].shape[0])


def _read(path: Path) -> pd.DataFrame | None:
    return pd.read_csv(path) if path.is_file() else None
