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
  control; the same architecture with random weights (``models.random_encoder``); word order shuffled inside
  each window/sentence (same tokens, same position ids); the position-embedding table itself probed
  (absolute position by regression, relative order by pair classification, as in Wang & Chen 2020).
- **Probe-free measures** per site: share of variance explained by position and linear CKA with the
  position embeddings of the tokens' positions (windows; baseline: positions permuted inside windows).
- **MDL**: online codelength / compression of absolute position and of its control task per layer.

The L2 strength of each probe family (absolute class / regression, each pair target and feature kind) is
chosen once, by grouped CV on separate *tuning windows* that are never probed (averaged over
``embed.hook_out``, the middle and the last block; pairs at the middle block only), and then held fixed
across sites and controls: every layer is read by a probe of the same capacity and no score is computed on
rows that chose its alpha. The values are in the ``alpha`` column and the CV scores in the manifest notes.
The [CLS]/[SEP] ridge probes, which exist only in sentences, use nested grouped CV at the middle block.

Outputs in ``OUT/positions/``: ``results.parquet|csv`` (long table, columns `COLUMNS`), ``confusion``
(true-vs-predicted counts for chosen sites), ``position_table_pca``, ``position_table_cosine``,
``summary_absolute`` (per-layer accuracy and selectivity), and the figures drawn by `plot`.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from bertscope.experiments.positions_data import (
    CLS,
    CONTENT,
    SEP,
    Activations,
    main_sites,
    make_windows,
    position_sites,
    sentences_from_encoded,
    shuffle_content,
    site_layer,
    subset,
)
from bertscope.experiments.positions_measures import (
    linear_cka,
    pair_features,
    permute_positions,
    sample_pairs,
    table_pairs,
    variance_share,
)
from threadpoolctl import threadpool_limits

NAME = "positions"
DIRNAME = "positions"
SUMMARY_TABLES = ["summary_absolute.csv"]

COLUMNS = [
    "model", "data", "token", "site", "layer", "component", "target", "features", "probe", "control",
    "metric", "value", "ci_low", "ci_high", "baseline_chance", "baseline_majority", "n_train", "n_test",
    "n_groups", "alpha", "n_folds", "n_boot",
]  # fmt: skip
CLASS_METRICS = ("accuracy", "macro_f1", "accuracy_within_1", "mae")
REGRESSION_METRICS = ("r2", "mae")
TABLE_ALPHAS = (1e-6, 1e-4, 1e-2, 1.0, 100.0)


@dataclass(frozen=True)
class Settings:
    """Sizes of the positions run. The defaults fit the default-run budget (about 3 min on 2 CPU cores with
    the bundled model and the builtin corpus)."""

    window_len: int = 32  # P content pieces per window; each window is fed as [CLS] + P + [SEP]
    max_windows: int = 128  # windows drawn (seeded) from the corpus stream for the probes
    tune_windows: int = 48  # further windows, disjoint from those, on which each probe family's alpha is chosen
    max_sentences: int = 300  # natural sentences used (the first N of the corpus)
    n_folds: int = 3  # grouped folds of every probe (and of the alpha selection on the tuning windows)
    alphas: tuple[float, ...] = (0.1, 1.0, 10.0, 100.0)  # alpha grid of the logistic probes
    ridge_alphas: tuple[float, ...] = (1.0, 10.0, 100.0, 1000.0, 10000.0)  # alpha grid of the ridge probes
    n_boot: int = 500  # group-bootstrap resamples behind every interval
    pairs_per_window: int = 24  # ordered pairs drawn per window for the relative-order probes
    table_pairs: int = 2000  # pairs of position-table rows for the Wang & Chen relative probe
    mdl: bool = True  # MDL codelengths per layer (absolute position and its control)
    mdl_blocks: int = 8  # doublings of the online code
    sublayer_controls: bool = False  # shuffled / random-weights probes at the sublayer sites too
    heatmap_sites: tuple[str, ...] | None = None  # None: embed.hook_out, the middle and the last block
    batch_size: int = 32
    blas_threads: int | None = 1  # BLAS threads while probing (None: leave as is)

    def __post_init__(self) -> None:
        if self.window_len < 4:
            raise ValueError(f"window_len must be >= 4, got {self.window_len}")
        if self.n_folds < 2:
            raise ValueError(f"n_folds must be >= 2, got {self.n_folds}")
        for name in ("max_windows", "tune_windows"):
            if getattr(self, name) < 2 * self.n_folds:
                raise ValueError(f"{name} ({getattr(self, name)}) must be at least 2 * n_folds ({self.n_folds})")


