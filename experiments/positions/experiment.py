"""How much absolute and relative position each layer (and sublayer) carries, measured with linear probes.

Self-attention is order-blind; BERT adds learned position embeddings. This experiment asks how much of that
signal survives at every site (``embed.hook_word``, ``embed.hook_out``, and per block ``hook_attn_out``,
``hook_resid_mid``, ``hook_mlp_out``, ``hook_resid_post``), and whether it is position itself or something
correlated with it (word identity, sentence structure).

Design (defaults in `Settings`, recorded in the manifest's ``notes``):

- **Data.** Fixed-length windows of ``window_len`` word pieces cut from the corpus's token stream, fed as
  ``[CLS] window [SEP]`` (every content position has one token per window, so position is not confounded
  with length); natural sentences as a second design. [CLS] and the final [SEP] are never mixed into the
  content-token probes: they get their own rows (``token="cls"`` / ``"sep"``: the [SEP] position and the
  sentence length read from [CLS], in natural sentences where both vary). Every split is grouped by
  window/sentence (``probes.evaluate``), never by token.
- **Targets.** Absolute position of a content piece (0 .. P-1) as a class (logistic probe) and as a number
  (ridge probe); relative order of two pieces of one window from ``[h_i; h_j]`` and from ``h_i - h_j``: is j
  before i (binary), and the ``floor(log2 |i - j|)`` distance bucket.
- **Controls beside every score.** Chance and majority baselines (columns); a Hewitt-Liang control task
  (each token type a fixed random label drawn from the label distribution) with selectivity = task -
  control, beside its memorisation ceiling (share of test tokens whose type is in the training folds);
  a capacity sweep over ``sweep_alphas`` with the operating point chosen by selectivity on the tuning
  windows (``capacity_sweep``); word order shuffled inside each window/sentence (same tokens, same position
  ids); the trained model with its position embeddings zeroed (``zeroed_positions``, the floor: the random-
  weights baseline was dropped because its random position table passes straight through the residual and
  decodes position perfectly); the position-embedding table itself probed (Wang & Chen 2020).
- **Probe-free measures** per site: share of variance explained by position and linear CKA with the
  position embeddings of the tokens' positions (windows; baseline: positions permuted inside windows).
- **MDL**: online codelength / compression of absolute position and of its control task per layer, alpha
  chosen per block from the prefix (a valid online code).

Run time: every probe is independent and deterministic (one BLAS thread, a seed), so the probes of each step
run on ``n_jobs`` worker processes (the job service, `experiments.jobs`; default: every core this process may
use), costliest first, each cached as it arrives; the tables equal the serial run's bit for bit (``n_jobs=1``).

The L2 strength of each probe family (absolute class / regression, each pair target and feature kind) is
chosen once, by grouped CV on separate *tuning windows* that are never probed (averaged over
``embed.hook_out``, the middle and the last block; pairs at the middle block only), and then held fixed
across sites and controls: every layer is read by a probe of the same capacity and no score is computed on
rows that chose its alpha. The values are in the ``alpha`` column and the CV scores in the manifest notes.
The [CLS]/[SEP] ridge probes, which exist only in sentences, use nested grouped CV (alpha per outer fold from
its training split). The headline rows (position class at the residual sites) use ``repeats`` CV runs;
``ci_covers`` says which variance each interval covers and ``chosen`` how its alpha was chosen.

Outputs in ``OUT/positions/``: ``results.parquet|csv`` (long table, columns `COLUMNS`), ``confusion``
(true-vs-predicted counts for chosen sites), ``position_table_pca``, ``position_table_cosine``,
``summary_absolute`` (per-layer accuracy, control, ceiling, selectivity, nulls), ``capacity_sweep``, and the
figures drawn by `plot`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from bertscope.experiments.positions.data import Activations, main_sites, position_sites
from bertscope.experiments.positions.data import collect as collect_activations
from bertscope.experiments.positions.plots import plot  # noqa: F401 (old name `experiment.plot`; it lives in plots)
from bertscope.experiments.positions.probing import position_table_views
from bertscope.experiments.positions.steps import COLUMNS, ProbeDesign
from bertscope.experiments.positions.windows import ZERO_POSITIONS, capture_positions, check, plan_inputs
from bertscope.experiments.positions.windows import check_capture as check_windows
from bertscope.experiments.positions.windows import plan_windows as plan_windows  # its home before `windows`
from threadpoolctl import threadpool_limits

NAME = "positions"
DIRNAME = "positions"
SUMMARY_TABLES = ["summary_absolute", "capacity_sweep"]

ZERO_POSITIONS = ZERO_POSITIONS  # the null model (embed.hook_pos -> 0); it lives in `windows`

@dataclass(frozen=True)
class Settings:
    """Sizes of the positions run (bundled model, builtin corpus: about 370 CPU s, which the probes spread over
    ``n_jobs`` cores; docs/experiments/positions.md has the measured times)."""

    window_len: int = 32  # P content pieces per window; each window is fed as [CLS] + P + [SEP]
    max_windows: int = 128  # windows drawn (seeded) from the corpus stream for the probes
    tune_windows: int = 48  # further windows, disjoint from those, on which each probe family's alpha is chosen
    max_sentences: int = 300  # natural sentences used (the first N of the corpus)
    n_folds: int = 3  # grouped folds of every probe (and of the alpha selection on the tuning windows)
    # L2 strengths on the MEAN loss (probes' convention; the old summed-loss grid divided by ~1,024 tuning rows)
    alphas: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 0.1)  # alpha grid of the logistic probes
    ridge_alphas: tuple[float, ...] = (1e-3, 1e-2, 0.1, 1.0, 10.0)  # alpha grid of the ridge probes
    n_boot: int = 500  # group-bootstrap resamples behind every interval
    repeats: int = 3  # repeated CV (fold and control-label seeds) behind the headline rows (abs_class, residual)
    # capacity sweep (Hewitt & Liang): mean-loss alphas swept at the tuning sites; the operating point is the
    # alpha with the best selectivity on the tuning windows, then reported on the probed windows. The grid runs
    # from the accuracy-tuned L2 to where predictions stop changing (at alpha >= ~100 a standardised probe is a
    # nearest-class-mean rule: only the direction of its tiny weights matters), one warm-started path per fold
    sweep_alphas: tuple[float, ...] = (1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0, 1000.0)
    sweep_sites: tuple[str, ...] | None = None  # None: embed.hook_out and the last block
    sweep_boot: int = 200  # bootstrap resamples behind the sweep's intervals
    pairs_per_window: int = 24  # ordered pairs drawn per window for the relative-order probes
    table_pairs: int = 2000  # pairs of position-table rows for the Wang & Chen relative probe
    mdl: bool = True  # MDL codelengths per layer (absolute position and its control)
    mdl_blocks: int = 8  # doublings of the online code
    sublayer_controls: bool = False  # shuffled / zeroed-position probes at the sublayer sites too
    heatmap_sites: tuple[str, ...] | None = None  # None: embed.hook_out, the middle and the last block
    batch_size: int = 32  # windows per forward pass when collecting activations
    blas_threads: int | None = 1  # torch / BLAS threads per probe (None: leave as is)
    # solver of the position probes (`probes.LinearProbe`): "torch" reaches the optimum where the classes are
    # nearly separable (weak L2, the embeddings and first blocks), where scikit-learn's lbfgs stops at the same
    # tol ~4 points of held-out accuracy short of it (embed.hook_out: 0.949 against 0.990 at tol 1e-7; torch
    # 0.992), and is 15-25% cheaper per fit (about a third cheaper again since its L-BFGS history is a ring
    # buffer). The MDL code uses it too (25% less CPU; compression within 0.03 of scikit-learn's except where
    # position is nearly separable: 5.51 -> 5.38 after layer 1, 6.26 -> 6.28 at the embedding output); the pair
    # probes, capacity sweep and position-table probes stay on scikit-learn (`ProbeDesign.backend`)
    backend: str = "torch"
    # worker processes for independent probes (None: the cores this process may use; 1: all in this process).
    # The results do not depend on it: every probe is a deterministic function of its data and seed (`jobs`)
    n_jobs: int | None = None

    def __post_init__(self) -> None:
        from bertscope.experiments.settings import require

        require(self, positive=("max_windows", "tune_windows", "max_sentences", "alphas", "ridge_alphas",
                                "sweep_alphas", "sweep_boot", "pairs_per_window", "table_pairs", "mdl_blocks",
                                "batch_size", "blas_threads"),
                non_negative=("n_boot",),  # 0: point estimates, NaN intervals (probes.bootstrap)
                non_empty=("alphas", "ridge_alphas", "sweep_alphas"))
        if self.window_len < 4:
            raise ValueError(f"window_len must be >= 4, got {self.window_len}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.n_folds < 2:
            raise ValueError(f"n_folds must be >= 2, got {self.n_folds}")
        if self.backend not in ("sklearn", "torch"):
            raise ValueError(f"backend must be 'sklearn' or 'torch', got {self.backend!r}")
        if self.n_jobs is not None and self.n_jobs < 1:
            raise ValueError(f"n_jobs must be >= 1 or None, got {self.n_jobs}")
        for name in ("max_windows", "tune_windows"):
            if getattr(self, name) < 2 * self.n_folds:
                raise ValueError(f"{name} ({getattr(self, name)}) must be at least 2 * n_folds ({self.n_folds})")


# ------------------------------------------------------------------------------------- public entry points


def activation_sites(model: Any) -> list[str]:
    """The sites the experiment reads through the activations stage (`data.position_sites`): what a capture for
    positions (``bertscope capture --for positions``, `windows.capture_positions`) holds for every window."""
    return position_sites(model.config.n_layers)


def check_capture(source: Any, inputs: Any, options: Any, settings: Settings) -> str | None:
    """``--activations DIR`` for positions (`windows.check_capture`): ``None`` when the capture serves this run,
    a reason when it is a capture of sentences rather than positions' windows, `CaptureError` on a mismatch."""
    return check_windows(source, inputs, options, settings)


