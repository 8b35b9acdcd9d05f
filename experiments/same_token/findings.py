"""The same-token experiment's findings and figure captions, generated from its saved tables only.

``findings(out_dir)`` reads ``results.parquet`` and ``held_out.parquet`` and states, with the numbers and
intervals behind them: whether raw dot-product attention favours the token itself (word embeddings, and after
the embedding LayerNorm) against the uniform null, whether learned heads escape it (the tutorials' "same-token"
claim), what the held-out top copy heads give beyond the non-repeating control, and pooled against
type-balanced duplicate mass.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from bertscope.experiments.findings import Finding, fmt_ci
from bertscope.experiments.naming import head_name

RAW_WORD, RAW_LN = "embed.hook_word", "embed.hook_out"
RANDOM, CONTROL = "repeated-random", "random-control"

CAPTIONS: dict[str, str] = {
    "raw_vs_learned": "Self mass (top) and duplicate mass (bottom) per corpus. Black: raw softmax(X X^T / sqrt(d)) "
    "attention with X = the word embeddings (far left), then the input of each layer (embedding output after its "
    "LayerNorm for layer 0), with 95% bootstrap intervals. Blue dots: the 12 learned heads of that layer. Dashed: "
    "the uniform null (1/n for self). A dot far below the black line is a head that escapes the raw preference.",
    "heatmaps_builtin": "Per head (rows: layers, columns: heads) on the builtin corpus: self mass, duplicate mass, "
    "and duplicate mass over its primary (offset-matched) null and over the uniform null, as log2 ratios (red: "
    "above the null, blue: below). Top row plain attention, bottom row norm-weighted (Kobayashi et al. 2020).",
    "heatmaps_repeated_random": "As for builtin, on repeated-random (m random tokens, then the same m again). The "
    "offset-matched null is undefined there (every pair at offset m is a copy), so the only null is uniform (three "
    "columns): a head that attends m tokens back scores high without copying; see the copy-specific figure.",
    "copy_specific": "Left: per head (rows: layers, columns: heads), the mass it puts at offset +-m in the "
    "non-repeating control (2m distinct random tokens), i.e. where a copy would sit in repeated-random. Middle: "
    "copy-specific mass = duplicate mass on repeated-random minus that control mass (red: the head follows copies; "
    "~0: it attends to the offset whatever sits there). Right: per head on the main corpus, pooled duplicate mass "
    "(ratio of sums over all queries) against the type-balanced one (per token type, then averaged over types); "
    "points below the diagonal owe their mass to frequent types such as 'the'. Plain attention weights.",
    "weights_self_preference": "Context-free: for sampled vocabulary tokens alone, the share whose own key scores "
    "highest under a head's W_Q W_K^T (left; chance 1/n) and the mean share of other keys it beats (right; "
    "chance 0.5). The title gives raw x x^T on the word embeddings and the embedding output.",
    "example_maps_builtin": "Attention maps (rows: query tokens, columns: key tokens; colour bar: weight) of the "
    "builtin sentence with the most repeated tokens: raw attention on the word embeddings, the embedding output "
    "and the last layer, then the heads with the largest in-sample duplicate ratio and self ratio.",
    "example_maps_repeated_random": "As for builtin, on one repeated-random sequence: copies sit m positions "
    "apart, so a copy head shows two off-diagonal stripes.",
}


def findings(out_dir: Path) -> list[Finding]:
    """The same-token findings from ``out_dir/results.parquet`` and ``out_dir/held_out.parquet``."""
    out_dir = Path(out_dir)
    results = pd.read_parquet(out_dir / "results.parquet")
    held_path = out_dir / "held_out.parquet"
    held = pd.read_parquet(held_path) if held_path.is_file() else pd.DataFrame()
    out = []
    corpora = [c for c in results.corpus.unique() if c not in (RANDOM, CONTROL, "vocab-sample")]
    main = corpora[0] if corpora else RANDOM
    claim = _claim(results, main)
    if claim is not None:
        out.append(claim)
    out += _held_out(held, main)
    balance = _balance(results, main)
    if balance is not None:
        out.append(balance)
    return out


def _row(results: pd.DataFrame, **where: object) -> pd.Series | None:
    rows = results
    for k, v in where.items():
        rows = rows[rows[k] == v]
    return rows.iloc[0] if len(rows) else None


def _claim(results: pd.DataFrame, corpus: str) -> Finding | None:
    """The tutorials' claim: raw attention on the embedding output (what layer 0 reads) against the uniform null,
    the word embeddings alone as a caveat, and each learned head against raw attention on its own layer's input."""
    word = _row(results, corpus=corpus, source="raw", site=RAW_WORD, metric="self")
    ln = _row(results, corpus=corpus, source="raw", site=RAW_LN, metric="self")
    heads = results[(results.corpus == corpus) & (results.source == "head") & (results.weighting == "attention")
                    & (results.metric == "self")]
    if word is None or ln is None or heads.empty:
        return None
    raw_in = {int(layer): _row(results, corpus=corpus, source="raw", metric="self", site=_layer_input(int(layer)))
              for layer in heads.layer.unique()}
    below = sum(int(r.ci_high < raw_in[int(r.layer)].ci_low) for r in heads.itertuples()
                if raw_in[int(r.layer)] is not None)
    raw_large = bool(ln.ci_low > 2 * ln.null_uniform)
    escape = below > len(heads) / 2
    holds = True if raw_large and escape else False if not raw_large and not escape else None
    dup = _row(results, corpus=corpus, source="raw", site=RAW_LN, metric="duplicate")
    hit = _row(results, corpus=corpus, source="raw", site=RAW_WORD, metric="argmax_self_or_copy")
    gap = _row(results, corpus=corpus, source="raw", site=RAW_WORD, metric="logit_gap")
    text = (
        f"On {corpus} ({int(word.n_sentences)} sentences), raw attention softmax(X X^T / sqrt(d)) with X = the "
        f"embedding output (what layer 0's attention reads) puts {fmt_ci(ln.value, ln.ci_low, ln.ci_high)} of a "
        f"token's attention on itself, {ln.value / ln.null_uniform:.1f}x the uniform {ln.null_uniform:.3f}"
        + (f", and {fmt_ci(dup.value, dup.ci_low, dup.ci_high)} on other occurrences of its token "
           f"({dup.value / dup.null_uniform:.1f}x uniform)" if dup is not None else "")
        + f". With X = the word embeddings alone it is {fmt_ci(word.value, word.ci_low, word.ci_high)} "
        f"({word.value / word.null_uniform:.1f}x)"
        + (f": the token or a copy is still the best key for {hit.value:.0%} of queries, but the vectors are short "
           f"(self logit {gap.value:.2f} above the best other token), so the softmax is nearly flat"
           if hit is not None and gap is not None else "")
        + f". {below} of {len(heads)} learned heads put significantly less on the token itself than raw attention "
        f"on their own layer's input (interval below raw's), median self mass {heads.value.median():.3f}. "
        + ("The claim holds: raw attention favours the token itself and most learned heads escape it."
           if holds else "The claim does not hold on this model and corpus." if holds is False else
           "The claim holds only in part: " + ("raw attention favours the token itself, but most learned heads "
                                               "do not escape it." if raw_large else
                                               "most learned heads attend less to themselves than raw attention, "
                                               "but raw attention does not clearly favour the token itself."))
    )
    return Finding(text, claim="same-token", holds=holds, numbers={
        "raw_word_self": float(word.value), "raw_word_self_ci_low": float(word.ci_low),
        "raw_word_self_ci_high": float(word.ci_high), "raw_ln_self": float(ln.value),
        "raw_ln_self_ci_low": float(ln.ci_low), "raw_ln_self_ci_high": float(ln.ci_high),
        "uniform_null": float(ln.null_uniform), "heads_below_raw": below,
        "heads_median_self": float(heads.value.median())})


