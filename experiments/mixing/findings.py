"""The `mixing` experiment's findings: sentences formatted from its saved ``results`` table only."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from bertscope.experiments.findings import Finding, fmt_ci

#: Human names of the methods, for legends and panel titles.
LABELS = {
    "attention": "attention weights",
    "attention_norm": "attention norm (Kobayashi 2020)",
    "residual_norm": "norm with residual + LayerNorm (Kobayashi 2021)",
    "alti": "ALTI (Ferrando 2022)",
    "value_zeroing": "value zeroing (Mohebbi 2023)",
    "grad_x_input": "gradient x input",
    "integrated_gradients": "integrated gradients",
    "loo": "leave one out (reference)",
}
GROUP_TITLES = {"share_cls": "[CLS]", "share_sep": "[SEP]", "share_punct": "punctuation ('.' and ',')"}


def read_results(out_dir: Path) -> pd.DataFrame:
    """The saved ``results`` table of ``out_dir`` (parquet, else csv)."""
    for name in ("results.parquet", "results.csv"):
        path = Path(out_dir) / name
        if path.is_file():
            return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    raise FileNotFoundError(f"{out_dir} has no results.parquet or results.csv; run `bertscope run mixing` first")


def per_layer_methods(results: pd.DataFrame) -> list[str]:
    """The per-layer methods present, in the library's order."""
    from bertscope.hooks.mixing import PER_LAYER

    present = set(results["method"])
    return [m for m in PER_LAYER if m in present]


def _short(method: str) -> str:
    kind, _, base = method.rpartition(":")
    name = LABELS.get(base, base).split(" (")[0]
    return f"rollout of {name}" if kind == "rollout" else name


#: Caption per figure stem (the report shows them under the figures).
CAPTIONS: dict[str, str] = {
    "fig_mixing_ratio": "How much of each token's representation comes from the other tokens rather than from "
    "itself, per layer and method (mean over all tokens, 95% bootstrap band over sentences). Left: one layer "
    "at a time (0 = the token keeps only itself); attention weights and attention norms leave out the residual "
    "connection, so they overstate mixing. Right: the same, rolled out from the input through all layers.",
    "fig_special_tokens": "Share of each token's incoming contributions that comes from [CLS], [SEP] and "
    "punctuation, per layer. The black line (attention weights) is the attention mass the heads and same-token "
    "experiments report; the other lines show how much of that mass is left when a method weighs what the "
    "attended token actually writes (norms, ALTI, value zeroing).",
    "fig_faithfulness": "Faithfulness: how well each method's last-layer attribution of the model's output to "
    "its input tokens ranks the tokens like leave-one-out does (Spearman correlation per sentence, mean over "
    "sentences, 95% bootstrap interval over sentences). 'rollout:' methods chain the layers from the input; the "
    "others use the last layer alone. Leave-one-out against itself is 1 by construction.",
    "fig_example_maps": "Last-layer contribution maps of example sentences: row = receiving token, column = "
    "contributing token, colour = share of the row's contributions (rows sum to 1). Attention puts its mass "
    "on [CLS]/[SEP]/punctuation; the norm-based maps and ALTI show how much of it the attended tokens actually "
    "write, and keep the diagonal (the token itself through the residual).",
}

#: A method "keeps" an attention finding about a token group when its share is at least this fraction of the
#: attention mass at the layer where that mass peaks.
KEEP_FRACTION = 0.5


def findings(out_dir: Path) -> list[Finding]:
    """Faithfulness ranking, special-token shares beside attention mass, and the mixing ratio, from
    ``out_dir/results``; an empty list when the table lacks the rows a sentence needs."""
    results = read_results(Path(out_dir))
    out = []
    for fn in (_faithfulness, _special_tokens, _mixing_ratio):
        out += fn(results)
    return out


def _faithfulness(results: pd.DataFrame) -> list[Finding]:
    faith = results[(results.metric == "spearman_vs_loo") & (results.method != "loo")]
    faith = faith.dropna(subset=["value"]).sort_values("value", ascending=False)
    if faith.empty:
        return []
    top = faith.head(3)
    parts = [f"{_short(r.method)} {fmt_ci(r.value, r.ci_low, r.ci_high)}" for r in top.itertuples()]
    numbers = {f"spearman:{r.method}": float(r.value) for r in faith.itertuples()}
    text = (f"Ranked by agreement with leave-one-out (Spearman per sentence, mean over {int(faith.n.max())} "
            f"sentences), the most faithful input attributions are {'; '.join(parts)}.")  # fmt: skip
    raw = faith[faith.method == "attention"]
    if not raw.empty:
        r = raw.iloc[0]
        rank = int((faith.value > r.value).sum()) + 1
        text += (f" Last-layer attention weights score {fmt_ci(r.value, r.ci_low, r.ci_high)} "
                 f"(rank {rank} of {len(faith)}).")  # fmt: skip
    return [Finding(text, numbers=numbers)]


def _special_tokens(results: pd.DataFrame) -> list[Finding]:
    methods = [m for m in per_layer_methods(results) if m != "attention"]
    out = []
    for metric in ("share_cls", "share_sep"):
        att = results[(results.method == "attention") & (results.metric == metric)].dropna(subset=["value"])
        if att.empty or not methods:
            continue
        peak = att.loc[att.value.idxmax()]
        layer = int(peak.layer)
        numbers = {"attention": float(peak.value), "layer": float(layer)}
        kept, lost, parts = [], [], []
        for m in methods:
            row = results[(results.method == m) & (results.metric == metric) & (results.layer == layer)]
            if row.empty:
                continue
            r = row.iloc[0]
            numbers[m] = float(r.value)
            parts.append(f"{_short(m)} {fmt_ci(r.value, r.ci_low, r.ci_high)}")
            (kept if r.value >= KEEP_FRACTION * peak.value else lost).append(_short(m))
        if not parts:
            continue
        name = GROUP_TITLES[metric]
        text = (f"{name} draws {fmt_ci(peak.value, peak.ci_low, peak.ci_high)} of the attention weights at layer "
                f"{layer}, where its attention mass peaks; its share of the contributions there is "
                f"{'; '.join(parts)}.")  # fmt: skip
        if lost:
            text += f" The attention finding shrinks below half under {', '.join(lost)}"
            text += f" and holds under {', '.join(kept)}." if kept else "."
        else:
            text += " The attention finding holds (at least half the mass) under every method."
        out.append(Finding(text, numbers=numbers))
    return out


def _mixing_ratio(results: pd.DataFrame) -> list[Finding]:
    ratio = results[(results.metric == "mixing_ratio") & results.method.isin(per_layer_methods(results))]
    if ratio.empty:
        return []
    means = ratio.groupby("method")["value"].agg(["mean", "min", "max"])
    order = [m for m in per_layer_methods(results) if m in means.index]
    parts = [f"{_short(m)} {means.loc[m, 'mean']:.2f} (layers range {means.loc[m, 'min']:.2f}-"
             f"{means.loc[m, 'max']:.2f})" for m in order]  # fmt: skip
    text = ("Share of a token's layer output that comes from other tokens, averaged over layers: "
            + "; ".join(parts) + ".")  # fmt: skip
    if "attention" in means.index and "residual_norm" in means.index:
        a, r = means.loc["attention", "mean"], means.loc["residual_norm", "mean"]
        text += (f" Counting the residual connection and LayerNorm, as residual_norm does, the context share is "
                 f"{r / a:.2f} times what attention weights alone suggest.") if a > 0 else ""  # fmt: skip
    return [Finding(text, numbers={m: float(means.loc[m, "mean"]) for m in order})]