def capture_inputs(inputs: Any, options: Any, settings: Settings, **kwargs: Any) -> dict[str, Any]:
    """``bertscope capture --for positions`` (`windows.capture_positions`): capture what this experiment reads."""
    return capture_positions(inputs, options, settings, **kwargs)


def run(ctx: Any, settings: Settings | None = None) -> pd.DataFrame:
    """Run the experiment into ``ctx.out_dir``; returns the main long table (the framework writes it).

    Every expensive step is cached (each activation set, the alpha choices, each probe), so an interrupted
    run resumes with what it finished. The plan: the sequence sets (``windows``), their activations (``data``),
    the probe steps (``steps``), the summary tables."""
    settings = ctx.use_settings(settings)
    t0 = time.perf_counter()
    ctx.note("settings", dataclasses.asdict(settings))
    ctx.model.eval()
    check(ctx.inputs, settings)
    plan, train_plan, reported_on = _plans(ctx, settings)
    design = _design(ctx, plan, reported_on)
    acts, tuning_acts = _activations(ctx, design, plan, train_plan)
    tables = _position_table(ctx)
    ctx.note("seconds_activations", round(time.perf_counter() - t0, 1))
    ctx.log(f"activations cached ({time.perf_counter() - t0:.1f}s)")
    # Many small fits: BLAS threads buy little on them and thrash when the cores are shared.
    with threadpool_limits(limits=plan.settings.blas_threads):
        design.tune(tuning_acts)
        design.tune_capacity(tuning_acts)
        parts = {name: _timed(ctx, name, fn) for name, fn in _steps(design, acts, tables, plan.settings).items()}
    for key, value in design.notes.items():
        ctx.note(key, value)
    confusion = parts.pop("confusion")
    results = pd.concat(parts.values(), ignore_index=True)[COLUMNS]
    _write_tables(ctx, results, confusion, tables, reported_on if train_plan is not None else None)
    ctx.note("seconds_compute", round(time.perf_counter() - t0, 1))
    ctx.log(f"done in {time.perf_counter() - t0:.1f}s")
    return results