# ------------------------------------------------------------------------------------- public entry points


def run(ctx: Any, settings: Settings | None = None) -> pd.DataFrame:
    """Run the experiment into ``ctx.out_dir``; returns the main long table (the framework writes it)."""
    settings = settings or Settings()
    t0 = time.perf_counter()
    ctx.note("settings", dataclasses.asdict(settings))
    model = ctx.model
    model.eval()
    n_layers = model.config.n_layers
    if settings.window_len + 2 > model.config.max_positions:
        raise ValueError(
            f"window_len {settings.window_len} + [CLS]/[SEP] exceeds the model's {model.config.max_positions} "
            "positions; use a smaller window length"
        )
    sites, residual = position_sites(n_layers), main_sites(n_layers)
    design = _Design(ctx, settings, model_name(model), sites, residual)

    windows, tuning = _windows_and_tuning(ctx, settings)
    kept = list(ctx.corpus)[: settings.max_sentences]  # a prefix, so sentence_index still points into the corpus
    sentences = sentences_from_encoded(ctx.encode(kept, sort_by_length=True))
    ctx.note("n_windows", len(windows))
    ctx.note("n_tune_windows", len(tuning))
    ctx.note("n_sentences", len(sentences))
    ctx.log(f"{len(windows)} windows of {settings.window_len} pieces (+{len(tuning)} for tuning alphas), "
            f"{len(sentences)} sentences")

    from bertscope.models import random_encoder

    random_model = random_encoder(model.config, seed=ctx.seed, tokenizer=model.tokenizer)
    random_model = random_model.to(device=ctx.device, dtype=ctx.dtype).eval()
    acts = {
        ("windows", "none"): design.collect(model, windows, sites),
        ("windows", "shuffled"): design.collect(model, shuffle_content(windows, seed=ctx.seed), sites),
        ("windows", "random_weights"): design.collect(random_model, windows, sites),
        ("sentences", "none"): design.collect(model, sentences, residual),
        ("sentences", "shuffled"): design.collect(model, shuffle_content(sentences, seed=ctx.seed), residual),
    }
    tables = {
        "W_pos": _numpy(model.W_pos),
        "W_pos_random": _numpy(random_model.W_pos),
    }
    tuning_acts = design.collect(model, tuning, design.tuning_sites)
    ctx.note("seconds_activations", round(time.perf_counter() - t0, 1))
    ctx.log(f"activations cached ({time.perf_counter() - t0:.1f}s)")
    with threadpool_limits(limits=settings.blas_threads):
        design.tune(tuning_acts)

    steps = {
        "absolute_windows": lambda: design.absolute_windows(acts),
        "absolute_sentences": lambda: design.absolute_sentences(acts),
        "specials": lambda: design.specials(acts),
        "relative_pairs": lambda: design.relative_pairs(acts),
        "probe_free": lambda: design.probe_free(acts, tables),
        "position_table": lambda: design.position_table(tables["W_pos"]),
    }
    if settings.mdl:
        steps["mdl"] = lambda: design.mdl(acts)
    steps["confusion"] = lambda: design.confusion(acts)
    # Many small fits: BLAS threads buy little on them and thrash when the cores are shared.
    with threadpool_limits(limits=settings.blas_threads):
        parts = {name: _timed_step(ctx, name, fn) for name, fn in steps.items()}
    confusion = parts.pop("confusion")
    results = pd.concat(parts.values(), ignore_index=True)[COLUMNS]

    ctx.write_table(confusion, "confusion")
    pca, cosine = position_table_views(tables["W_pos"])
    ctx.write_table(pca, "position_table_pca")
    ctx.write_table(cosine, "position_table_cosine", formats=("parquet",))
    ctx.write_table(summary_absolute(results), "summary_absolute")
    ctx.note("seconds_compute", round(time.perf_counter() - t0, 1))
    ctx.log(f"done in {time.perf_counter() - t0:.1f}s")
    return results


def plot(out_dir: Path) -> list[Path]:
    """Redraw every figure from the saved tables in ``out_dir`` (no model needed)."""
    from bertscope.experiments.positions_plots import draw_all

    return draw_all(Path(out_dir))


