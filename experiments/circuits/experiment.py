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
interval over pairs: pairs resampled, every method's mean head scores recomputed; beside it Kramár et al.'s
top-k recall, k = 5, 10, 20, and E|effect| of exact patching and of the estimate, each with its interval, and
``reference``: a magnitude estimate, AtP*, is compared with the mean of |effect|), ``cost``, ``resid``, ``edges``,
``edge_check`` (path patching of top and random edges beside their scores), ``circuit``, ``faithfulness``,
``areas``, ``random_circuits``, ``overlap``. Definitions and equations:
``docs/experiments/circuits.md``.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from bertscope.experiments import io
from bertscope.experiments.circuits import data, measures
from bertscope.experiments.options import sentences_used
from bertscope.experiments.registry import CannotRun
from bertscope.hooks import circuits
from bertscope.hooks.circuits import table
from bertscope.hooks.circuits.table import DEFAULTS
from bertscope.hooks.naming import head_of

NAME = "circuits"
DIRNAME = "circuits"

#: why ``--activations`` cannot stand in for this experiment's forward (``bertscope run circuits`` refuses it;
#: ``run all`` runs circuits' own forwards and says so)
NO_ACTIVATIONS = ("it patches activations between clean and corrupted runs and takes gradients, which needs the "
                  "model, not stored activations")
SUMMARY_TABLES = ["agreement", "areas"]


