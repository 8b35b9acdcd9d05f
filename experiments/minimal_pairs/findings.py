"""The `minimal-pairs` experiment's findings: sentences formatted from its saved tables only. They say what the
numbers show about this checkpoint's head (which sentence of each pair it scores higher); whether that reflects
knowledge of English depends on the checkpoint (a random head, or one retrained for retrieval, is no test of it)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from bertscope.experiments.findings import Finding, fmt_ci
from bertscope.experiments.minimal_pairs.measures import CHANCE
from bertscope.experiments.minimal_pairs.plots import main_method, read_table

CAPTIONS: dict[str, str] = {
    "fig_paradigm_accuracy": "Accuracy per paradigm: the share of minimal pairs whose good sentence gets the "
    "higher pseudo-log-likelihood (PLL, one mask per word piece, summed), blue, and the higher PLL per word piece "
    "(length-normalised), orange; bars are 95% percentile intervals of the bootstrap over pairs, sorted by raw "
    "accuracy. The dashed line is chance (0.5): a model with no preference. Left of it the model prefers the bad "
    "sentence.",
    "fig_layer_accuracy": "The same accuracy with the PLL read through each layer's logit lens (the layer's "
    "residual stream put through the model's own masked-LM head in place of the last layer's): all pairs in "
    "black, each field in colour, shading 95% intervals over pairs; the dashed line is chance (0.5). The layer "
    "where the line leaves chance and stays above it is where the head can first read a preference for the good "
    "sentence.",
    "fig_raw_vs_normalised": "Left: each paradigm's accuracy by raw PLL against by PLL per word piece (dotted: "
    "equal). Right: accuracy for pairs whose bad sentence has more, as many or fewer word pieces than the good "
    "one. Raw PLL is a sum of negative numbers, so it favours the shorter sentence: 'bad longer' pairs can be won "
    "by length alone and 'bad shorter' pairs lost; the per-piece score removes that advantage.",
}

#: Salazar et al. (2020), BLiMP accuracy by pseudo-log-likelihood (their Table): for scale, not computed here.
REFERENCE = {"RoBERTa-large": 0.865, "GPT-2 (345M)": 0.826, "humans": 0.886}
#: A corpus with at least this many paradigms is compared with :data:`REFERENCE` (BLiMP has 67).
BLIMP_PARADIGMS = 60


def verdict(low: float, high: float) -> str:
    """Where an interval lies against chance, in words."""
    if low > CHANCE:
        return "above chance"
    if high < CHANCE:
        return "below chance (the bad sentence is preferred)"
    return "not distinguishable from chance"


def findings(out_dir: Path) -> list[Finding]:
    """Overall accuracy per method, the extreme paradigms, the length control and the first preferring layer; a
    sentence is left out when its table is missing."""
    out_dir = Path(out_dir)
    out: list[Finding] = []
    accuracy = read_table(out_dir, "accuracy")
    if accuracy is not None and not accuracy.empty:
        out.append(_overall(accuracy))
        paradigms = accuracy[(accuracy["level"] == "paradigm") & (accuracy["score"] == "raw")
                             & (accuracy["method"] == main_method(accuracy))]
        if paradigms["group"].nunique() > 1:
            out.append(_extremes(paradigms))
    control = read_table(out_dir, "length_control")
    if control is not None and not control.empty:
        found = _length(control)
        out += [found] if found is not None else []
    layers, first = read_table(out_dir, "layers"), read_table(out_dir, "first_layer")
    if layers is not None and first is not None and not layers.empty:
        out.append(_layers(layers, first))
    return out


def _overall(accuracy: pd.DataFrame) -> Finding:
    rows = accuracy[accuracy["level"] == "overall"].set_index(["method", "score"])
    methods = list(dict.fromkeys(accuracy["method"]))
    parts, numbers = [], {}
    for m in methods:
        raw, norm = rows.loc[(m, "raw")], rows.loc[(m, "normalised")]
        parts.append(f"{m} {fmt_ci(raw.accuracy, raw.low, raw.high)} ({verdict(raw.low, raw.high)}; per piece "
                     f"{fmt_ci(norm.accuracy, norm.low, norm.high)})")
        numbers[f"accuracy:{m}:raw"], numbers[f"accuracy:{m}:normalised"] = float(raw.accuracy), float(norm.accuracy)
    n = int(rows["n_pairs"].iloc[0])
    text = (f"Over {n:,} pairs the head scores the good sentence higher in this share of pairs, by "
            f"pseudo-log-likelihood (95% bootstrap intervals over pairs): {'; '.join(parts)}.")
    if accuracy.loc[accuracy["level"] == "paradigm", "group"].nunique() >= BLIMP_PARADIGMS:
        text += (" For scale (not computed here), Salazar et al. (2020) report on BLiMP "
                 + ", ".join(f"{k} {v:.1%}" for k, v in REFERENCE.items())
                 + "; the accuracy says which sentence this checkpoint's head scores higher, which is a test of "
                 "English only for a head trained to predict English words.")
    return Finding(text, numbers=numbers)


def _extremes(paradigms: pd.DataFrame) -> Finding:
    ranked = paradigms.sort_values("accuracy", ignore_index=True)
    k = min(3, len(ranked) // 2)
    low, high = ranked.head(k), ranked.tail(k).iloc[::-1]

    def names(rows: pd.DataFrame) -> str:
        return "; ".join(f"{r.group.replace('_', ' ')} {fmt_ci(r.accuracy, r.low, r.high)}" for r in rows.itertuples())

    above = int((ranked["low"] > CHANCE).sum())
    below = int((ranked["high"] < CHANCE).sum())
    text = (f"By paradigm ({ranked['method'].iloc[0]}, raw): highest {names(high)}; lowest {names(low)}. "
            f"{above} of {len(ranked)} paradigms are above chance and {below} below it (interval excluding 0.5).")
    return Finding(text, numbers={"paradigms_above": float(above), "paradigms_below": float(below),
                                  "best": float(high["accuracy"].iloc[0]), "worst": float(low["accuracy"].iloc[0])})


def _length(control: pd.DataFrame) -> Finding | None:
    method = main_method(control)
    rows = control[(control["method"] == method) & (control["unit"] == "pieces")].set_index(["difference", "score"])
    parts, numbers = [], {}
    for diff in ("bad longer", "bad shorter"):
        if (diff, "raw") not in rows.index:
            continue
        raw, norm = rows.loc[(diff, "raw")], rows.loc[(diff, "normalised")]
        parts.append(f"where the {diff.replace('bad ', 'bad sentence is ')} ({int(raw.n_pairs):,} pair"
                     f"{'s' if raw.n_pairs != 1 else ''}) raw "
                     f"{fmt_ci(raw.accuracy, raw.low, raw.high)} against per piece "
                     f"{fmt_ci(norm.accuracy, norm.low, norm.high)}")
        numbers[f"{diff}:raw"], numbers[f"{diff}:normalised"] = float(raw.accuracy), float(norm.accuracy)
    if not parts:
        return None
    text = (f"Token-count control ({method}): {'; '.join(parts)}. Raw PLL sums one negative log-probability per "
            "piece, so it favours the sentence with fewer pieces; a gap between the two scores in these rows is "
            "the part of the raw accuracy that length decides.")
    return Finding(text, numbers=numbers)


def _layers(layers: pd.DataFrame, first: pd.DataFrame) -> Finding:
    method = main_method(layers)
    rows = layers[(layers["method"] == method) & (layers["level"] == "overall") & (layers["score"] == "raw")]
    rows = rows.sort_values("stream")
    start, end = rows.iloc[0], rows.iloc[-1]
    k = int(first[(first["method"] == method) & (first["level"] == "overall")]["first_stream"].iloc[0])
    fields = first[(first["method"] == method) & (first["level"] == "field")]
    where = ("at no layer, not even the last" if k < 0 else "from the embeddings on" if k == 0
             else f"from layer {k} on")
    text = (f"Through the logit lens ({method}, raw), accuracy over all pairs goes from "
            f"{fmt_ci(start.accuracy, start.low, start.high)} at the embeddings to "
            f"{fmt_ci(end.accuracy, end.low, end.high)} at the output (layer {int(end.stream)}); the lower bound of "
            f"its interval stays above chance {where}. At a masked position the embeddings' stream holds the mask "
            "and the position only, so the first number is what the head prefers with no context (a fixed preference "
            f"over pieces at each position); the layers change it by {end.accuracy - start.accuracy:+.2f}.")
    if len(fields):
        text += " Per field, the first such layer: " + "; ".join(
            f"{r.group} {'none' if r.first_stream < 0 else int(r.first_stream)}"
            for r in fields.itertuples()) + "."
    return Finding(text, numbers={"first_stream": float(k), "accuracy_embeddings": float(start.accuracy),
                                  "accuracy_output": float(end.accuracy)})