def summary_absolute(results: pd.DataFrame) -> pd.DataFrame:
    """Per residual-stream site: absolute-position accuracy on windows with its interval, the control-task
    accuracy, selectivity, the shuffled and random-weights accuracies, and the chance level."""
    rows = results[
        (results["data"] == "windows") & (results["target"] == "abs_class") & (results["metric"] == "accuracy")
        & results["component"].isin(["word", "embed", "resid_post"])
    ]  # fmt: skip
    out = []
    for (site, layer), g in rows.groupby(["site", "layer"], sort=False):
        by = {c: r for c, r in zip(g["control"], g.itertuples(), strict=True)}
        row: dict[str, Any] = {"site": site, "layer": layer}
        for control, prefix in (("none", "accuracy"), ("control_task", "control_accuracy"),
                                ("selectivity", "selectivity"), ("shuffled", "shuffled_accuracy"),
                                ("random_weights", "random_accuracy")):  # fmt: skip
            r = by.get(control)
            row[prefix] = np.nan if r is None else r.value
            row[f"{prefix}_ci_low"] = np.nan if r is None else r.ci_low
            row[f"{prefix}_ci_high"] = np.nan if r is None else r.ci_high
        row["chance"] = by["none"].baseline_chance if "none" in by else np.nan
        row["majority"] = by["none"].baseline_majority if "none" in by else np.nan
        out.append(row)
    return pd.DataFrame(out)  # rows come in site (forward) order


def position_table_views(table: np.ndarray, n_components: int = 4) -> tuple[pd.DataFrame, pd.DataFrame]:
    """PCA of a position table ``[positions, d]`` (component scores against position, with explained
    variance) and its cosine-similarity matrix, as long tables."""
    table = np.asarray(table, dtype=np.float64)
    centered = table - table.mean(0)
    _, s, vt = np.linalg.svd(centered, full_matrices=False)
    k = min(n_components, len(s))
    scores = centered @ vt[:k].T
    explained = s**2 / (s**2).sum()
    n_pos = table.shape[0]
    pca = pd.DataFrame({
        "position": np.tile(np.arange(n_pos), k),
        "component": np.repeat(np.arange(1, k + 1), n_pos),
        "score": scores.T.reshape(-1),
        "explained_variance": np.repeat(explained[:k], n_pos),
    })  # fmt: skip
    unit = table / np.maximum(np.linalg.norm(table, axis=1, keepdims=True), 1e-12)
    cos = unit @ unit.T
    i, j = np.meshgrid(np.arange(n_pos), np.arange(n_pos), indexing="ij")
    cosine = pd.DataFrame({"i": i.reshape(-1), "j": j.reshape(-1), "cosine": cos.reshape(-1).astype(np.float32)})
    return pca, cosine