@dataclass(frozen=True)
class Settings:
    """Sizes and choices of the circuits analysis: the one set of defaults of ``bertscope run circuits``, the old
    ``bertscope circuits`` command and the Python functions (``hooks.circuits.table.DEFAULTS``); recorded in the
    manifest. Checked when built (a bad ``--set`` is one line, exit 2, before any work)."""

    task: str = ""  # a pairs JSONL file to analyse (--task FILE); empty: the built-in TFC1 task made from the corpus
    metric: str = "cosine"  # the task file's metric (--metric): cosine, dot or mask-logit-diff; TFC1's is cosine
    task_sha256: str = ""  # filled in from the task file's bytes (an edited file is a new run, not a finished one)
    n_pairs: int = 16  # TFC1 pairs at most, one per sentence (--max-sentences caps the sentences they come from)
    max_tokens: int = 24  # longest clean document, word pieces with [CLS]/[SEP]
    filler: str = "the"
    query_pieces: int = 1  # word pieces the query term (and the filler) add to the sentence: 1 in TFC1
    # head-score methods, from the node attribution table (hooks/circuits/table.py); default: its default ones
    methods: tuple[str, ...] = field(default_factory=lambda: table.node_methods(default=True))
    ig_steps: int = DEFAULTS.ig_steps  # integrated-gradient steps (EAP-IG head scores and edges)
    edge_method: str = DEFAULTS.edge_method  # an edge method of the edge table (eap, eap-ig)
    candidates: int = DEFAULTS.candidates  # greedy search starts from this many top edges
    threshold: float = DEFAULTS.threshold  # an edge stays when dropping it moves m by this share of m(full)-m(empty)
    n_random: int = DEFAULTS.n_random  # random edge orders for the faithfulness-curve control
    n_random_circuits: int = DEFAULTS.n_random_circuits  # random circuits of the found circuit's size
    top_edges: int = DEFAULTS.top_edges  # rows of the edges table kept
    checked_edges: int = DEFAULTS.checked_edges  # path patching (~20 forward-equivalents an edge) of top/random edges
    n_boot: int = 1000

    def __post_init__(self) -> None:
        """Refuse settings no run could use (each message names the setting)."""
        if self.n_pairs < DEFAULTS.min_pairs:
            raise ValueError(f"n_pairs must be at least {DEFAULTS.min_pairs} (intervals over pairs), got "
                             f"{self.n_pairs}")
        for name in ("max_tokens", "query_pieces", "ig_steps", "candidates", "n_boot"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("n_random", "n_random_circuits", "top_edges", "checked_edges"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.threshold < 1:
            raise ValueError(f"threshold must be in [0, 1), got {self.threshold}")
        if not self.filler.strip():
            raise ValueError("filler must be a word, got an empty text")
        bad = [m for m in self.methods if m not in table.NODE_TABLE]
        if bad or not self.methods:
            raise ValueError(f"methods: unknown {', '.join(bad) or '(none given)'}; choose from "
                             f"{', '.join(table.NODE_TABLE)}")
        table.edge_method(self.edge_method)
        if self.metric not in circuits.METRICS:
            raise ValueError(f"unknown metric {self.metric!r}; choose one of {', '.join(circuits.METRICS)}")
        if not self.task and self.metric != "cosine":
            raise ValueError(f"metric {self.metric!r} needs a task file (--task FILE); the TFC1 task's metric is "
                             "cosine")
        if self.task:
            circuits.tasks.read_pairs(self.task)  # TaskError (a ValueError) naming the file and line
            digest = hashlib.sha256(Path(self.task).read_bytes()).hexdigest()
            object.__setattr__(self, "task_sha256", digest)


measures.AnalysisSettings = Settings  # the old name of the analysis' settings: one class now

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


def check(inputs: Any, settings: Settings) -> None:
    """Before anything is written: a task file (``--task``) must build a task for this model (equal lengths, the
    metric's fields, a masked-LM head for mask-logit-diff) with at least ``DEFAULTS.min_pairs`` pairs."""
    if settings.task:
        _task_file(inputs.model, settings)


def run(ctx: Any, settings: Settings | None = None) -> pd.DataFrame:
    """Build the task (the TFC1 pairs from the corpus, or ``settings.task``'s file), run :func:`measures.analyse`,
    write the side tables and ``task.jsonl``; returns the long head-score table."""
    settings = ctx.use_settings(settings)
    model = ctx.model
    if settings.task:
        task = _task_file(model, settings)
        pairs = task.pairs
        ctx.log(f"{task.n_pairs} pairs from {settings.task} (metric {settings.metric})")
    else:
        pairs = _tfc1(ctx, settings)
        task = circuits.make_task(model, pairs, "cosine")
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    io.write_text(ctx.out_dir / "task.jsonl", "".join(_json(p) + "\n" for p in task.pairs))
    ctx.note("settings", asdict(settings))
    ctx.note("pairs", len(pairs))
    if settings.task:  # what the intervals resample: pairs
        ctx.record_used({"pairs": len(pairs)}, unit=f"pairs of the task file {Path(settings.task).name}")
    ctx.note("conventions", CONVENTIONS)
    positions = None if settings.task else data.injected_positions(task)
    tables = measures.analyse(model, task, settings, positions=positions, progress=ctx.log, seed=ctx.seed,
                              batch_size=ctx.options.batch_size)
    if "agreement" not in tables:
        tables["agreement"] = agreement(tables["heads"])
    tables["overlap"] = overlap_table(tables, ctx.out_dir.parent, ctx.corpus_id, model.config)
    for name, df in tables.items():
        if name != "heads":
            ctx.write_table(df, name)
    heads = tables["heads"]
    heads.insert(0, "corpus", settings.task or ctx.corpus_id)
    heads.insert(0, "model", ctx.model_id)
    return heads


def _tfc1(ctx: Any, settings: Settings) -> list[dict]:
    n_scan, why = sentences_used(ctx.options.max_sentences, None, len(ctx.corpus))
    pairs = data.tfc1_pairs([s.words for s in ctx.corpus[:n_scan]], ctx.model.tokenizer,
                            filler=settings.filler, max_pairs=settings.n_pairs, max_tokens=settings.max_tokens,
                            seed=ctx.seed, query_pieces=settings.query_pieces)
    if len(pairs) < DEFAULTS.min_pairs:
        raise CannotRun(f"the corpus gave {len(pairs)} TFC1 pairs (a pair needs a sentence with a word "
                        f"that occurs once and, appended, adds {settings.query_pieces} piece(s), as the filler "
                        f"{settings.filler!r} must; at most {settings.max_tokens} pieces in all); at least "
                        f"{DEFAULTS.min_pairs} are needed for intervals over pairs")
    ctx.log(f"{len(pairs)} TFC1 pairs (at most {settings.n_pairs}, --set circuits.n_pairs=N) from the first "
            f"{n_scan} sentences of {ctx.corpus_id} ({why})")
    ctx.record_used({"pairs": len(pairs)}, available=n_scan, unit="TFC1 pairs (one sentence each)",
                    more="--set circuits.n_pairs=N")  # what the intervals resample: pairs
    return pairs


def _task_file(model: Any, settings: Settings) -> circuits.Task:
    """The task of ``settings.task`` for ``model``; `CannotRun` (one line) when it cannot be built or has fewer
    pairs than an interval over pairs needs."""
    try:
        task = circuits.load_task(model, settings.task, settings.metric)
    except circuits.TaskError as e:
        raise CannotRun(str(e)) from None
    if task.n_pairs < DEFAULTS.min_pairs:
        raise CannotRun(f"{settings.task} has {task.n_pairs} pair(s); at least {DEFAULTS.min_pairs} are needed "
                        "for intervals over pairs")
    return task


def agreement(heads: pd.DataFrame) -> pd.DataFrame:
    """Spearman (and Pearson) over heads of each estimate's effect with exact patching's (a magnitude estimate,
    ``signed=False`` in the node table, with |exact patching's mean effect|: only means are at hand here)."""
    wide = heads.pivot_table(index="node", columns="method", values="effect")
    rows = []
    for method in wide.columns:
        if method == "exact":
            continue
        spec = table.NODE_TABLE.get(method)
        ref = wide["exact"] if spec is None or spec.signed else wide["exact"].abs()
        rows.append({"method": method, "spearman": wide[method].corr(ref, method="spearman"),
                     "pearson": wide[method].corr(ref), "n_heads": len(wide)})
    return pd.DataFrame(rows)


def overlap_table(tables: dict[str, pd.DataFrame], out_root: Path, corpus_id: str, config: Any) -> pd.DataFrame:
    """Overlap of the circuit's heads (and of the top exact-patching heads, as many as there are duplicate heads)
    with the same-token duplicate heads, against chance; empty when same-token has not run into this folder."""
    dup = measures.duplicate_heads(out_root, corpus_id)
    if not dup:
        return pd.DataFrame(columns=["heads", "overlap", "n_found", "n_other", "expected", "p_value"])
    n = config.n_layers * config.n_heads
    found = {head_of(node) for node in set(tables["circuit"].sender) | set(tables["circuit"].receiver)
             if head_of(node)}
    exact = tables["heads"][tables["heads"].method == "exact"]
    top = exact.reindex(exact.normalised.abs().sort_values(ascending=False).index).head(len(dup))
    rows = [{"heads": "circuit", **measures.head_overlap(found, dup, n)},
            {"heads": f"top {len(dup)} by exact patching", **measures.head_overlap(
                {(int(r.layer), int(r.head)) for r in top.itertuples()}, dup, n)}]
    return pd.DataFrame(rows)


def _json(p: dict) -> str:
    import json

    return json.dumps(p)
