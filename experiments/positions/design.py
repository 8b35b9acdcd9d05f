"""The probe design of the positions experiment: which probe runs on which rows, with which alpha.

`ProbeDesign` turns cached activations into the long results table, one probe at a time; each probe's scores
are a cached step of their own. Measurement itself is in `probing` (probes) and `measures` (probe-free).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from bertscope.experiments.positions import probing
from bertscope.experiments.positions.data import CLS, CONTENT, SEP, Activations, site_layer
from bertscope.experiments.positions.measures import (
    linear_cka,
    pair_features,
    permute_positions,
    sample_pairs,
    variance_share,
)

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


class ProbeDesign:
    """The probes of one run, sharing sites, settings and the per-family alpha choices.

    Gets plain values and three callables from the run (never the run context): ``step(name, fn, **key)``
    caches one result (every probe is its own step, so an interrupted run keeps the probes it finished),
    ``progress(iterable, desc)`` wraps a loop, ``note(key, value)`` records a fact for the manifest.
    """

    def __init__(
        self, settings: Any, labels: dict[str, str], sites: list[str], residual: list[str], *, seed: int,
        step: Callable[..., pd.DataFrame], progress: Callable[..., Any], note: Callable[[str, Any], None],
    ) -> None:  # fmt: skip
        self.s, self.labels, self.seed = settings, labels, seed
        self.step, self.progress, self.note = step, progress, note
        self.sites, self.residual = sites, residual
        self.reference = residual[1 + len(residual) // 2] if len(residual) > 2 else residual[-1]
        # alphas are chosen on these sites of the tuning windows: the bottom, the middle and the top
        self.tuning_sites = list(dict.fromkeys(["embed.hook_out", self.reference, residual[-1]]))
        self._alphas: dict[str, float] = {}
        self._capacity: float = float("nan")

    # -- absolute position
    def absolute_windows(self, acts: dict) -> pd.DataFrame:
        s, parts = self.s, []
        real = acts[("windows", "none")]
        sel = real.kind == CONTENT
        y, groups, types = real.pos[sel] - 1, real.group[sel], real.token[sel]
        control = self._control_fn(types, y)
        a_cls, a_reg = self.alpha("abs_class"), self.alpha("abs_reg")
        for site in self.progress(self.sites, "absolute position (windows)"):
            X = real.feats[site][sel]
            headline = s.repeats if site in self.residual else 1  # the summary rows get repeated CV
            parts.append(self.score(X, y, groups, "classification", a_cls, control=control, repeats=headline,
                                    data="windows", site=site, target="abs_class"))  # fmt: skip
            parts.append(self.score(X, y.astype(float), groups, "regression", a_reg,
                                    control=lambda r: control(r).astype(float),
                                    data="windows", site=site, target="abs_reg"))  # fmt: skip
        ceiling = probing.memorisation_ceiling(types, y, groups, n_folds=s.n_folds, seed=self.seed,
                                               repeats=s.repeats)  # fmt: skip
        parts.append(self._frame(pd.DataFrame([
            {"data": "windows", "token": "content", "site": site, "target": "abs_class", "features": "h",
             "probe": "memorisation",
             "control": "memorisation_ceiling", "metric": "accuracy", "value": ceiling["value"],
             "ci_low": ceiling["low"], "ci_high": ceiling["high"], "n_test": len(y), "n_folds": s.n_folds,
             "n_groups": len(np.unique(groups)), "repeats": s.repeats, "ci_covers": "folds+repeats (range)"}
            for site in self.residual
        ])))  # fmt: skip
        control_sites = self.sites if s.sublayer_controls else self.residual
        for condition in ("shuffled", "zeroed_positions"):
            if ("windows", condition) not in acts:  # no zeroed-position null without position embeddings
                continue
            other = acts[("windows", condition)]
            osel = other.kind == CONTENT
            for site in self.progress(control_sites, f"absolute position ({condition})"):
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
            control = self._control_fn(a.token[in_range], y_all[in_range])
            ctl_reg = self._control_fn(a.token[content], y_all[content])

            def control_reg(r: int, ctl_reg=ctl_reg) -> np.ndarray:
                return ctl_reg(r).astype(float)

            a_cls, a_reg = self.alpha("abs_class"), self.alpha("abs_reg")  # the families tuned on windows
            for site in self.progress(self.residual, f"absolute position (sentences, {condition})"):
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
        number of content pieces read from [CLS] (both vary with the sentence), by ridge regression.

        No tuning windows exist for these targets, so alpha is chosen by properly nested CV: per outer fold, by
        an inner grouped CV on that fold's training split only (``chosen="nested"``; the ``alpha`` column is
        the median of the per-fold choices)."""
        parts = []
        grid = tuple(self.s.ridge_alphas)
        for condition in ("none", "shuffled"):
            a = acts[("sentences", condition)]
            for kind, target, label in ((SEP, "sep_position", a.pos), (CLS, "cls_length", a.length - 2)):
                sel = a.kind == kind
                y, groups = label[sel].astype(float), a.group[sel]
                alpha = grid
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
        pairs = sample_pairs(n_win, s.window_len, s.pairs_per_window, seed=self.seed)
        content = real.kind == CONTENT  # rows of content_grid: windows in order, then positions
        groups = real.group[content].reshape(n_win, -1)[:, 0][pairs.seq]
        tokens = real.token[content].reshape(n_win, -1)
        # Hewitt-Liang control for pairs: a fixed random label per (type_i, type_j)
        pair_types = tokens[pairs.seq, pairs.i] * (int(tokens.max()) + 1) + tokens[pairs.seq, pairs.j]
        for target, labels in (("order", pairs.before), ("distance_bucket", pairs.bucket)):
            control = self._control_fn(pair_types, labels)
            for features in ("concat", "diff"):
                alpha = self.alpha(f"{target}_{features}")
                # shuffled / random-weights pair probes for the order target only (budget)
                conditions = ("none", "shuffled", "zeroed_positions") if target == "order" else ("none",)
                for condition in conditions:
                    if ("windows", condition) not in acts:  # no zeroed-position null without position embeddings
                        continue
                    a = acts[("windows", condition)]
                    for site in self.progress(self.residual, f"pairs {target}/{features} ({condition})"):
                        X = pair_features(a.content_grid(site), pairs, features)
                        parts.append(self.score(X, labels, groups, "classification", alpha,
                                                control=control if condition == "none" else None,
                                                data="windows", site=site, target=target, features=features,
                                                token="pair", control_name=condition,
                                                metrics=("accuracy", "macro_f1")))  # fmt: skip
        return pd.concat(parts, ignore_index=True)

    # -- probe-free
    def probe_free(self, acts: dict, tables: dict[str, np.ndarray] | None) -> pd.DataFrame:
        s, rows = self.s, []
        P = s.window_len
        for condition in ("none", "shuffled", "zeroed_positions", "permuted_positions"):
            key = ("windows", "none" if condition == "permuted_positions" else condition)
            if key not in acts:  # no zeroed-position null without position embeddings
                continue
            a = acts[key]
            # no table (rotary/relative positions): variance share only, no CKA with the table
            table = None if tables is None else tables["W_pos"][1 : P + 1]
            sites = self.sites if condition == "none" or s.sublayer_controls else self.residual
            for site in self.progress(sites, f"probe-free ({condition})"):
                grid = a.content_grid(site)
                if condition == "permuted_positions":
                    grid = permute_positions(grid, seed=self.seed)
                n = grid.shape[0] * grid.shape[1]
                share = variance_share(grid, n_boot=s.n_boot, seed=self.seed)
                meta = dict(data="windows", site=site, target="abs_position", features="h", probe="none",
                            control=condition, n_test=n, n_groups=grid.shape[0])  # fmt: skip
                rows.append({**meta, "metric": "variance_share", "value": share["value"],
                             "ci_low": share["ci_low"], "ci_high": share["ci_high"], "n_boot": s.n_boot})
                rows.append({**meta, "metric": "variance_share_raw", "value": share["raw"]})
                if table is not None:
                    cka = linear_cka(grid, table)
                    rows.append({**meta, "metric": "cka_position_embedding", "value": cka["value"],
                                 "ci_low": cka["ci_low"], "ci_high": cka["ci_high"]})  # fmt: skip
        return self._frame(pd.DataFrame(rows))

    # -- position table
    def position_table(self, table: np.ndarray) -> pd.DataFrame:
        s = self.s
        res = probing.table_probes(table, n_folds=max(s.n_folds, 5), n_boot=s.n_boot, n_pairs=s.table_pairs,
                           pair_alphas=s.alphas, pair_folds=s.n_folds, seed=self.seed)  # fmt: skip
        res = res.assign(data="table", token="table", site="position_table", control="position_table")
        return self._frame(res.drop(columns=["labels"], errors="ignore"))

    # -- MDL
    def mdl(self, acts: dict) -> pd.DataFrame:
        """Online codelength of absolute position and of its control task per residual site (one step each)."""
        real = acts[("windows", "none")]
        sel = real.kind == CONTENT
        y, groups = real.pos[sel] - 1, real.group[sel]
        control = self._control_labels(real.token[sel], y)
        parts = [
            self.step("mdl", lambda site=site: self._mdl_site(real.feats[site][sel], y, groups, control, site),
                      site=site, alphas="per_block_prefix")  # fmt: skip
            for site in self.progress(self.residual, "MDL")
        ]
        return pd.concat(parts, ignore_index=True)

    def _mdl_site(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray, control: np.ndarray,
                  site: str) -> pd.DataFrame:  # fmt: skip
        """Online codes of position and its control at one site (`probing.mdl_rows`)."""
        rows = probing.mdl_rows(X, y, groups, control, n_blocks=self.s.mdl_blocks, seed=self.seed)
        return self._frame(rows.assign(data="windows", site=site, target="abs_class", features="h"))

    # -- heatmaps
    def confusion(self, acts: dict) -> pd.DataFrame:
        real = acts[("windows", "none")]
        sel = real.kind == CONTENT
        y, groups = real.pos[sel] - 1, real.group[sel]
        alpha = self.alpha("abs_class")
        chosen = self.s.heatmap_sites or (self.residual[1], self.reference, self.residual[-1])
        parts = []
        for site in chosen:
            pred = probing.grouped_oof_predict(real.feats[site][sel], y, groups, task="classification", alpha=alpha,
                                       n_folds=self.s.n_folds, seed=self.seed)  # fmt: skip
            counts = pd.crosstab(y, pred).stack().rename("count").reset_index()
            counts.columns = ["true", "pred", "count"]
            layer, component = site_layer(site)
            parts.append(counts.assign(site=site, layer=layer, component=component, **self.labels))
        return pd.concat(parts, ignore_index=True)

    # -- helpers
    def tune(self, tuning: Activations) -> None:
        """Choose the alpha of every probe family on the tuning windows (disjoint from the probed ones); the
        choices are one cached step."""
        chosen = self.step("alphas", lambda: self._tune(tuning))
        for row in chosen.itertuples():
            self._alphas[row.family] = float(row.alpha)
            self.note(f"alpha_{row.family}", {"alpha": float(row.alpha), "cv_score_by_alpha": json.loads(row.scores)})

    def _tune(self, tuning: Activations) -> pd.DataFrame:
        self._scores: dict[str, dict[str, float]] = {}
        sel = tuning.kind == CONTENT
        y, groups = tuning.pos[sel] - 1, tuning.group[sel]
        feats = [tuning.feats[site][sel] for site in self.tuning_sites]
        self._choose("abs_class", feats, y, groups, "classification")
        self._choose("abs_reg", feats, y.astype(float), groups, "regression", alphas=self.s.ridge_alphas)
        n_win = len(np.unique(tuning.seq))
        pairs = sample_pairs(n_win, self.s.window_len, self.s.pairs_per_window, seed=self.seed + 1)
        pair_groups = tuning.group[sel].reshape(n_win, -1)[:, 0][pairs.seq]
        for target, labels in (("order", pairs.before), ("distance_bucket", pairs.bucket)):
            for features in ("concat", "diff"):  # pairs: tuned at the middle site only (budget)
                X = [pair_features(tuning.content_grid(self.reference), pairs, features)]
                self._choose(f"{target}_{features}", X, labels, pair_groups, "classification")
        return pd.DataFrame([{"family": f, "alpha": a, "scores": json.dumps(self._scores[f])}
                             for f, a in self._alphas.items()])  # fmt: skip

    def alpha(self, family: str) -> float:
        """The alpha of a probe family, chosen by `tune` on the tuning windows."""
        if family not in self._alphas:
            raise KeyError(f"no alpha for probe family {family!r}; call tune() first")
        return self._alphas[family]

    def _choose(
        self, family: str, feats: list[np.ndarray], y: np.ndarray, groups: np.ndarray, task: str,
        alphas: tuple[float, ...] | None = None,
    ) -> None:  # fmt: skip
        alpha, scores = probing.select_alpha(feats, y, groups, task=task, alphas=alphas or self.s.alphas,
                                             n_folds=self.s.n_folds, seed=self.seed)  # fmt: skip
        self._alphas[family] = alpha
        self._scores[family] = scores

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
        repeats: int = 1,
        n_boot: int | None = None,
        chosen: str | None = None,
    ) -> pd.DataFrame:
        """One probe's scores (`probing.probe_scores`), cached as its own step: a rerun after Ctrl-C keeps every
        probe that finished. The key names the probe (data, site, target, features, token, condition, task,
        alpha, metrics, whether a control task runs, repeats); its inputs follow from those and the run's settings.

        ``alpha``: a number (chosen on the tuning windows) or a tuple (nested CV per outer fold); ``control``:
        labels, or a function seed -> labels so that each repeat redraws the control task."""
        n_boot = self.s.n_boot if n_boot is None else n_boot
        if chosen is None:
            chosen = "nested" if isinstance(alpha, tuple) else "tuning_accuracy"
        key = dict(data=data, site=site, target=target, features=features, token=token, control=control_name,
                   task=task, alpha=alpha, metrics=metrics, with_control=control is not None, repeats=repeats,
                   n_boot=n_boot)  # fmt: skip

        def fit() -> pd.DataFrame:
            res = probing.probe_scores(X, y, groups, task=task, alpha=list(alpha) if isinstance(alpha, tuple)
                                       else alpha, n_folds=self.s.n_folds, n_boot=n_boot, seed=self.seed,
                                       control=control, control_name=control_name, metrics=metrics,
                                       repeats=repeats)  # fmt: skip
            return self._frame(res.assign(data=data, site=site, token=token, target=target, features=features,
                                          chosen=chosen))  # fmt: skip

        return self.step("probe", fit, **key)

    def _control_labels(self, types: np.ndarray, y: np.ndarray) -> np.ndarray:
        from bertscope.probes import control_labels

        return control_labels(types, y, seed=self.seed)

    def _control_fn(self, types: np.ndarray, y: np.ndarray) -> Callable[[int], np.ndarray]:
        """Control labels per repeat seed (seed ``self.seed`` gives `_control_labels`)."""
        from bertscope.probes import control_labels

        return lambda r: control_labels(types, y, seed=r)

    # -- capacity sweep (Hewitt & Liang 2019): `capacity` fits one alpha path per fold
    def tune_capacity(self, tuning: Activations) -> float:
        """Choose the operating point of the absolute-position probe by selectivity on the tuning windows
        (`capacity.sweep_scores` at every tuning site, mean selectivity, ties to the stronger L2). One cached
        step per site; the scores go to the notes."""
        from bertscope.experiments.positions import capacity

        sel = tuning.kind == CONTENT
        y, groups, types = tuning.pos[sel] - 1, tuning.group[sel], tuning.token[sel]
        control = self._control_labels(types, y)
        scores = pd.concat([self.step("capacity_tuning", lambda site=site: capacity.sweep_scores(
            tuning.feats[site][sel], y, groups, control, alphas=self.s.sweep_alphas, n_folds=self.s.n_folds,
            seed=self.seed, n_boot=0), site=site, alphas=tuple(self.s.sweep_alphas)) for site in self.tuning_sites])
        self._capacity = capacity.choose_capacity(scores)
        mean = scores[scores["control"] == "selectivity"].groupby("alpha")["value"].mean()
        self.note("capacity_choice", {"alpha": self._capacity, "tuning_selectivity_by_alpha":
                                      {f"{a:g}": round(float(v), 4) for a, v in mean.items()}})  # fmt: skip
        return self._capacity

    def capacity_sweep(self, acts: dict) -> pd.DataFrame:
        """Accuracy, control accuracy and selectivity of the absolute-position probe along ``sweep_alphas``
        at the sweep sites of the probed windows (``probe="sweep"``, one cached step per site); the alpha
        chosen on the tuning windows (`tune_capacity`) is marked ``chosen="tuning_selectivity"``, the others
        ``"sweep"``."""
        from bertscope.experiments.positions import capacity

        real = acts[("windows", "none")]
        sel = real.kind == CONTENT
        y, groups, types = real.pos[sel] - 1, real.group[sel], real.token[sel]
        control = self._control_labels(types, y)
        sites = list(self.s.sweep_sites or (self.residual[1], self.residual[-1]))
        parts = []
        for site in self.progress(sites, "capacity sweep"):
            res = self.step("capacity_sweep", lambda site=site: self._frame(capacity.sweep_scores(
                real.feats[site][sel], y, groups, control, alphas=self.s.sweep_alphas, n_folds=self.s.n_folds,
                seed=self.seed, n_boot=self.s.sweep_boot).assign(data="windows", site=site, token="content",
                target="abs_class", features="h")), site=site, alphas=tuple(self.s.sweep_alphas),
                n_boot=self.s.sweep_boot)  # fmt: skip
            parts.append(res.assign(chosen=np.where(res["alpha"] == self._capacity, "tuning_selectivity", "sweep")))
        return pd.concat(parts, ignore_index=True)

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
