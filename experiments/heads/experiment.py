"""Experiment `heads`: what each attention head does and how much the model depends on it.

Claim under test (seed tutorials): "each head focuses on one aspect of similarity: one may capture
subject-verb interaction, another nearby adjectives". One run measures every head with the field's standard
measures and writes, under ``OUT/heads/``:

- ``results.parquet|csv``: long table ``model, corpus, layer, head, metric, value, ci_low, ci_high, n``
  (``n`` = sentences, or arcs for ``syntax:*``); model-level rows have empty ``layer``/``head``.
  Metrics: attention statistics (Clark et al. 2019; ``statistics``), their norm-weighted versions
  (Kobayashi et al. 2020; ``norm_*``), the argmax-offset histogram (``argmax_offset=k``), head-by-relation
  syntax accuracy (``syntax:<relation>:<direction>``), ablation effects (``ablation:<method>:<measure>``),
  gradient importance (``grad_importance:<objective>``, Michel et al. 2019), the within/between-layer
  distance ratio, and the rank correlation between gradient importance and ablation effect.
- ``roles.csv`` (rule, statistic, value, threshold, assigned: one row per head and rule), ``roles_by_head.csv``
  (one line per head), ``syntax.csv`` (best head per relation against the best offset baseline),
  ``distances.parquet`` (sqrt-JSD between heads), ``mds.csv`` (2-D map), ``pruning.csv`` (pruning curves).
- figures (``plots``), redrawn from those tables by ``plot(out_dir)``.

Sentences are weighted equally; CIs are percentile bootstraps over sentences (``probes.bootstrap``). On the bundled
model and the builtin corpus the importance pass (ablations and 26 pruning orders on 32 sentences) is most of the
model work (docs/experiments/heads.md, "Known limits", has the measurements).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from bertscope.experiments.activations import open_capture
from bertscope.experiments.heads import data, measures
from bertscope.experiments.heads import gradients as grads
from bertscope.experiments.heads import importance as imp
from bertscope.experiments.heads import similarity as sim
from bertscope.experiments.heads import syntax as syn
from bertscope.experiments.heads.measures import attention_table, head_stats_wide  # noqa: F401 (homes before)
from bertscope.experiments.heads.plots import plot  # noqa: F401 (old name `experiment.plot`; it lives in plots)
from bertscope.experiments.heads.roles import SYNTAX_THRESHOLD, assign_roles, role_summary
from bertscope.experiments.options import sentences_used

NAME = "heads"
DIRNAME = "heads"
SUMMARY_TABLES = ["roles_by_head", "syntax", "top_heads", "pruning"]
RESULT_COLUMNS = measures.RESULT_COLUMNS
PUNCTUATION = data.PUNCTUATION
SCALARS = data.SCALARS  # per-sentence statistics, in array order


@dataclass(frozen=True)
class Settings:
    """Defaults of a run (recorded in the manifest's notes)."""

    max_sentences: int = 400  # attention statistics and syntax
    distance_sentences: int = 128  # head-by-head distances (cost grows with heads^2 * length^2)
    importance_sentences: int = 32  # ablation (3 methods x every head), gradients, pruning
    # Sentences per batch of the importance pass. The masked-LM draws are made batch by batch (part of a seeded MLM
    # result); the ablation and pruning forwards then run one sentence at a time without padding, the masks of one
    # restart layer forking from its clean residual (importance.forward_with_heads).
    importance_batch: int = 4
    # Processes for the attention pass (by batch) and the ablation and pruning forwards (by sentence): forked, one
    # torch thread each; bit-identical for any value >= 2, equal to the in-process loop (1) to float rounding.
    workers: int = 2
    gradient_batch: int = 16  # sentences per gradient pass (its random projections are drawn batch by batch)
    methods: tuple[str, ...] = imp.METHODS  # ablations: zero, mean (the head's mean output z), uniform (attention)
    n_boot: int = 1000  # bootstrap resamples (over sentences) behind every interval
    ci: float = 0.95  # level of every percentile interval
    offset_bins: int = 8  # argmax-offset histogram reported for -8..8 (plus the two tails)
    syntax_min_arcs: int = 10  # relations with fewer arcs are left out of syntax.csv (named in a warning)
    collapse_subtypes: bool = False  # True: nmod:poss counts as nmod (Clark et al. keep subtypes apart)
    role_min_arcs: int = 50  # relations with fewer arcs do not count for the syntactic role (noise)
    role_min_sentences: int = 50  # fewer sentences with gold trees: roles are still assigned, with a warning
    role_fdr: float = 0.05  # Benjamini-Hochberg false-discovery rate over head x relation candidates
    n_projections: int = 4  # random directions per sentence for gradient importance without an MLM head
    # Points on each pruning curve (plus k = 0): k = 0, 12, ..., 72 heads removed on the bundled model. Was 12; 6
    # keeps every other count of those 12 (the same masks, so the same values and intervals to float precision,
    # the middle point k = 36 that the findings quote included) and halves the pruning masks (about 220 -> 100
    # distinct masks x 32 sentences), the largest cost of the run (docs/experiments/heads.md, "Known limits").
    pruning_points: int = 6
    pruning_random_orders: int = 20  # random pruning orders (interval over sentences crossed with orders)
    top_k: int = 5  # most important heads reported held-out (top_heads.csv)

    def __post_init__(self) -> None:
        from bertscope.experiments.settings import require

        require(self, positive=("max_sentences", "distance_sentences", "importance_sentences", "importance_batch",
                                "workers", "gradient_batch", "n_boot", "offset_bins", "n_projections",
                                "pruning_points", "pruning_random_orders", "top_k"),
                non_negative=("syntax_min_arcs", "role_min_arcs", "role_min_sentences"), fraction=("ci", "role_fdr"),
                subsets={"methods": imp.METHODS}, non_empty=("methods",))


def run(ctx: Any, settings: Settings | None = None) -> pd.DataFrame:
    """Compute every table of the experiment (see the module docstring); returns the results table."""
    settings = ctx.use_settings(settings)
    n_layers, n_heads = ctx.model.config.n_layers, ctx.model.config.n_heads
    corpus, importance_corpus = _record_inputs(ctx, settings)
    arrays, reported, eval_name = _attention_passes(ctx, settings, corpus)
    frames = [measures.attention_table(reported["scalars"], reported["offsets"], settings, ctx.seed),
              measures.ratio_rows(reported["distances"], n_layers, n_heads, settings, ctx.seed)]
    syntax_tab, syntax_gains = None, None
    if "head_hits" in arrays and len(arrays["head_hits"]):
        syntax_rows, syntax_tab, syntax_gains = _syntax(ctx, settings, arrays, reported, eval_name)
        frames.append(syntax_rows)
    else:
        ctx.log("corpus has no gold dependencies: syntax scores and the syntactic role are skipped")
    importance = _importance_pass(ctx, settings, importance_corpus)
    frames.append(measures.importance_rows(importance, settings, ctx.seed))
    results = measures.results_table(frames, {"model": ctx.model_id, "corpus": ctx.corpus_id}, eval_name)
    _write_side_tables(ctx, results, syntax_gains, syntax_tab, reported["distances"], importance, settings)
    return results


def _record_inputs(ctx: Any, settings: Settings) -> tuple[Any, Any]:
    """The sentences of the attention pass and of the importance pass, logged and noted (part of ``run``)."""
    if getattr(ctx.model.config, "attention_projections", True) is False:
        ctx.log("raw attention (no projections): W_O is a fixed head selection; norm-weighted masses use it")
    n_used, why = sentences_used(ctx.options.max_sentences, settings.max_sentences, len(ctx.corpus))
    corpus = ctx.corpus[:n_used]
    ctx.log(f"{n_used} sentences of {ctx.corpus_id} ({why})")
    importance_corpus = ctx.corpus[: settings.importance_sentences]
    ctx.note("settings", asdict(settings))
    ctx.note("n_sentences", len(corpus))
    ctx.note("n_distance_sentences", min(len(corpus), settings.distance_sentences))
    ctx.note("n_importance_sentences", len(importance_corpus))
    ctx.record_used({"attention and syntax": len(corpus), "distances": min(len(corpus), settings.distance_sentences),
                     "importance": len(importance_corpus)}, available=len(ctx.corpus),
                    more="--set heads.max_sentences=N (and heads.distance_sentences, heads.importance_sentences)")
    ctx.note("queries", "all real tokens of a sentence ([CLS] and [SEP] included); each sentence weighted equally")
    return corpus, importance_corpus


def _attention_passes(ctx: Any, settings: Settings, corpus: Any) -> tuple[dict, dict, str | None]:
    """The cached attention pass over ``corpus`` and, with ``--eval-corpus``, over the evaluation sentences:
    ``(arrays, reported, eval_name)``, ``reported`` being the arrays every reported number comes from."""
    model = ctx.model
    batches = list(ctx.encode(corpus).batches)
    arrays = ctx.step_arrays(
        "attention_pass", lambda: data.attention_pass(model, batches, corpus, settings, progress=ctx.progress,
                                                      capture=open_capture(ctx.options.activations, model))
    )
    if int(arrays["n_truncated"]):
        ctx.warn(f"{int(arrays['n_truncated'])} truncated sentences left out of the syntax scores")
    eval_corpus = getattr(ctx.inputs, "eval_corpus", None)
    if eval_corpus is None:
        return arrays, arrays, None
    eval_name = str(eval_corpus.name)  # --eval-corpus: select on --corpus (above), report on these sentences
    n_eval, _ = sentences_used(None, settings.max_sentences, len(eval_corpus))
    evaluated = eval_corpus[:n_eval]
    ctx.log(f"reporting on {n_eval} sentences of {eval_name} (--eval-corpus); every selection uses "
            f"{ctx.corpus_id}")
    ctx.note("eval_corpus", {"name": eval_name, "n_sentences": n_eval})
    eval_batches = list(ctx.encode(evaluated).batches)  # a capture holds --corpus only: run the model
    reported = ctx.step_arrays("attention_pass_eval", lambda: data.attention_pass(
        model, eval_batches, evaluated, settings, progress=ctx.progress))  # fmt: skip
    if int(reported["n_truncated"]):
        ctx.warn(f"{int(reported['n_truncated'])} truncated --eval-corpus sentences left out of the syntax scores")
    return arrays, reported, eval_name


def _syntax(ctx: Any, settings: Settings, arrays: dict, reported: dict,
            eval_name: str | None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Syntax rows of ``results``, the held-out syntax table and the per-head gains (part of ``run``)."""
    hits = measures.arc_hits(arrays)
    eval_hits = None
    if eval_name is not None:
        if "head_hits" not in reported or not len(reported["head_hits"]):
            from bertscope.experiments.registry import CannotRun

            raise CannotRun(f"--eval-corpus {eval_name!r} has no scorable gold dependency arcs")
        eval_hits = measures.arc_hits(reported)
    rows = measures.syntax_rows(syn.head_relation_accuracy(hits if eval_hits is None else eval_hits))
    syntax_tab, syntax_gains = _syntax_selection(ctx, hits, settings, eval_hits, eval_name)
    return rows, syntax_tab, syntax_gains


def _importance_pass(ctx: Any, settings: Settings, importance_corpus: Any) -> dict[str, np.ndarray]:
    """The cached ablation, gradient and pruning pass on the importance sentences, with its notes."""
    model = ctx.model
    n_ablated = model.config.n_layers * model.config.n_heads
    ctx.log(f"ablating {n_ablated} heads x {len(settings.methods)} methods on {len(importance_corpus)} sentences")
    importance_batches = list(ctx.encode(importance_corpus, batch_size=settings.importance_batch).batches)
    gradient_batches = list(ctx.encode(importance_corpus, batch_size=settings.gradient_batch).batches)
    importance = ctx.step_arrays("importance", lambda: data.importance_pass(
        model, importance_batches, settings, seed=ctx.seed, rng=ctx.rng("pruning"), progress=ctx.progress,
        gradient_batches=gradient_batches,
    ))  # fmt: skip
    objective = str(importance["objective"])
    ctx.note("ablation_methods", {m: imp.METHOD_DESCRIPTIONS[m] for m in settings.methods})
    ctx.note("gradient_objective", {objective: grads.OBJECTIVE_DESCRIPTIONS[objective]})
    ctx.note("mlm_head", imp.has_mlm_head(model))
    if not imp.has_mlm_head(model):
        ctx.log("the model has no masked-LM head: no mlm_loss_change; gradient importance uses a projection "
                "objective, a consistency check kept out of the findings (not Michel et al.'s score)")
    return importance


def check(inputs: Any, settings: Settings) -> None:
    """With ``--eval-corpus``: refuse (`registry.CannotRun`) an evaluation corpus without gold trees when
    ``--corpus`` has them (the syntax scores would have nothing to report on), before anything is written."""
    from bertscope.experiments.registry import CannotRun

    eval_corpus = getattr(inputs, "eval_corpus", None)
    if eval_corpus is None:
        return
    if len(eval_corpus) < 2:
        raise CannotRun(f"--eval-corpus {eval_corpus.name!r} needs at least 2 sentences")
    if inputs.corpus.has_syntax and not eval_corpus.has_syntax:
        raise CannotRun(f"--eval-corpus {eval_corpus.name!r} has no gold dependency trees, and --corpus "
                        f"{inputs.corpus.name!r} has: give a .conllu evaluation corpus")


def _write_side_tables(
    ctx: Any,
    results: pd.DataFrame,
    syntax_gains: pd.DataFrame | None,
    syntax_tab: pd.DataFrame | None,
    distances: np.ndarray,
    importance: dict[str, np.ndarray],
    settings: Settings,
) -> None:
    """Roles, syntax, distances, MDS, pruning and roles-by-head tables (part of ``run``: it writes files)."""
    n_layers, n_heads = ctx.model.config.n_layers, ctx.model.config.n_heads
    mean_distance = distances.mean(0)
    head_stats = measures.head_stats_wide(results)
    roles = assign_roles(head_stats, syntax_gains, min_arcs=settings.role_min_arcs, fdr=settings.role_fdr)
    ctx.write_table(roles, "roles", formats=("csv",))
    if syntax_tab is not None:
        ctx.write_table(syntax_tab, "syntax", formats=("csv",))
        ctx.write_table(syntax_gains, "syntax_heads", formats=("csv",))
    ctx.write_table(measures.distance_table(mean_distance, n_layers, n_heads, len(distances)), "distances",
                    formats=("parquet",))  # fmt: skip
    coords = sim.mds_embedding(mean_distance, seed=ctx.seed)
    ctx.write_table(measures.mds_table(coords, n_layers, n_heads, roles), "mds", formats=("csv",))
    pruning_tab = measures.pruning_table(importance, settings, ctx.seed)
    top = measures.top_heads_table(importance, n_heads, settings, ctx.seed)
    if getattr(ctx.inputs, "eval_corpus", None) is not None:  # the importance pass stays on --corpus (halves)
        pruning_tab["corpus"] = top["corpus"] = ctx.corpus_id
    ctx.write_table(pruning_tab, "pruning", formats=("csv",))
    ctx.write_table(top, "top_heads", formats=("csv",))
    summary = role_summary(roles)
    ctx.write_table(summary, "roles_by_head", formats=("csv",))
    ctx.log("roles: " + ", ".join(f"{r}={c}" for r, c in summary["primary_role"].value_counts().items()))


def activation_sites(model: Any) -> list[str]:
    """The sites the attention pass reads (what ``--activations`` must hold); the importance and gradient
    passes intervene on the model, so they always run it."""
    return data.attention_sites(model.config.n_layers)




def _syntax_selection(ctx: Any, hits: syn.ArcHits, settings: Settings, eval_hits: syn.ArcHits | None = None,
                      eval_name: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Held-out headline table and per-head held-out gains (for the syntactic role), with the warnings due.
    With ``eval_hits`` (--eval-corpus) every choice is made on ``hits`` and scored on ``eval_hits``."""
    ctx.note("n_arcs", int(len(hits.relations)))
    skipped = syn.skipped_relations(hits, settings.syntax_min_arcs)
    if skipped:
        names = ", ".join(f"{r} ({n})" for r, n in sorted(skipped.items()))
        ctx.warn(f"relations with fewer than {settings.syntax_min_arcs} arcs left out of syntax.csv "
                 f"(Settings.syntax_min_arcs): {names}")  # fmt: skip
    n_sentences = len(np.unique(hits.sentences))
    if n_sentences < settings.role_min_sentences:
        ctx.warn(f"roles assigned from only {n_sentences} sentences with gold trees "
                 f"(< {settings.role_min_sentences}, Settings.role_min_sentences): the syntactic role's held-out "
                 "halves are small and unstable")  # fmt: skip
    boot = {"seed": ctx.seed, "n_boot": settings.n_boot, "ci": settings.ci}
    if eval_hits is not None:
        names = {"select_name": ctx.corpus_id, "eval_name": eval_name}
        table = syn.syntax_table_eval(hits, eval_hits, min_arcs=settings.syntax_min_arcs, **boot, **names)
        gains = syn.heldout_head_gains_eval(hits, eval_hits, min_arcs=settings.role_min_arcs,
                                            threshold=SYNTAX_THRESHOLD, **boot, **names)  # fmt: skip
        return table, gains
    table = syn.syntax_table(hits, min_arcs=settings.syntax_min_arcs, **boot)
    gains = syn.heldout_head_gains(hits, min_arcs=settings.role_min_arcs, threshold=SYNTAX_THRESHOLD, **boot)
    return table, gains