def _layer_input(layer: int) -> str:
    """The raw site that holds layer ``layer``'s input: the embedding output, else the previous block's output."""
    return RAW_LN if layer == 0 else f"blocks.{layer - 1}.hook_resid_post"


def _heads(row: pd.Series) -> str:
    """'L2H9 on both halves' or 'L2H9 on the first half; L1H1 on the second'."""
    first, second = head_name(row.layer, row["head"]), head_name(row.layer_other, row.head_other)
    if first == second:
        return f"{first} on both halves"
    return f"{first} on the first half; {second} on the second"


def _held_out(held: pd.DataFrame, main: str) -> list[Finding]:
    out = []
    if held.empty:
        return out
    top = held[(held["rank"] == 1) & (held.weighting == "attention")].set_index(["corpus", "metric"])
    if (RANDOM, "duplicate_copy_specific") in top.index:
        s, d, c = (top.loc[(RANDOM, m)] for m in ("duplicate_copy_specific", "duplicate", "control_duplicate"))
        out.append(Finding(
            f"Chosen on one half of the repeated-random sequences and measured on the other (both ways, averaged), "
            f"the top copy head ({_heads(s)}) puts {fmt_ci(d.value, d.ci_low, d.ci_high)} on the earlier or later "
            f"copy of its token, against {fmt_ci(c.value, c.ci_low, c.ci_high)} at the same offset in sequences "
            f"without repeats: a copy-specific mass of {fmt_ci(s.value, s.ci_low, s.ci_high)} (held-out).",
            numbers={"copy_specific": float(s.value), "copy_specific_ci_low": float(s.ci_low),
                     "copy_specific_ci_high": float(s.ci_high), "repeated": float(d.value),
                     "control": float(c.value)}))
    if (main, "duplicate") in top.index:
        d, b, r = (top.loc[(main, m)] for m in ("duplicate", "duplicate_type_balanced", "duplicate_ratio"))
        out.append(Finding(
            f"On {main}, the held-out top head by duplicate mass over its offset-matched null ({_heads(d)}) puts "
            f"{fmt_ci(d.value, d.ci_low, d.ci_high)} on other occurrences of the token pooled over queries "
            f"({fmt_ci(r.value, r.ci_low, r.ci_high, digits=1)}x its null) and "
            f"{fmt_ci(b.value, b.ci_low, b.ci_high)} averaged over token types.",
            numbers={"pooled": float(d.value), "type_balanced": float(b.value), "ratio": float(r.value)}))
    return out


def _balance(results: pd.DataFrame, corpus: str) -> Finding | None:
    heads = results[(results.corpus == corpus) & (results.source == "head") & (results.weighting == "attention")]
    pooled = heads[heads.metric == "duplicate"].set_index(["layer", "head"]).value
    balanced = heads[heads.metric == "duplicate_type_balanced"].set_index(["layer", "head"]).value
    if pooled.empty or balanced.empty:
        return None
    diff = (pooled - balanced).dropna()
    return Finding(
        f"Over the {len(diff)} heads on {corpus}, pooled duplicate mass (median {pooled.median():.3f}) and the "
        f"type-balanced one (median {balanced.median():.3f}) differ by {diff.abs().median():.3f} per head in "
        f"median, at most {diff.abs().max():.3f}; pooled exceeds balanced in {int((diff > 0).sum())} heads.",
        numbers={"pooled_median": float(pooled.median()), "balanced_median": float(balanced.median()),
                 "max_abs_diff": float(diff.abs().max())})
