"""The probe design of the positions experiment (the run's resumable stages; old name `design`): which probe runs
on which rows, with which alpha.

`ProbeDesign` turns cached activations into the long results table, one probe at a time; each probe's scores
are a cached step of their own. Measurement itself is in `probing` (probes) and `measures` (probe-free).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
from bertscope.experiments.jobs import Job, JobService
from bertscope.experiments.positions import probing
from bertscope.experiments.positions.data import CLS, CONTENT, SEP, Activations, site_layer
from bertscope.experiments.positions.measures import pair_features, sample_pairs
from bertscope.experiments.positions.steps_more import MoreSteps

COLUMNS = [
    "model", "corpus", "data", "token", "site", "layer", "component", "target", "features", "probe", "control",
    "metric", "value", "ci_low", "ci_high", "baseline_chance", "baseline_majority", "n_train", "n_test",
    "n_groups", "alpha", "n_folds", "n_boot", "repeats", "ci_covers", "chosen",
]  # fmt: skip
# ``repeats``: cross-validation runs pooled (fold and control-label seeds); ``ci_covers``: the variance the
# interval covers ("groups": window/sentence bootstrap of one CV run; "groups+repeats": also the repeats;
# "none": no interval); ``chosen``: how the row's alpha was chosen ("tuning_accuracy": best accuracy on the
# tuning windows; "tuning_selectivity": best selectivity on the tuning windows; "nested": per outer fold by an
# inner grouped CV on its training split; "sweep": a grid point of the capacity sweep, not chosen).


class ProbeDesign(MoreSteps):
    """The probes of one run, sharing sites, settings and the per-family alpha choices.

    Gets plain values and the run's job service (never the run context): ``jobs`` (`experiments.jobs.JobService`)
    runs the independent probes of each step on its workers and caches each probe as its own step the moment it
    arrives (an interrupted run keeps the probes it finished), with the serial run's results. Facts for the
    manifest (the alpha choices and their CV scores) are collected in ``notes``; ``run`` records them.
    """

    def __init__(
        self, settings: Any, labels: dict[str, str], sites: list[str], residual: list[str], *, seed: int,
        jobs: JobService, train_acts: dict | None = None,
    ) -> None:  # fmt: skip
        self.s, self.labels, self.seed, self.jobs = settings, labels, seed, jobs
        # --eval-corpus: the --corpus activation sets the windows / sentences / [CLS]/[SEP] probes are fit on
        # (keyed like ``acts``); None = every probe cross-validated within ``acts``
        self.train_acts = train_acts
        self.notes: dict[str, Any] = {}
        self.sites, self.residual = sites, residual
        self.reference = residual[1 + len(residual) // 2] if len(residual) > 2 else residual[-1]
        # alphas are chosen on these sites of the tuning windows: the bottom, the middle and the top
        self.tuning_sites = list(dict.fromkeys(["embed.hook_out", self.reference, residual[-1]]))
        self._alphas: dict[str, float] = {}
        self._capacity: float = float("nan")

    # -- absolute position
    def absolute_windows(self, acts: dict) -> pd.DataFrame:
        s, jobs = self.s, []
        real = acts[("windows", "none")]
        sel = real.kind == CONTENT
        y, groups, types = real.pos[sel] - 1, real.group[sel], real.token[sel]
        control = self._control_fn(types, y)
        a_cls, a_reg = self.alpha("abs_class"), self.alpha("abs_reg")
        content, position = (lambda a: a.kind == CONTENT), (lambda a: a.pos - 1)
        for site in self.sites:
            X = real.feats[site][sel]
            tr = self._train(("windows", "none"), site, content, position)
            if tr is not None:  # --eval-corpus: fit on --corpus's windows, score every eval window
                c_tr, c_te = self._split_control(tr, types, y)
                kw = dict(data="windows", site=site, target="abs_class")
                jobs.append(self.score_job(X, y, groups, "classification", a_cls, control=(c_tr, c_te),
                                           train=tr[:3], **kw))  # fmt: skip
                jobs.append(self.score_job(X, y.astype(float), groups, "regression", a_reg,
                                           control=(c_tr.astype(float), c_te.astype(float)),
                                           train=(tr[0], tr[1].astype(float), tr[2]), **{**kw, "target": "abs_reg"}))
                continue
            headline = s.repeats if site in self.residual else 1  # the summary rows get repeated CV
            jobs.append(self.score_job(X, y, groups, "classification", a_cls, control=control, repeats=headline,
                                       data="windows", site=site, target="abs_class"))  # fmt: skip
            jobs.append(self.score_job(X, y.astype(float), groups, "regression", a_reg,
                                       control=partial(_as_float, control),
                                       data="windows", site=site, target="abs_reg"))  # fmt: skip
        n_real = len(jobs)
        control_sites = self.sites if s.sublayer_controls else self.residual
        for condition in ("shuffled", "zeroed_positions"):
            if ("windows", condition) not in acts:  # no zeroed-position null without position embeddings
                continue
            other = acts[("windows", condition)]
            osel = other.kind == CONTENT
            yo, go = other.pos[osel] - 1, other.group[osel]
            for site in control_sites:
                X = other.feats[site][osel]
                tr = self._train(("windows", condition), site, content, position)
                tr_reg = None if tr is None else (tr[0], tr[1].astype(float), tr[2])
                jobs.append(self.score_job(X, yo, go, "classification", a_cls, data="windows", site=site,
                                           target="abs_class", control_name=condition,
                                           train=None if tr is None else tr[:3]))  # fmt: skip
                jobs.append(self.score_job(X, yo.astype(float), go, "regression", a_reg, data="windows",
                                           site=site, target="abs_reg", control_name=condition,
                                           train=tr_reg))  # fmt: skip
        parts = self.run(jobs, "absolute position (windows)")
        if self.train_acts is None:
            ceiling = probing.memorisation_ceiling(types, y, groups, n_folds=s.n_folds, seed=self.seed,
                                                   repeats=s.repeats)  # fmt: skip
            how = {"n_folds": s.n_folds, "repeats": s.repeats, "ci_covers": "folds+repeats (range)"}
        else:  # --eval-corpus: the types of --corpus's windows the probes were fit on
            t = self.train_acts[("windows", "none")]
            ceiling = probing.memorisation_ceiling_split(t.token[t.kind == CONTENT], types, groups, n_boot=s.n_boot,
                                                         seed=self.seed)  # fmt: skip
            how = {"n_folds": 0, "repeats": 1, "ci_covers": "groups", "n_train": int(np.sum(t.kind == CONTENT))}
        parts.insert(n_real, self._frame(pd.DataFrame([
            {"data": "windows", "token": "content", "site": site, "target": "abs_class", "features": "h",
             "probe": "memorisation",
             "control": "memorisation_ceiling", "metric": "accuracy", "value": ceiling["value"],
             "ci_low": ceiling["low"], "ci_high": ceiling["high"], "n_test": len(y),
             "n_groups": len(np.unique(groups)), **how}
            for site in self.residual
        ])))  # fmt: skip
        return pd.concat(parts, ignore_index=True)

    def absolute_sentences(self, acts: dict) -> pd.DataFrame:
        """Natural sentences: content pieces at positions 0 .. P-1 as classes (later pieces are left out of
        the class probe), every content piece for the regression probe."""
        jobs = []
        for condition in ("none", "shuffled"):
            a = acts[("sentences", condition)]
            content = a.kind == CONTENT
            y_all = a.pos - 1
            in_range = content & (y_all < self.s.window_len)
            control = self._control_fn(a.token[in_range], y_all[in_range])
            control_reg = partial(_as_float, self._control_fn(a.token[content], y_all[content]))
            a_cls, a_reg = self.alpha("abs_class"), self.alpha("abs_reg")  # the families tuned on windows
            for site in self.residual:
                X = a.feats[site]
                kw = dict(data="sentences", site=site, control_name=condition)
                if self.train_acts is not None:  # --eval-corpus: fit on --corpus's sentences
                    jobs += self._sentence_split_jobs(a, site, condition, in_range, content, kw)
                    continue
                jobs.append(self.score_job(X[in_range], y_all[in_range], a.group[in_range], "classification",
                                           a_cls, control=control if condition == "none" else None,
                                           target="abs_class", **kw))  # fmt: skip
                jobs.append(self.score_job(X[content], y_all[content].astype(float), a.group[content],
                                           "regression", a_reg, control=control_reg if condition == "none" else None,
                                           target="abs_reg", **kw))  # fmt: skip
        return pd.concat(self.run(jobs, "absolute position (sentences)"), ignore_index=True)

    def _sentence_split_jobs(self, a: Activations, site: str, condition: str, in_range: np.ndarray,
                             content: np.ndarray, kw: dict) -> list[Job]:  # fmt: skip
        """`absolute_sentences`' two probes of one site with ``--eval-corpus``: fit on the ``--corpus``
        sentences of the same condition, scored on every eval sentence (control task on the real ones)."""
        n = self.s.window_len
        key = ("sentences", condition)
        y_all = a.pos - 1
        tr_cls = self._train(key, site, lambda t: (t.kind == CONTENT) & (t.pos - 1 < n), lambda t: t.pos - 1)
        tr_reg = self._train(key, site, lambda t: t.kind == CONTENT, lambda t: (t.pos - 1).astype(float))
        c_cls = c_reg = None
        if condition == "none":
            c_cls = self._split_control(tr_cls, a.token[in_range], y_all[in_range])
            c_reg = tuple(c.astype(float) for c in self._split_control(tr_reg, a.token[content], y_all[content]))
        X = a.feats[site]
        return [self.score_job(X[in_range], y_all[in_range], a.group[in_range], "classification",
                               self.alpha("abs_class"), control=c_cls, target="abs_class", train=tr_cls[:3], **kw),
                self.score_job(X[content], y_all[content].astype(float), a.group[content], "regression",
                               self.alpha("abs_reg"), control=c_reg, target="abs_reg", train=tr_reg[:3],
                               **kw)]  # fmt: skip

    def specials(self, acts: dict) -> pd.DataFrame:
        """[CLS] and the final [SEP], reported apart: in natural sentences, the [SEP]'s own position and the
        number of content pieces read from [CLS] (both vary with the sentence), by ridge regression.

        No tuning windows exist for these targets, so alpha is chosen by properly nested CV: per outer fold, by
        an inner grouped CV on that fold's training split only (``chosen="nested"``; the ``alpha`` column is
        the median of the per-fold choices)."""
        jobs = []
        grid = tuple(self.s.ridge_alphas)
        for condition in ("none", "shuffled"):
            a = acts[("sentences", condition)]
            for kind, target, label in ((SEP, "sep_position", a.pos), (CLS, "cls_length", a.length - 2)):
                sel = a.kind == kind
                y, groups = label[sel].astype(float), a.group[sel]
                for site in self.residual:
                    tr = self._train(("sentences", condition), site, lambda t, k=kind: t.kind == k,
                                     partial(_special_target, target))
                    jobs.append(self.score_job(a.feats[site][sel], y, groups, "regression", grid,
                                               data="sentences", site=site, target=target, control_name=condition,
                                               token="sep" if kind == SEP else "cls",
                                               train=None if tr is None else tr[:3]))  # fmt: skip
        return pd.concat(self.run(jobs, "[CLS]/[SEP]"), ignore_index=True)

    # -- helpers
    def tune(self, tuning: Activations) -> None:
        """Choose the alpha of every probe family on the tuning windows (disjoint from the probed ones); the
        choices are one cached step."""
        chosen = self.jobs.step("alphas", lambda: self._tune(tuning))
        for row in chosen.itertuples():
            self._alphas[row.family] = float(row.alpha)
            self.notes[f"alpha_{row.family}"] = {"alpha": float(row.alpha),
                                                 "cv_score_by_alpha": json.loads(row.scores)}  # fmt: skip

    def _tune(self, tuning: Activations) -> pd.DataFrame:
        """Grouped-CV scores of every family's alpha grid at each of its tuning sites (one parallel job per
        family and site, `probing.alpha_scores`), averaged over the sites and chosen (`probing.choose_alpha`)."""
        sel = tuning.kind == CONTENT
        y, groups = tuning.pos[sel] - 1, tuning.group[sel]
        n_win = len(np.unique(tuning.seq))
        pairs = sample_pairs(n_win, self.s.window_len, self.s.pairs_per_window, seed=self.seed + 1)
        pair_groups = tuning.group[sel].reshape(n_win, -1)[:, 0][pairs.seq]
        families: dict[str, list] = {}  # family -> [(X or a callable making X, labels, groups, task, alphas)]
        for family, task, target, alphas in (("abs_class", "classification", y, self.s.alphas),
                                             ("abs_reg", "regression", y.astype(float), self.s.ridge_alphas)):
            families[family] = [(tuning.feats[site][sel], target, groups, task, alphas) for site in self.tuning_sites]
        for target, labels in (("order", pairs.before), ("distance_bucket", pairs.bucket)):
            for features in ("concat", "diff"):  # pairs: tuned at the middle site only (budget)
                X = partial(pair_features, tuning.content_grid(self.reference), pairs, features)
                families[f"{target}_{features}"] = [(X, labels, pair_groups, "classification", self.s.alphas)]
        jobs = [(f, i, partial(probing.alpha_scores, *args, n_folds=self.s.n_folds, seed=self.seed,
                               backend=self.backend(pair=not f.startswith("abs_"))))
                for f, sets in families.items() for i, args in enumerate(sets)]  # fmt: skip
        cost = [_size(families[f][i][0]) * (0.1 if families[f][i][3] == "regression" else 1) for f, i, _ in jobs]
        results = self.jobs.map([fn for _, _, fn in jobs], cost=cost)
        scores = {job[:2]: res for job, res in zip(jobs, results, strict=True)}
        rows = []
        for family, sets in families.items():
            alphas = sets[0][4]
            alpha, by_alpha = probing.choose_alpha([scores[family, i] for i in range(len(sets))], alphas)
            self._alphas[family] = alpha
            rows.append({"family": family, "alpha": alpha, "scores": json.dumps(by_alpha)})
        return pd.DataFrame(rows)

    def backend(self, pair: bool = False) -> str:
        """The probe solver: ``settings.backend`` for the absolute-position probes and their MDL code;
        scikit-learn for the pair probes (one logit or a few classes on 3,072 rows, where both solvers reach the
        same accuracy and torch saved under 10% of the step's CPU)."""
        return "sklearn" if pair else self.s.backend

    def alpha(self, family: str) -> float:
        """The alpha of a probe family, chosen by `tune` on the tuning windows."""
        if family not in self._alphas:
            raise KeyError(f"no alpha for probe family {family!r}; call tune() first")
        return self._alphas[family]

    def run(self, jobs: Sequence[Job], desc: str) -> list[pd.DataFrame]:
        """The jobs' tables in order, the uncached ones computed on the service's workers (`JobService.run`)."""
        return self.jobs.run(jobs, desc)

    def score(self, X: Any, y: np.ndarray, groups: np.ndarray, task: str, alpha: float | tuple,
              **kw: Any) -> pd.DataFrame:  # fmt: skip
        """One probe's scores, computed here (`score_job`, same arguments) or read from its cached step."""
        return self.run([self.score_job(X, y, groups, task, alpha, **kw)], "probe")[0]

    def score_job(
        self,
        X: Any,
        y: np.ndarray,
        groups: np.ndarray,
        task: str,
        alpha: float | tuple,
        *,
        data: str,
        site: str,
        target: str,
        control: Any = None,
        control_name: str = "none",
        features: str = "h",
        token: str = "content",
        metrics: tuple[str, ...] | None = None,
        repeats: int = 1,
        n_boot: int | None = None,
        chosen: str | None = None,
        train: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    ) -> Job:
        """One probe's scores (`probing.probe_scores`) as a job cached as its own step: a rerun after Ctrl-C
        keeps every probe that finished. The key names the probe (data, site, target, features, token,
        condition, task, alpha, metrics, whether a control task runs, repeats); its inputs follow from those and
        the run's settings.

        ``X``: ``[n, d]`` features, or a picklable callable making them (in the worker); ``alpha``: a number
        (chosen on the tuning windows) or a tuple (nested CV per outer fold); ``control``: labels, or a
        function seed -> labels so that each repeat redraws the control task. ``train``: ``(X, y, groups)`` of
        another corpus's rows to fit the probe on (`probing.probe_split_scores`; ``control`` is then a pair of
        (training, scored) labels and ``repeats`` 1): the probe is scored on every row of ``X``."""
        n_boot = self.s.n_boot if n_boot is None else n_boot
        if chosen is None:
            chosen = "nested" if isinstance(alpha, tuple) else "tuning_accuracy"
        key = dict(data=data, site=site, target=target, features=features, token=token, control=control_name,
                   task=task, alpha=alpha, metrics=metrics, with_control=control is not None, repeats=repeats,
                   n_boot=n_boot, backend=self.backend(pair=token == "pair"))  # fmt: skip
        if train is not None:
            key["trained_on"] = "train_corpus"
            fn = partial(probing.probe_split_scores, *train, X, y, groups, task=task,
                         alpha=list(alpha) if isinstance(alpha, tuple) else alpha, n_boot=n_boot, seed=self.seed,
                         control=control, control_name=control_name, metrics=metrics, backend=key["backend"])
        else:
                fn = partial(_probe_scores, X, y, groups, task=task, alpha=list(alpha) if isinstance(alpha, tuple)
                         else alpha, n_folds=self.s.n_folds, n_boot=n_boot, seed=self.seed, control=control,
                         control_name=control_name, metrics=metrics, repeats=repeats, backend=key["backend"])

        def post(res: pd.DataFrame) -> pd.DataFrame:
            return self._frame(res.assign(data=data, site=site, token=token, target=target, features=features,
                                          chosen=chosen))  # fmt: skip

        fits = repeats * (2 if control is not None else 1) * (len(alpha) + 1 if isinstance(alpha, tuple) else 1)
        return Job("probe", key, fn, post, cost=_size(X) * fits * (1.0 if task == "classification" else 0.05))

    def _train(self, key: tuple[str, str], site: str, select: Callable[[Activations], np.ndarray],
               label: Callable[[Activations], np.ndarray]) -> tuple | None:  # fmt: skip
        """``(X, y, groups, types)`` of the ``--corpus`` rows a probe is fit on with ``--eval-corpus`` (the set
        ``key`` of `train_acts`, rows ``select(a)``, labels ``label(a)``); None without an eval corpus."""
        if self.train_acts is None:
            return None
        a = self.train_acts[key]
        m = select(a)
        return a.feats[site][m], label(a)[m], a.group[m], a.token[m]

    def _split_control(self, train: tuple, types: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Hewitt-Liang control labels of the training rows ``train`` (`_train`) and the scored rows (types,
        y), drawn once over both so that a word type keeps its control label across the two corpora."""
        both = self._control_labels(np.concatenate([train[3], types]), np.concatenate([train[1], y]))
        return both[: len(train[1])], both[len(train[1]) :]

    def _control_labels(self, types: np.ndarray, y: np.ndarray) -> np.ndarray:
        from bertscope.probes import control_labels

        return control_labels(types, y, seed=self.seed)

    def _control_fn(self, types: np.ndarray, y: np.ndarray) -> Callable[[int], np.ndarray]:
        """Control labels per repeat seed (seed ``self.seed`` gives `_control_labels`)."""
        from bertscope.probes import control_labels

        return lambda r: control_labels(types, y, seed=r)

    def _frame(self, df: pd.DataFrame) -> pd.DataFrame:
        df = df.copy()
        for col, value in self.labels.items():
            df[col] = value
        layer_component = [site_layer(s) if s != "position_table" else (0, "position_table") for s in df["site"]]
        df["layer"] = [lc[0] for lc in layer_component]
        df["component"] = [lc[1] for lc in layer_component]
        for col in COLUMNS:
            if col not in df:
                df[col] = np.nan
        return df[COLUMNS]


def _probe_scores(X: Any, *args: Any, **kwargs: Any) -> pd.DataFrame:
    """`probing.probe_scores` on X, or on ``X()`` when X is a callable making the features (in the worker)."""
    return probing.probe_scores(X() if callable(X) else X, *args, **kwargs)


def _special_target(target: str, a: Activations) -> np.ndarray:
    """The [CLS]/[SEP] regression target of every row of ``a``: the row's position (``sep_position``) or the
    sentence's content length (``cls_length``), as floats."""
    return (a.pos if target == "sep_position" else a.length - 2).astype(float)


def _as_float(control: Callable[[int], np.ndarray], seed: int) -> np.ndarray:
    """Control labels of repeat ``seed`` as floats (the regression probes' control task)."""
    return control(seed).astype(float)


def _size(X: Any) -> float:
    """Rows x features of X (or of the features a `functools.partial` of `pair_features` makes): a job's cost."""
    if isinstance(X, partial):
        grid, pairs, kind = X.args
        return float(len(pairs.i) * grid.shape[-1] * (2 if kind == "concat" else 1))
    return float(np.prod(np.shape(X)))
