"""Experiment ``circuits``: which heads, connected how, carry the term-frequency signal of a bi-encoder?

The built-in task follows Chen et al. (2024)'s TFC1 diagnostic: from each corpus sentence s a query term w that
occurs once in s and is one word piece; clean document ``s + " " + w`` (w now occurs twice), corrupted document
``s + " " + filler`` (default "the"); metric = cosine of the mean-pooled embeddings of w and the document (the
bundled sentence-transformers model's pooling). On those pairs (written to ``OUT/circuits/task.jsonl``, the
format ``bertscope circuits --task`` reads):

1. head scores by exact patching (corrupted -> clean, one head at a time), AtP, AtP* and EAP-IG, side by side;
2. the residual stream at the injected position patched alone, per layer (with mean pooling that token's own
   stream carries part of the effect directly);
3. edge scores on the frozen-LayerNorm graph (EAP-IG), a circuit found by greedy pruning with exact patching,
   MIB's faithfulness curve with CPR/CMD against random edge orders, random circuits of the circuit's size;
4. overlap of the circuit's heads with the same-token experiment's duplicate heads (same run, if present),
   against chance (hypergeometric).

Tables: ``results`` (long: model, corpus, method, source, node, layer, head, effect, normalised and intervals:
95% percentile bootstrap over pairs; ``normalised`` = the head's effect / (m(corrupted) - m(clean))),
``agreement`` (Spearman of each estimate with exact patching over heads, with a 95% percentile bootstrap
interval over pairs: pairs resampled, every method's mean head scores recomputed), ``cost``, ``resid``, ``edges``,
``edge_check`` (path patching of top and random edges beside their scores), ``circuit``, ``faithfulness``,
``areas``, ``random_circuits``, ``overlap``. Definitions and equations:
``docs/experiments/circuits.md``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd
from bertscope.experiments import io
from bertscope.experiments.circuits import measures
from bertscope.experiments.options import sentences_used
from bertscope.experiments.registry import CannotRun
from bertscope.hooks import circuits

NAME = "circuits"
DIRNAME = "circuits"

#: why ``--activations`` cannot stand in for this experiment's forward (``bertscope run circuits`` refuses it;
#: ``run all`` runs circuits' own forwards and says so)
NO_ACTIVATIONS = ("it patches activations between clean and corrupted runs and takes gradients, which needs the "
                  "model, not stored activations")
SUMMARY_TABLES = ["agreement", "areas"]


@dataclass(frozen=True)
class Settings:
    """Sizes and choices of the circuits run (recorded in the manifest)."""

    n_pairs: int = 16  # TFC1 pairs at most, one per sentence (--max-sentences caps the sentences they come from)
    max_tokens: int = 24  # longest clean document, word pieces with [CLS]/[SEP]
    filler: str = "the"
    query_pieces: int = 1  # word pieces the query term (and the filler) add to the sentence: 1 in TFC1
    ig_steps: int = 3
    edge_method: str = "eap-ig"
    candidates: int = 20
    threshold: float = 0.02
    n_random: int = 2
    n_random_circuits: int = 10
    checked_edges: int = 3  # path patching (~20 forward-equivalents an edge) of this many top and random edges
    n_boot: int = 1000


CONVENTIONS = {
    "effect": "mean over pairs of m(clean run with the node patched from the corrupted run) - m(clean); AtP, AtP* "
    "and EAP-IG rows are estimates of the same quantity",
    "normalised": "sum over pairs of effects / sum over pairs of (m(corrupted) - m(clean))",
    "ci": "95% percentile bootstrap over pairs (resampling pairs)",
    "edges": "frozen-LayerNorm EAP-IG scores, mean over pairs; circuits evaluated on the frozen-LN model",
    "edge_check": "path patching on the frozen-LN model: the sender's corrupted output reaches only that receiver, "
    "everything downstream recomputed; mean over pairs of m - m(clean), the quantity an edge score estimates",
    "faithfulness": "(m(circuit) - m(empty)) / (m(full) - m(empty)); CPR/CMD: MIB's trapezoids over the fraction "
    "of edges (0.001..1)",
}


def run(ctx: Any, settings: Settings | None = None) -> pd.DataFrame:
    """Build the TFC1 task from the corpus, run :func:`measures.analyse`, write the side tables and ``task.jsonl``;
    returns the long head-score table."""
    settings = ctx.use_settings(settings)
    model = ctx.model
    n_scan, why = sentences_used(ctx.options.max_sentences, None, len(ctx.corpus))
    pairs = measures.tfc1_pairs([s.words for s in ctx.corpus[:n_scan]], model.tokenizer, filler=settings.filler,
                                max_pairs=settings.n_pairs, max_tokens=settings.max_tokens, seed=ctx.seed,
                                query_pieces=settings.query_pieces)
    if len(pairs) < 2:
        raise CannotRun(f"the corpus gave {len(pairs)} TFC1 pairs (a pair needs a sentence with a word "
                        f"that occurs once and, appended, adds {settings.query_pieces} piece(s), as the filler "
                        f"{settings.filler!r} must; at most {settings.max_tokens} pieces in all); at least 2 are "
                        "needed for intervals over pairs")
    ctx.log(f"{len(pairs)} TFC1 pairs (at most {settings.n_pairs}, --set circuits.n_pairs=N) from the first "
            f"{n_scan} sentences of {ctx.corpus_id} ({why})")
    task = circuits.make_task(model, pairs, "cosine")
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    io.write_text(ctx.out_dir / "task.jsonl", "".join(_json(p) + "\n" for p in task.pairs))
    ctx.note("settings", asdict(settings))
    ctx.note("pairs", len(pairs))
    ctx.record_used({"pairs": len(pairs)}, available=n_scan, unit="TFC1 pairs (one sentence each)",
                    more="--set circuits.n_pairs=N")  # what the intervals resample: pairs
    ctx.note("conventions", CONVENTIONS)
    known = {f.name for f in fields(measures.AnalysisSettings)}
    analysis = measures.AnalysisSettings(**{k: v for k, v in asdict(settings).items() if k in known},
                                         batch_size=ctx.options.batch_size)
    tables = measures.analyse(model, task, analysis, positions=measures.injected_positions(task),
                              progress=ctx.log, seed=ctx.seed)
    if "agreement" not in tables:
        tables["agreement"] = agreement(tables["heads"])
    tables["overlap"] = overlap_table(tables, ctx.out_dir.parent, ctx.corpus_id, model.config)
    for name, df in tables.items():
        if name != "heads":
            ctx.write_table(df, name)
    heads = tables["heads"]
    heads.insert(0, "corpus", ctx.corpus_id)
    heads.insert(0, "model", ctx.model_id)
    return heads


def agreement(heads: pd.DataFrame) -> pd.DataFrame:
    """Spearman (and Pearson) over heads of each estimate's effect with exact patching's."""
    wide = heads.pivot_table(index="node", columns="method", values="effect")
    rows = []
    for method in wide.columns:
        if method == "exact":
            continue
        rows.append({"method": method, "spearman": wide[method].corr(wide["exact"], method="spearman"),
                     "pearson": wide[method].corr(wide["exact"]), "n_heads": len(wide)})
    return pd.DataFrame(rows)


def overlap_table(tables: dict[str, pd.DataFrame], out_root: Path, corpus_id: str, config: Any) -> pd.DataFrame:
    """Overlap of the circuit's heads (and of the top exact-patching heads, as many as there are duplicate heads)
    with the same-token duplicate heads, against chance; empty when same-token has not run into this folder."""
    dup = measures.duplicate_heads(out_root, corpus_id)
    if not dup:
        return pd.DataFrame(columns=["heads", "overlap", "n_found", "n_other", "expected", "p_value"])
    n = config.n_layers * config.n_heads
    found = {_head(node) for node in set(tables["circuit"].sender) | set(tables["circuit"].receiver)
             if node.startswith("a")}
    exact = tables["heads"][tables["heads"].method == "exact"]
    top = exact.reindex(exact.normalised.abs().sort_values(ascending=False).index).head(len(dup))
    rows = [{"heads": "circuit", **measures.head_overlap(found, dup, n)},
            {"heads": f"top {len(dup)} by exact patching", **measures.head_overlap(
                {(int(r.layer), int(r.head)) for r in top.itertuples()}, dup, n)}]
    return pd.DataFrame(rows)


def _head(node: str) -> tuple[int, int]:
    layer, head = node[1:].split(".h")
    return int(layer), int(head)


def _json(p: dict) -> str:
    import json

    return json.dumps(p)