def table_probes(
    table: np.ndarray,
    *,
    n_folds: int = 5,
    n_boot: int = 500,
    n_pairs: int = 3000,
    alphas: tuple[float, ...] = TABLE_ALPHAS,
    pair_alphas: tuple[float, ...] = (0.1, 1.0, 10.0, 100.0),
    pair_folds: int = 3,
    seed: int = 0,
) -> pd.DataFrame:
    """Probe a position table ``[positions, d]`` itself (Wang & Chen 2020).

    Absolute: ridge regression of the row index from the row (one group per row, alpha by nested CV over
    ``alphas``), with ``exact`` = share of rows whose out-of-fold prediction rounds to the true index.
    Relative: logistic pair probes (is j before i; distance bucket) on ``[p_i; p_j]`` and ``p_i - p_j``,
    grouped so no position is in two folds (``pair_folds`` outer folds, alpha by a 2-fold inner CV over
    ``pair_alphas``). Returns `probes.evaluate` rows tagged with ``target``,
    ``features`` and ``probe`` (the caller adds site, model, ...).
    """
    from bertscope.probes import evaluate

    table = np.asarray(table, dtype=np.float64)
    n_pos = table.shape[0]
    y = np.arange(n_pos, dtype=np.float64)
    groups = np.arange(n_pos)
    kw = dict(n_folds=n_folds, n_boot=n_boot, seed=seed, inner_folds=3)
    absolute = evaluate(table, y, groups, task="regression", alphas=list(alphas),
                        metrics=list(REGRESSION_METRICS), **kw)  # fmt: skip
    alpha = float(absolute["alpha"].iloc[0])
    pred = grouped_oof_predict(table, y, groups, task="regression", alpha=alpha, n_folds=n_folds, seed=seed)
    exact = float(np.mean(np.rint(pred) == y))
    parts = [
        _tag(absolute, target="abs_reg", features="table", probe="ridge"),
        pd.DataFrame([{**absolute.iloc[0].to_dict(), "labels": "task", "metric": "exact", "value": exact,
                       "ci_low": np.nan, "ci_high": np.nan, "baseline_majority": np.nan,
                       "baseline_chance": np.nan, "target": "abs_reg", "features": "table",
                       "probe": "ridge"}]),  # fmt: skip
    ]
    pairs, pair_groups = table_pairs(n_pos, 2 * pair_folds, n_pairs, seed=seed)
    grid = table[None]
    kw.update(n_folds=pair_folds, inner_folds=2)
    for features in ("concat", "diff"):
        X = pair_features(grid, pairs, features)
        for target, labels in (("order", pairs.before), ("distance_bucket", pairs.bucket)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = evaluate(X, labels, pair_groups, alphas=list(pair_alphas), metrics=["accuracy", "macro_f1"],
                               **kw)  # fmt: skip
            parts.append(_tag(res, target=target, features=features, probe="logistic"))
    return pd.concat(parts, ignore_index=True)


def probe_scores(
    X: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray,
    *,
    task: str,
    alpha: float,
    n_folds: int = 3,
    n_boot: int = 500,
    seed: int = 0,
    control: np.ndarray | None = None,
    control_name: str = "none",
    metrics: tuple[str, ...] | None = None,
) -> pd.DataFrame:
    """Grouped cross-validated scores of one linear probe (`probes.evaluate` at a fixed ``alpha``).

    X ``[n, d]``; y, groups (window/sentence id of each row), control (Hewitt-Liang labels) ``[n]``.
    Returns evaluate's rows with ``probe`` ("logistic" | "ridge") and ``control``: ``control_name`` for the
    task rows, ``"control_task"`` and ``"selectivity"`` (task - control) when ``control`` is given.
    """
    from bertscope.probes import evaluate

    if metrics is None:
        metrics = CLASS_METRICS if task == "classification" else REGRESSION_METRICS
    within = 1 if task == "classification" and "accuracy_within_1" in metrics else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a rare non-converged fit should not flood the log
        res = evaluate(X, y, groups, task=task, n_folds=n_folds, alphas=alpha, n_boot=n_boot, seed=seed,
                       control=control, metrics=list(metrics), within_k=within)  # fmt: skip
    res["probe"] = "logistic" if task == "classification" else "ridge"
    res["control"] = res["labels"].map({"task": control_name, "control": "control_task",
                                        "selectivity": "selectivity"})  # fmt: skip
    return res.drop(columns=["labels"])


def select_alpha(
    feats: list[np.ndarray],
    y: np.ndarray,
    groups: np.ndarray,
    *,
    task: str,
    alphas: tuple[float, ...],
    n_folds: int = 3,
    seed: int = 0,
) -> tuple[float, dict[str, float]]:
    """The alpha with the best grouped-CV score (accuracy, or R^2 for regression) averaged over several
    feature sets ``feats`` (each ``[n, d]``, same rows ``y``/``groups``); ties go to the stronger L2.

    Meant for held-out tuning data, so the chosen alpha never saw the rows it is later scored on. Returns
    ``(alpha, {str(alpha): mean score})``.
    """
    from bertscope.probes import evaluate

    metric = "accuracy" if task == "classification" else "r2"
    scores = {}
    for alpha in sorted(alphas, reverse=True):
        values = []
        for X in feats:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = evaluate(X, y, groups, task=task, n_folds=n_folds, alphas=alpha, n_boot=0, seed=seed,
                               metrics=[metric])  # fmt: skip
            values.append(float(res["value"].iloc[0]))
        scores[f"{alpha:g}"] = float(np.mean(values))
    best = max(scores.values())
    chosen = next(a for a in sorted(alphas, reverse=True) if scores[f"{a:g}"] == best)
    return float(chosen), scores


def grouped_oof_predict(
    X: np.ndarray, y: np.ndarray, groups: np.ndarray, *, task: str, alpha: float, n_folds: int, seed: int = 0
) -> np.ndarray:
    """Out-of-fold predictions ``[n]`` of a `probes.LinearProbe` at a fixed alpha, with grouped folds."""
    from bertscope.probes import LinearProbe, grouped_folds

    group_idx = np.unique(groups, return_inverse=True)[1].reshape(-1)
    fold = grouped_folds(group_idx, int(group_idx.max()) + 1, n_folds, np.random.default_rng([seed, 0]))
    pred = np.empty(len(y), dtype=np.float64 if task == "regression" else np.asarray(y).dtype)
    for f in range(n_folds):
        train, test = fold != f, fold == f
        probe = LinearProbe(task=task, alpha=alpha, seed=seed).fit(X[train], y[train])
        pred[test] = probe.predict(X[test])
    return pred


def model_name(model: Any) -> str:
    """A short name for the model column: the checkpoint folder's name (its parent for ``.../model``)."""
    source = str(getattr(model, "source", "") or "")
    if not source:
        return "random-init"
    path = Path(source)
    return path.parent.name if path.name in ("model", "") else path.name


# ------------------------------------------------------------------------------------------------ design


class _Design:
    """The probes of one run, sharing sites, settings and the per-family alpha choices."""

    def __init__(self, ctx: Any, settings: Settings, model: str, sites: list[str], residual: list[str]) -> None:
        self.ctx, self.s, self.model = ctx, settings, model
        self.sites, self.residual = sites, residual
        self.reference = residual[1 + len(residual) // 2] if len(residual) > 2 else residual[-1]
        # alphas are chosen on these sites of the tuning windows: the bottom, the middle and the top
        self.tuning_sites = list(dict.fromkeys(["embed.hook_out", self.reference, residual[-1]]))
        self._alphas: dict[str, float] = {}

    # -- activations
    def collect(self, model: Any, seqs: Any, sites: list[str]) -> Activations:
        from bertscope.experiments.positions_data import collect

        return collect(model, seqs, sites, batch_size=self.s.batch_size)

    # -- absolute position
    def absolute_windows(self, acts: dict) -> pd.DataFrame:
        s, parts = self.s, []
        real = acts[("windows", "none")]
        sel = real.kind == CONTENT
        y, groups, types = real.pos[sel] - 1, real.group[sel], real.token[sel]
        control = self._control_labels(types, y)
        a_cls, a_reg = self.alpha("abs_class"), self.alpha("abs_reg")
        for site in self.ctx.progress(self.sites, "absolute position (windows)"):
            X = real.feats[site][sel]
            parts.append(self.score(X, y, groups, "classification", a_cls, control=control,
                                    data="windows", site=site, target="abs_class"))  # fmt: skip
            parts.append(self.score(X, y.astype(float), groups, "regression", a_reg, control=control.astype(float),
                                    data="windows", site=site, target="abs_reg"))  # fmt: skip
        control_sites = self.sites if s.sublayer_controls else self.residual
        for condition in ("shuffled", "random_weights"):
            other = acts[("windows", condition)]
            osel = other.kind == CONTENT
            for site in self.ctx.progress(control_sites, f"absolute position ({condition})"):
                X = other.feats[site][osel]
                yo, go = other.pos[osel] - 1, other.group[osel]
                parts.append(self.score(X, yo, go, "classification", a_cls, data="windows", site=site,
                                        target="abs_class", control_name=condition))  # fmt: skip
                parts.append(self.score(X, yo.astype(float), go, "regression", a_reg, data="windows", site=site,
                                        target="abs_reg", control_name=condition))  # fmt: skip
        return pd.concat(parts, ignore_index=True)

    def absolute_sentences(self, acts: dict) -> pd.DataFrame:
        """Natural sentences: content pieces at positions 0 .. P-1 as classes (later pieces are left out of
        the class probe), every content piece for the regression probe."""
        parts = []
        for condition in ("none", "shuffled"):
            a = acts[("sentences", condition)]
            content = a.kind == CONTENT
            y_all = a.pos - 1
            in_range = content & (y_all < self.s.window_len)
            control = self._control_labels(a.token[in_range], y_all[in_range])
            control_reg = self._control_labels(a.token[content], y_all[content]).astype(float)
            a_cls, a_reg = self.alpha("abs_class"), self.alpha("abs_reg")  # the families tuned on windows
            for site in self.ctx.progress(self.residual, f"absolute position (sentences, {condition})"):
                X = a.feats[site]
                kw = dict(data="sentences", site=site, control_name=condition)
                parts.append(self.score(X[in_range], y_all[in_range], a.group[in_range], "classification", a_cls,
                                        control=control if condition == "none" else None,
                                        target="abs_class", **kw))  # fmt: skip
                parts.append(self.score(X[content], y_all[content].astype(float), a.group[content], "regression",
                                        a_reg, control=control_reg if condition == "none" else None,
                                        target="abs_reg", **kw))  # fmt: skip
        return pd.concat(parts, ignore_index=True)

    def specials(self, acts: dict) -> pd.DataFrame:
        """[CLS] and the final [SEP], reported apart: in natural sentences, the [SEP]'s own position and the
        number of content pieces read from [CLS] (both vary with the sentence), by ridge regression."""
        parts = []
        for condition in ("none", "shuffled"):
            a = acts[("sentences", condition)]
            for kind, target, label in ((SEP, "sep_position", a.pos), (CLS, "cls_length", a.length - 2)):
                sel = a.kind == kind
                y, groups = label[sel].astype(float), a.group[sel]
                alpha = self.alpha(target, a.feats[self.reference][sel], y, groups, "regression")
                for site in self.residual:
                    parts.append(self.score(a.feats[site][sel], y, groups, "regression", alpha,
                                            data="sentences", site=site, target=target, control_name=condition,
                                            token="sep" if kind == SEP else "cls"))  # fmt: skip
        return pd.concat(parts, ignore_index=True)

    # -- relative position
    def relative_pairs(self, acts: dict) -> pd.DataFrame:
        s, parts = self.s, []
        real = acts[("windows", "none")]
        n_win = len(np.unique(real.seq))
        pairs = sample_pairs(n_win, s.window_len, s.pairs_per_window, seed=self.ctx.seed)
        content = real.kind == CONTENT  # rows of content_grid: windows in order, then positions
        groups = real.group[content].reshape(n_win, -1)[:, 0][pairs.seq]
        tokens = real.token[content].reshape(n_win, -1)
        # Hewitt-Liang control for pairs: a fixed random label per (type_i, type_j)
        pair_types = tokens[pairs.seq, pairs.i] * (int(tokens.max()) + 1) + tokens[pairs.seq, pairs.j]
        for target, labels in (("order", pairs.before), ("distance_bucket", pairs.bucket)):
            control = self._control_labels(pair_types, labels)
            for features in ("concat", "diff"):
                alpha = self.alpha(f"{target}_{features}")
                # shuffled / random-weights pair probes for the order target only (budget)
                conditions = ("none", "shuffled", "random_weights") if target == "order" else ("none",)
                for condition in conditions:
                    a = acts[("windows", condition)]
                    for site in self.ctx.progress(self.residual, f"pairs {target}/{features} ({condition})"):
                        X = pair_features(a.content_grid(site), pairs, features)
                        parts.append(self.score(X, labels, groups, "classification", alpha,
                                                control=control if condition == "none" else None,
                                                data="windows", site=site, target=target, features=features,
                                                token="pair", control_name=condition,
                                                metrics=("accuracy", "macro_f1")))  # fmt: skip
        return pd.concat(parts, ignore_index=True)

    # -- probe-free
    def probe_free(self, acts: dict, tables: dict[str, np.ndarray]) -> pd.DataFrame:
        s, rows = self.s, []
        P = s.window_len
        for condition in ("none", "shuffled", "random_weights", "permuted_positions"):
            a = acts[("windows", "none" if condition == "permuted_positions" else condition)]
            table = tables["W_pos_random" if condition == "random_weights" else "W_pos"][1 : P + 1]
            sites = self.sites if condition == "none" or s.sublayer_controls else self.residual
            for site in self.ctx.progress(sites, f"probe-free ({condition})"):
                grid = a.content_grid(site)
                if condition == "permuted_positions":
                    grid = permute_positions(grid, seed=self.ctx.seed)
                n = grid.shape[0] * grid.shape[1]
                share = variance_share(grid, n_boot=s.n_boot, seed=self.ctx.seed)
                cka = linear_cka(grid, table)
                meta = dict(data="windows", site=site, target="abs_position", features="h", probe="none",
                            control=condition, n_test=n, n_groups=grid.shape[0])  # fmt: skip
                rows.append({**meta, "metric": "variance_share", "value": share["value"],
                             "ci_low": share["ci_low"], "ci_high": share["ci_high"], "n_boot": s.n_boot})
                rows.append({**meta, "metric": "variance_share_raw", "value": share["raw"]})
                rows.append({**meta, "metric": "cka_position_embedding", "value": cka["value"],
                             "ci_low": cka["ci_low"], "ci_high": cka["ci_high"]})  # fmt: skip
        return self._frame(pd.DataFrame(rows))

    # -- position table
    def position_table(self, table: np.ndarray) -> pd.DataFrame:
        s = self.s
        res = table_probes(table, n_folds=max(s.n_folds, 5), n_boot=s.n_boot, n_pairs=s.table_pairs,
                           pair_alphas=s.alphas, pair_folds=s.n_folds, seed=self.ctx.seed)  # fmt: skip
        res = res.assign(data="table", token="table", site="position_table", control="position_table")
        return self._frame(res.drop(columns=["labels"], errors="ignore"))

    # -- MDL
    def mdl(self, acts: dict) -> pd.DataFrame:
        from bertscope.probes import mdl_probe

        real = acts[("windows", "none")]
        sel = real.kind == CONTENT
        y, groups = real.pos[sel] - 1, real.group[sel]
        control = self._control_labels(real.token[sel], y)
        alpha = self.alpha("abs_class")
        rows = []
        for site in self.ctx.progress(self.residual, "MDL"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # convergence of the small early blocks is not the point
                res = mdl_probe(real.feats[site][sel], y, groups, seed=self.ctx.seed, alpha=alpha,
                                control=control, n_blocks=self.s.mdl_blocks)  # fmt: skip
            for control_name, d in (("none", res), ("control_task", res["control"])):
                for metric in ("compression", "online_codelength", "uniform_codelength", "prior_codelength"):
                    rows.append({"data": "windows", "site": site, "target": "abs_class", "features": "h",
                                 "probe": "mdl", "control": control_name, "metric": metric,
                                 "value": float(d[metric]), "n_test": int(d["n"]), "n_groups": len(np.unique(groups)),
                                 "alpha": float(d["alpha"])})  # fmt: skip
        return self._frame(pd.DataFrame(rows))

    # -- heatmaps
    def confusion(self, acts: dict) -> pd.DataFrame:
        real = acts[("windows", "none")]
        sel = real.kind == CONTENT
        y, groups = real.pos[sel] - 1, real.group[sel]
        alpha = self.alpha("abs_class")
        chosen = self.s.heatmap_sites or (self.residual[1], self.reference, self.residual[-1])
        parts = []
        for site in chosen:
            pred = grouped_oof_predict(real.feats[site][sel], y, groups, task="classification", alpha=alpha,
                                       n_folds=self.s.n_folds, seed=self.ctx.seed)  # fmt: skip
            counts = pd.crosstab(y, pred).stack().rename("count").reset_index()
            counts.columns = ["true", "pred", "count"]
            layer, component = site_layer(site)
            parts.append(counts.assign(site=site, layer=layer, component=component, model=self.model))
        return pd.concat(parts, ignore_index=True)

    # -- helpers
    def tune(self, tuning: Activations) -> None:
        """Choose the alpha of every probe family on the tuning windows (disjoint from the probed ones)."""
        sel = tuning.kind == CONTENT
        y, groups = tuning.pos[sel] - 1, tuning.group[sel]
        feats = [tuning.feats[site][sel] for site in self.tuning_sites]
        self._choose("abs_class", feats, y, groups, "classification")
        self._choose("abs_reg", feats, y.astype(float), groups, "regression", alphas=self.s.ridge_alphas)
        n_win = len(np.unique(tuning.seq))
        pairs = sample_pairs(n_win, self.s.window_len, self.s.pairs_per_window, seed=self.ctx.seed + 1)
        pair_groups = tuning.group[sel].reshape(n_win, -1)[:, 0][pairs.seq]
        for target, labels in (("order", pairs.before), ("distance_bucket", pairs.bucket)):
            for features in ("concat", "diff"):  # pairs: tuned at the middle site only (budget)
                X = [pair_features(tuning.content_grid(self.reference), pairs, features)]
                self._choose(f"{target}_{features}", X, labels, pair_groups, "classification")

    def alpha(self, family: str, X: np.ndarray | None = None, y: np.ndarray | None = None,
              groups: np.ndarray | None = None, task: str = "regression") -> float:  # fmt: skip
        """The alpha of a probe family: chosen by `tune`, or (for the [CLS]/[SEP] ridge probes, whose data
        exist only in sentences) by nested grouped CV on ``X`` at the reference site, once."""
        from bertscope.probes import evaluate

        if family not in self._alphas:
            if X is None:
                raise KeyError(f"no alpha for probe family {family!r}; call tune() first")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                metric = "accuracy" if task == "classification" else "r2"
                grid = self.s.alphas if task == "classification" else self.s.ridge_alphas
                res = evaluate(X, y, groups, task=task, n_folds=self.s.n_folds, alphas=list(grid),
                               n_boot=0, seed=self.ctx.seed, metrics=[metric])  # fmt: skip
            self._alphas[family] = float(res["alpha"].iloc[0])
            self.ctx.note(f"alpha_{family}", self._alphas[family])
        return self._alphas[family]

    def _choose(
        self, family: str, feats: list[np.ndarray], y: np.ndarray, groups: np.ndarray, task: str,
        alphas: tuple[float, ...] | None = None,
    ) -> None:  # fmt: skip
        alpha, scores = select_alpha(feats, y, groups, task=task, alphas=alphas or self.s.alphas,
                                     n_folds=self.s.n_folds, seed=self.ctx.seed)  # fmt: skip
        self._alphas[family] = alpha
        self.ctx.note(f"alpha_{family}", {"alpha": alpha, "cv_score_by_alpha": scores})

    def score(
        self,
        X: np.ndarray,
        y: np.ndarray,
        groups: np.ndarray,
        task: str,
        alpha: float,
        *,
        data: str,
        site: str,
        target: str,
        control: np.ndarray | None = None,
        control_name: str = "none",
        features: str = "h",
        token: str = "content",
        metrics: tuple[str, ...] | None = None,
    ) -> pd.DataFrame:
        res = probe_scores(X, y, groups, task=task, alpha=alpha, n_folds=self.s.n_folds, n_boot=self.s.n_boot,
                           seed=self.ctx.seed, control=control, control_name=control_name,
                           metrics=metrics)  # fmt: skip
        res = res.assign(data=data, site=site, token=token, target=target, features=features)
        return self._frame(res)

    def _control_labels(self, types: np.ndarray, y: np.ndarray) -> np.ndarray:
        from bertscope.probes import control_labels

        return control_labels(types, y, seed=self.ctx.seed)

    def _frame(self, df: pd.DataFrame) -> pd.DataFrame:
        df = df.copy()
        df["model"] = self.model
        layer_component = [site_layer(s) if s != "position_table" else (0, "position_table") for s in df["site"]]
        df["layer"] = [lc[0] for lc in layer_component]
        df["component"] = [lc[1] for lc in layer_component]
        for col in COLUMNS:
            if col not in df:
                df[col] = np.nan
        return df[COLUMNS]


# ------------------------------------------------------------------------------------------------ helpers


def _windows_and_tuning(ctx: Any, settings: Settings) -> tuple[Any, Any]:
    """Probe windows and disjoint tuning windows, both drawn (seeded) from the corpus stream."""
    want = settings.max_windows + settings.tune_windows
    pool = make_windows(ctx.corpus, ctx.model.tokenizer, settings.window_len, max_windows=want, seed=ctx.seed)
    n_tune = settings.tune_windows
    if len(pool) < want:
        n_tune = max(2 * settings.n_folds, len(pool) * settings.tune_windows // want)
        ctx.warn(f"the corpus gives {len(pool)} windows of {settings.window_len}, fewer than the {want} asked for; "
                 f"using {len(pool) - n_tune} for probing and {n_tune} for tuning alphas")  # fmt: skip
    if len(pool) - n_tune < 2 * settings.n_folds:
        raise ValueError(
            f"the corpus gives only {len(pool)} windows of {settings.window_len} pieces; need at least "
            f"{2 * settings.n_folds} to probe plus {n_tune} to tune: use a larger corpus or a smaller window_len"
        )
    order = np.random.default_rng([ctx.seed, 7]).permutation(len(pool))
    return subset(pool, np.sort(order[n_tune:])), subset(pool, np.sort(order[:n_tune]))


def _timed_step(ctx: Any, name: str, fn: Any) -> pd.DataFrame:
    t0 = time.perf_counter()
    out = ctx.step(name, fn)
    seconds = round(time.perf_counter() - t0, 1)
    ctx.note(f"seconds_{name}", seconds)
    ctx.log(f"{name}: {len(out)} rows in {seconds}s")
    return out


def _tag(res: pd.DataFrame, **columns: str) -> pd.DataFrame:
    return res.assign(**columns)


def _numpy(t: Any) -> np.ndarray:
    return t.detach().float().cpu().numpy()