def _plans(ctx: Any, settings: Settings) -> tuple[Any, Any, str]:
    """The run's plan of sequence sets (`windows.plan_inputs`) and, with ``--eval-corpus``, the ``--corpus`` plan
    the probes are fit on: ``(plan, train_plan or None, the corpus every number is reported on)``."""
    plan = plan_inputs(ctx.model, ctx.corpus, settings, seed=ctx.seed, max_sentences=ctx.options.max_sentences,
                       max_length=ctx.options.max_length, encode=lambda kept: ctx.encode(kept, sort_by_length=True))
    for warning in plan.warnings:  # a short corpus gets shorter windows
        ctx.warn(warning)
    eval_corpus = getattr(ctx.inputs, "eval_corpus", None)
    if eval_corpus is None:
        return plan, None, ctx.corpus_id
    # tuning windows (every choice) from --corpus, everything reported from the other
    train_plan = plan  # its probed windows and sentences are what the probes are fit on
    plan, reported_on = _eval_plan(ctx, plan, eval_corpus), str(eval_corpus.name)
    ctx.note("eval_corpus", reported_on)
    ctx.log(f"alphas and the sweep's operating point chosen on {len(plan.tuning)} windows of {ctx.corpus_id}; "
            f"window, sentence and [CLS]/[SEP] probes fit on {ctx.corpus_id}'s {len(train_plan.windows)} "
            f"windows and {len(train_plan.sentences)} sentences; every reported number from {reported_on}")
    return plan, train_plan, reported_on


