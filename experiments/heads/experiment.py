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

import einops
import numpy as np
import pandas as pd
from bertscope.experiments.activations import open_capture
from bertscope.experiments.heads import gradients as grads
from bertscope.experiments.heads import importance as imp
from bertscope.experiments.heads import passes
from bertscope.experiments.heads import similarity as sim
from bertscope.experiments.heads import statistics as hs
from bertscope.experiments.heads import syntax as syn
from bertscope.experiments.heads.plots import plot  # noqa: F401 (old name `experiment.plot`; it lives in plots)
from bertscope.experiments.heads.roles import SYNTAX_THRESHOLD, assign_roles, role_summary
from bertscope.experiments.naming import head_name
from bertscope.experiments.options import sentences_used
from bertscope.probes.bootstrap import group_bootstrap, mean_of_groups

NAME = "heads"
DIRNAME = "heads"
SUMMARY_TABLES = ["roles_by_head", "syntax", "top_heads", "pruning"]
RESULT_COLUMNS = ["model", "corpus", "layer", "head", "metric", "value", "ci_low", "ci_high", "n"]
PUNCTUATION = passes.PUNCTUATION
SCALARS = passes.SCALARS  # per-sentence statistics, in array order


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
    model = ctx.model
    if getattr(model.config, "attention_projections", True) is False:
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
    label = {"model": ctx.model_id, "corpus": ctx.corpus_id}
    n_layers, n_heads = model.config.n_layers, model.config.n_heads

    batches = list(ctx.encode(corpus).batches)
    arrays = ctx.step_arrays(
        "attention_pass", lambda: passes.attention_pass(model, batches, corpus, settings, progress=ctx.progress,
                                                        capture=open_capture(ctx.options.activations, model))
    )
    if int(arrays["n_truncated"]):
        ctx.warn(f"{int(arrays['n_truncated'])} truncated sentences left out of the syntax scores")
    eval_corpus = getattr(ctx.inputs, "eval_corpus", None)
    reported, eval_name = arrays, None  # the arrays every reported number comes from
    if eval_corpus is not None:  # --eval-corpus: select on --corpus (above), report on these sentences
        eval_name = str(eval_corpus.name)
        n_eval, _ = sentences_used(None, settings.max_sentences, len(eval_corpus))
        evaluated = eval_corpus[:n_eval]
        ctx.log(f"reporting on {n_eval} sentences of {eval_name} (--eval-corpus); every selection uses "
                f"{ctx.corpus_id}")
        ctx.note("eval_corpus", {"name": eval_name, "n_sentences": n_eval})
        eval_batches = list(ctx.encode(evaluated).batches)  # a capture holds --corpus only: run the model
        reported = ctx.step_arrays("attention_pass_eval", lambda: passes.attention_pass(
            model, eval_batches, evaluated, settings, progress=ctx.progress))  # fmt: skip
        if int(reported["n_truncated"]):
            ctx.warn(f"{int(reported['n_truncated'])} truncated --eval-corpus sentences left out of the syntax scores")
    frames = [attention_table(reported["scalars"], reported["offsets"], settings, ctx.seed)]
    distances = reported["distances"]  # [sentence, layer*head, layer*head]
    frames.append(_ratio_rows(distances, n_layers, n_heads, settings, ctx.seed))

    syntax_gains, syntax_tab = None, None
    if "head_hits" in arrays and len(arrays["head_hits"]):
        hits = _arc_hits(arrays)
        eval_hits = None
        if eval_name is not None:
            if "head_hits" not in reported or not len(reported["head_hits"]):
                from bertscope.experiments.registry import CannotRun

                raise CannotRun(f"--eval-corpus {eval_name!r} has no scorable gold dependency arcs")
            eval_hits = _arc_hits(reported)
        frames.append(_syntax_rows(syn.head_relation_accuracy(hits if eval_hits is None else eval_hits)))
        syntax_tab, syntax_gains = _syntax_selection(ctx, hits, settings, eval_hits, eval_name)
    else:
        ctx.log("corpus has no gold dependencies: syntax scores and the syntactic role are skipped")

    n_ablated = n_layers * n_heads
    ctx.log(f"ablating {n_ablated} heads x {len(settings.methods)} methods on {len(importance_corpus)} sentences")
    importance_batches = list(ctx.encode(importance_corpus, batch_size=settings.importance_batch).batches)
    gradient_batches = list(ctx.encode(importance_corpus, batch_size=settings.gradient_batch).batches)
    importance = ctx.step_arrays("importance", lambda: passes.importance_pass(
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
    frames.append(_importance_rows(importance, settings, ctx.seed))

    n_reported = len(frames) - 1  # attention statistics, ratios and syntax rows: from --eval-corpus when given
    results = pd.concat(frames, ignore_index=True)
    for key, value in label.items():
        results[key] = value
    if eval_name is not None:  # the corpus column says which split each row comes from
        results.loc[: sum(len(f) for f in frames[:n_reported]) - 1, "corpus"] = eval_name
    results = _tidy(results)

    _write_side_tables(ctx, results, syntax_gains, syntax_tab, distances, importance, settings)
    return results


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


def _arc_hits(arrays: dict[str, np.ndarray]) -> syn.ArcHits:
    return syn.ArcHits(arrays["head_hits"], arrays["offset_hits"], arrays["relations"].astype(object),
                       arrays["arc_sentences"])  # fmt: skip


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
    head_stats = head_stats_wide(results)
    roles = assign_roles(head_stats, syntax_gains, min_arcs=settings.role_min_arcs, fdr=settings.role_fdr)
    ctx.write_table(roles, "roles", formats=("csv",))
    if syntax_tab is not None:
        ctx.write_table(syntax_tab, "syntax", formats=("csv",))
        ctx.write_table(syntax_gains, "syntax_heads", formats=("csv",))
    ctx.write_table(_distance_table(mean_distance, n_layers, n_heads, len(distances)), "distances",
                    formats=("parquet",))  # fmt: skip
    coords = sim.mds_embedding(mean_distance, seed=ctx.seed)
    ctx.write_table(_mds_table(coords, n_layers, n_heads, roles), "mds", formats=("csv",))
    pruning_tab = _pruning_table(importance, settings, ctx.seed)
    top = _top_heads_table(importance, n_heads, settings, ctx.seed)
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
    return passes.attention_sites(model.config.n_layers)


def attention_table(scalars: np.ndarray, offsets: np.ndarray, settings: Settings, seed: int = 0) -> pd.DataFrame:
    """Long rows ``layer, head, metric, value, ci_low, ci_high, n`` from per-sentence statistics.

    Args:
        scalars: ``[sentence, layer, head, metric]`` in the order ``SCALARS``.
        offsets: ``[sentence, layer, head, 2 * max_offset + 1]`` argmax-offset fractions.
    """
    offsets = offsets.astype(np.float64)
    n_layers, n_heads = scalars.shape[1:3]
    rows = [_rows_from(scalars, list(SCALARS), settings, seed)]
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
    rows.append(_rows_from(hist, names, settings, seed))
    # Most frequent argmax offset (over all offsets, not only the reported bins) and its share.
    top_bin = offsets.mean(0).argmax(-1)  # [layer, head]
    index = np.broadcast_to(top_bin[None, ..., None], (len(offsets), n_layers, n_heads, 1))
    share = np.take_along_axis(offsets, index, -1)
    rows.append(_rows_from(share, ["top_offset_fraction"], settings, seed))
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


# ------------------------------------------------------------------------------------------ table builders


def _ratio_rows(distances: np.ndarray, n_layers: int, n_heads: int, settings: Settings, seed: int) -> pd.DataFrame:
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


def _syntax_rows(acc: pd.DataFrame) -> pd.DataFrame:
    out = acc.assign(metric="syntax:" + acc["relation"] + ":" + acc["direction"], value=acc["accuracy"])
    return out[["layer", "head", "metric", "value", "n"]]


def _importance_rows(importance: dict[str, np.ndarray], settings: Settings, seed: int) -> pd.DataFrame:
    effects = importance["effects"]  # [sentence, method, layer, head, measure]
    methods, measures = importance["methods"].tolist(), importance["measures"].tolist()
    flat = einops.rearrange(effects, "s a l h m -> s l h (a m)")
    names = [f"ablation:{a}:{m}" for a in methods for m in measures]
    objective = str(importance["objective"])
    rows = [_rows_from(flat, names, settings, seed)]
    if objective == "mlm":  # Michel et al.: pooled over tokens, L2-normalised per layer
        rows.append(_michel_rows(importance["michel_sums"], importance["michel_tokens"], settings, seed))
    else:
        rows.append(_rows_from(importance["grad"][..., None], [f"grad_importance:{objective}"], settings, seed))
    grad_mean = importance["grad"].mean(0)
    for a in methods:
        for m in measures:
            effect_mean = effects[:, methods.index(a), :, :, measures.index(m)].mean(0)
            rows.append(pd.DataFrame([{
                "layer": None, "head": None, "metric": f"spearman:grad_importance:{objective}~ablation:{a}:{m}",
                "value": imp.spearman(grad_mean, effect_mean), "n": effects.shape[0],
            }]))  # fmt: skip
    return pd.concat(rows, ignore_index=True)


def _michel_rows(sums: np.ndarray, tokens: np.ndarray, settings: Settings, seed: int) -> pd.DataFrame:
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


def _pruning_table(importance: dict[str, np.ndarray], settings: Settings, seed: int) -> pd.DataFrame:
    """Pruning curves: held-out importance orders (bootstrap over sentences) and the mean random order
    (bootstrap over sentences crossed with orders)."""
    curves = importance["pruning"]  # [sentence, order, count, measure]
    orders, counts = importance["pruning_orders"].tolist(), importance["pruning_counts"].tolist()
    mean, low, high, n = _mean_over_sentences(curves, settings, seed)
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


def _top_heads_table(importance: dict[str, np.ndarray], n_heads: int, settings: Settings, seed: int) -> pd.DataFrame:
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


def _mean_over_sentences(values: np.ndarray, settings: Settings, seed: int) -> tuple[np.ndarray, ...]:
    """``values [sentence, ...]`` (NaN = undefined) -> (mean, ci_low, ci_high, n), each ``[...]``."""
    out, n = mean_of_groups(values, n_boot=settings.n_boot, level=settings.ci, seed=seed)
    return out.value, out.low, out.high, n


def _rows_from(values: np.ndarray, names: list[str], settings: Settings, seed: int) -> pd.DataFrame:
    """``values [sentence, layer, head, metric]`` -> long rows with bootstrap CIs."""
    mean, low, high, n = _mean_over_sentences(values, settings, seed)
    n_layers, n_heads, n_metrics = mean.shape
    layer, head, metric = np.meshgrid(np.arange(n_layers), np.arange(n_heads), np.arange(n_metrics), indexing="ij")
    return pd.DataFrame({
        "layer": layer.ravel(), "head": head.ravel(), "metric": np.asarray(names)[metric.ravel()],
        "value": mean.ravel(), "ci_low": low.ravel(), "ci_high": high.ravel(), "n": n.ravel(),
    })  # fmt: skip


def _tidy(results: pd.DataFrame) -> pd.DataFrame:
    out = results.reindex(columns=RESULT_COLUMNS)
    for col in ("layer", "head", "n"):
        out[col] = pd.array(out[col].astype("Float64").round(), dtype="Int64")
    for col in ("value", "ci_low", "ci_high"):
        out[col] = out[col].astype(float)
    return out


def _distance_table(mean_distance: np.ndarray, n_layers: int, n_heads: int, n: int) -> pd.DataFrame:
    total = n_layers * n_heads
    a, b = np.meshgrid(np.arange(total), np.arange(total), indexing="ij")
    return pd.DataFrame({
        "layer_a": a.ravel() // n_heads, "head_a": a.ravel() % n_heads,
        "layer_b": b.ravel() // n_heads, "head_b": b.ravel() % n_heads,
        "distance": mean_distance.ravel(), "n": n,
    })  # fmt: skip


def _mds_table(coords: np.ndarray, n_layers: int, n_heads: int, roles: pd.DataFrame) -> pd.DataFrame:
    primary = roles.groupby(["layer", "head"])["primary_role"].first()
    layer, head = np.divmod(np.arange(n_layers * n_heads), n_heads)
    return pd.DataFrame({
        "layer": layer, "head": head, "x": coords[:, 0], "y": coords[:, 1],
        "primary_role": [primary.get((int(L), int(h)), "other") for L, h in zip(layer, head, strict=True)],
    })  # fmt: skip