def _design(ctx: Any, plan: Any, reported_on: str) -> ProbeDesign:
    """The run's `steps.ProbeDesign` (probes on CPU jobs), with the counts of the plan noted and logged."""
    settings, windows, tuning, sentences = plan.settings, plan.windows, plan.tuning, plan.sentences
    ctx.note("window_len", settings.window_len)
    # the probes run on CPU whatever the model's device, so they may always go to forked workers
    jobs = ctx.jobs(workers=settings.n_jobs, threads=settings.blas_threads, device="cpu")
    n_layers = ctx.model.config.n_layers
    design = ProbeDesign(settings, {"model": ctx.model_id, "corpus": reported_on}, position_sites(n_layers),
                         main_sites(n_layers), seed=ctx.seed, jobs=jobs)  # fmt: skip
    ctx.note("n_windows", len(windows))
    ctx.note("n_tune_windows", len(tuning))
    ctx.record_used({"sentences": len(sentences)}, available=len(ctx.corpus),
                    more="--set positions.max_sentences=N (windows: positions.max_windows)")
    ctx.note("n_sentences", len(sentences))
    ctx.log(f"{len(windows)} windows of {settings.window_len} pieces (+{len(tuning)} for tuning alphas), "
            f"{len(sentences)} sentences ({plan.why})")
    return design


#: Sequence set of a plan -> the ``(data, condition)`` key of its activations in the probe steps.
ACTIVATION_KEYS = {"windows": ("windows", "none"), "windows_shuffled": ("windows", "shuffled"),
                   "sentences": ("sentences", "none"), "sentences_shuffled": ("sentences", "shuffled"),
                   "windows_zeroed_positions": ("windows", "zeroed_positions")}  # fmt: skip


def _activations(ctx: Any, design: ProbeDesign, plan: Any, train_plan: Any) -> tuple[dict, Any]:
    """Each sequence set's activations, one cached step each (a capture's, with ``--activations``); with
    ``--eval-corpus`` the ``--corpus`` sets go to ``design.train_acts``. Returns ``(acts, tuning_acts)``."""
    settings = plan.settings
    source = _capture_source(ctx, ctx.settings)  # --activations naming a positions capture, else None

    def collect(name: str, seqs: Any, at: list[str], hooks: tuple) -> Activations:
        def compute() -> dict[str, np.ndarray]:
            return collect_activations(ctx.model, seqs, at, batch_size=settings.batch_size, fwd_hooks=hooks,
                                       capture=source, name=name, max_length=ctx.options.max_length).to_arrays()

        return Activations.from_arrays(ctx.step_arrays("activations", compute, data=name, sites=at))

    acts, tuning_acts = {}, None
    for name, seqs, at, hooks in plan.datasets(design.tuning_sites):
        if name == "tuning":
            tuning_acts = collect(name, seqs, at, hooks)
        else:
            acts[ACTIVATION_KEYS[name]] = collect(name, seqs, at, hooks)
    if train_plan is not None:  # --eval-corpus: the --corpus sets the probes are fit on
        design.train_acts = {ACTIVATION_KEYS[name]: collect(f"train_{name}", seqs, at, hooks)
                             for name, seqs, at, hooks in train_plan.datasets(design.tuning_sites) if name != "tuning"}
    if not plan.zeroed:
        ctx.warn("the model adds no position embeddings (rotary or relative positions): the zeroed-position null "
                 "is skipped")
    return acts, tuning_acts


def _position_table(ctx: Any) -> dict[str, np.ndarray] | None:
    """``{"W_pos": table}``, row i = the i-th token's position (RoBERTa's offset rows dropped); None (said in a
    warning) without an absolute table."""
    tables = None if ctx.model.W_pos_tokens is None else {"W_pos": _numpy(ctx.model.W_pos_tokens)}
    if tables is None:
        ctx.warn("the model has no absolute position table (rotary or relative positions): the CKA with the "
                 "table and the position-table probes are skipped")
    return tables


def _write_tables(ctx: Any, results: pd.DataFrame, confusion: pd.DataFrame, tables: dict | None,
                  reported_on: str | None) -> None:
    """The side tables (confusion, position-table views, the two summaries); ``reported_on``: the
    ``--eval-corpus`` name (its columns added to ``results`` too), None without one."""
    if reported_on is not None:  # which corpus chose each alpha / operating point (runs without it keep columns)
        results["selection_corpus"] = ctx.corpus_id
        results["trained_on"] = trained_on(results, ctx.corpus_id, reported_on)
        # its probes are fit on --corpus's windows, every eval window predicted
        confusion = confusion.assign(selection_corpus=ctx.corpus_id, trained_on=ctx.corpus_id)
    ctx.write_table(confusion, "confusion")
    if tables is not None:
        pca, cosine = position_table_views(tables["W_pos"])
        ctx.write_table(pca, "position_table_pca")
        ctx.write_table(cosine, "position_table_cosine", formats=("parquet",))
    summaries = {"summary_absolute": summary_absolute(results), "capacity_sweep": capacity_sweep(results)}
    for name, table in summaries.items():  # both tables' probes (and memorisation ceilings) are fit on --corpus
        if reported_on is not None:
            table = table.assign(corpus=reported_on, selection_corpus=ctx.corpus_id, trained_on=ctx.corpus_id)
        ctx.write_table(table, name)


def _steps(design: ProbeDesign, acts: dict, tables: dict | None, settings: Settings) -> dict[str, Any]:
    steps = {
        "absolute_windows": lambda: design.absolute_windows(acts),
        "absolute_sentences": lambda: design.absolute_sentences(acts),
        "specials": lambda: design.specials(acts),
        "capacity_sweep": lambda: design.capacity_sweep(acts),
        "relative_pairs": lambda: design.relative_pairs(acts),
        "probe_free": lambda: design.probe_free(acts, tables),
    }
    if tables is not None:
        steps["position_table"] = lambda: design.position_table(tables["W_pos"])
    if settings.mdl:
        steps["mdl"] = lambda: design.mdl(acts)
    steps["confusion"] = lambda: design.confusion(acts)
    return steps


def trained_on(results: pd.DataFrame, train_corpus: str, eval_corpus: str) -> pd.Series:
    """``--eval-corpus``'s ``trained_on`` column of ``results``: ``train_corpus`` for the probes fit on its
    windows/sentences and scored on every row of the eval corpus (``n_folds`` 0), ``"none"`` for rows with no
    corpus-trained probe (probe-free measures, the position-table probes), else ``eval_corpus`` (probes still
    cross-validated, or MDL-coded, within the eval corpus)."""
    out = np.where(results["n_folds"] == 0, train_corpus, eval_corpus).astype(object)
    untrained = results["probe"].isin(["none"]) | (results["site"] == "position_table")
    out[untrained.to_numpy()] = "none"
    return pd.Series(out, index=results.index, name="trained_on")


def summary_absolute(results: pd.DataFrame) -> pd.DataFrame:
    """Per residual-stream site: absolute-position accuracy on windows with its interval, the control-task
    accuracy beside its memorisation ceiling, selectivity, the shuffled and zeroed-position accuracies, the
    chance level, and ``ci_covers`` (the variance the task / control / selectivity intervals cover)."""
    rows = results[
        (results["data"] == "windows") & (results["target"] == "abs_class") & (results["metric"] == "accuracy")
        & results["component"].isin(["word", "embed", "resid_post"]) & (results["probe"] != "sweep")
    ]  # fmt: skip
    out = []
    for (site, layer), g in rows.groupby(["site", "layer"], sort=False):
        by = {c: r for c, r in zip(g["control"], g.itertuples(), strict=True)}
        row: dict[str, Any] = {"site": site, "layer": layer}
        for control, prefix in (("none", "accuracy"), ("control_task", "control_accuracy"),
                                ("selectivity", "selectivity"), ("shuffled", "shuffled_accuracy"),
                                ("zeroed_positions", "zeroed_accuracy"),
                                ("memorisation_ceiling", "memorisation_ceiling")):  # fmt: skip
            r = by.get(control)
            row[prefix] = np.nan if r is None else r.value
            row[f"{prefix}_ci_low"] = np.nan if r is None else r.ci_low
            row[f"{prefix}_ci_high"] = np.nan if r is None else r.ci_high
        row["chance"] = by["none"].baseline_chance if "none" in by else np.nan
        row["majority"] = by["none"].baseline_majority if "none" in by else np.nan
        row["alpha"] = by["none"].alpha if "none" in by else np.nan
        row["repeats"] = by["none"].repeats if "none" in by else np.nan
        row["ci_covers"] = by["none"].ci_covers if "none" in by else ""
        out.append(row)
    return pd.DataFrame(out)  # rows come in site (forward) order


def capacity_sweep(results: pd.DataFrame) -> pd.DataFrame:
    """The capacity sweep as a wide table: per site and alpha, accuracy, control accuracy and selectivity with
    intervals, the memorisation ceiling, and ``chosen`` (True at the alpha chosen by selectivity on the tuning
    windows: chosen held-out, never on the rows reported here)."""
    rows = results[(results["target"] == "abs_class") & (results["probe"] == "sweep")
                   & (results["metric"] == "accuracy")]  # fmt: skip
    ceiling = results[(results["control"] == "memorisation_ceiling") & (results["data"] == "windows")]
    ceil = float(ceiling["value"].iloc[0]) if len(ceiling) else np.nan
    out = []
    for (site, layer, alpha), g in rows.groupby(["site", "layer", "alpha"], sort=False):
        by = {c: r for c, r in zip(g["control"], g.itertuples(), strict=True)}
        row: dict[str, Any] = {"site": site, "layer": layer, "alpha": alpha}
        for control, prefix in (("none", "accuracy"), ("control_task", "control_accuracy"),
                                ("selectivity", "selectivity")):  # fmt: skip
            r = by.get(control)
            row[prefix] = np.nan if r is None else r.value
            row[f"{prefix}_ci_low"] = np.nan if r is None else r.ci_low
            row[f"{prefix}_ci_high"] = np.nan if r is None else r.ci_high
        row["memorisation_ceiling"] = ceil
        row["chosen"] = bool(by["none"].chosen == "tuning_selectivity") if "none" in by else False
        row["ci_covers"] = by["none"].ci_covers if "none" in by else ""
        out.append(row)
    return pd.DataFrame(out)


# ------------------------------------------------------------------------------------------------ helpers


def _eval_plan(ctx: Any, plan: Any, eval_corpus: Any) -> Any:
    """``--eval-corpus``: the run's plan with the probed windows and sentences (and their shuffled and
    zeroed-position copies) cut from ``eval_corpus`` with the same window length and seed, and the tuning
    windows (on which every alpha and the sweep's operating point are chosen) kept from ``--corpus``."""
    from bertscope.experiments.registry import CannotRun

    reported = plan_inputs(ctx.model, eval_corpus, plan.settings, seed=ctx.seed,
                           max_sentences=ctx.options.max_sentences, max_length=ctx.options.max_length,
                           encode=lambda kept: ctx.encode(kept, sort_by_length=True))  # fmt: skip
    if reported.settings.window_len != plan.settings.window_len:
        raise CannotRun(f"--eval-corpus {eval_corpus.name!r} is too short for windows of {plan.settings.window_len} "
                        "word pieces (those of --corpus); use a longer one")  # fmt: skip
    for warning in reported.warnings:
        ctx.warn(f"--eval-corpus: {warning}")
    return dataclasses.replace(reported, tuning=plan.tuning)


def _timed(ctx: Any, name: str, fn: Any) -> pd.DataFrame:
    # Probe steps cache each probe inside; the others are cached whole.
    t0 = time.perf_counter()
    out = ctx.step(name, fn) if name in ("probe_free", "position_table", "confusion") else fn()
    seconds = round(time.perf_counter() - t0, 1)
    ctx.note(f"seconds_{name}", seconds)
    ctx.log(f"{name}: {len(out)} rows in {seconds}s")
    return out


def _numpy(t: Any) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def _capture_source(ctx: Any, settings: Settings) -> Any:
    """The `activations.CaptureSource` the run reads (``--activations`` naming a positions capture), or ``None``
    (run the forward; a log line says so when ``--activations`` names a capture of sentences, as in ``run all``)."""
    from bertscope.experiments.activations import CaptureSource

    folder = getattr(ctx.options, "activations", None)
    if folder is None:
        return None
    source = CaptureSource(Path(folder), ctx.model)
    why = check_capture(source, ctx.inputs, ctx.options, settings)
    if why is not None:
        ctx.log(f"--activations not used: {why}")
        return None
    ctx.note("activations", str(folder))
    ctx.log(f"reading the windows' activations from the capture {folder}")
    return source
