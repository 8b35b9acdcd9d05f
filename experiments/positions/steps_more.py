"""The relative-order, probe-free, position-table, MDL, confusion and capacity-sweep steps of `ProbeDesign`
(split from `steps` by size; old name `design_more`; a mixin: every method uses the design's settings, sites,
alphas and job runner).
Each step builds its independent probes as jobs (`experiments.jobs.Job`), run by the design's job service."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pandas as pd
from bertscope.experiments.jobs import Job
from bertscope.experiments.positions import capacity, probing
from bertscope.experiments.positions.data import CONTENT, site_layer
from bertscope.experiments.positions.measures import (
    linear_cka,
    pair_features,
    permute_positions,
    sample_pairs,
    variance_share,
)


class MoreSteps:
    """Steps of `ProbeDesign` beyond the absolute-position probes (see the module docstring)."""

    s: Any
    seed: int
    jobs: Any  # experiments.jobs.JobService
    notes: dict[str, Any]

    # -- relative position
    def relative_pairs(self, acts: dict) -> pd.DataFrame:
        s, jobs = self.s, []
        real = acts[("windows", "none")]
        n_win = len(np.unique(real.seq))
        pairs = sample_pairs(n_win, s.window_len, s.pairs_per_window, seed=self.seed)
        content = real.kind == CONTENT  # rows of content_grid: windows in order, then positions
        groups = real.group[content].reshape(n_win, -1)[:, 0][pairs.seq]
        tokens = real.token[content].reshape(n_win, -1)
        # Hewitt-Liang control for pairs: a fixed random label per (type_i, type_j)
        pair_types = tokens[pairs.seq, pairs.i] * (int(tokens.max()) + 1) + tokens[pairs.seq, pairs.j]
        grids: dict[tuple[str, str], np.ndarray] = {}  # one grid per (condition, site), shared by its jobs
        train = self._train_pairs() if self.train_acts is not None else None
        for target, labels in (("order", pairs.before), ("distance_bucket", pairs.bucket)):
            control = self._control_fn(pair_types, labels)
            if train is not None:  # --eval-corpus: control labels per (type_i, type_j) over both corpora's pairs
                control = self._pair_split_control(train, target, tokens, pairs)
            for features in ("concat", "diff"):
                alpha = self.alpha(f"{target}_{features}")
                # shuffled / zeroed-position pair probes for the order target only (budget)
                conditions = ("none", "shuffled", "zeroed_positions") if target == "order" else ("none",)
                for condition in conditions:
                    if ("windows", condition) not in acts:  # no zeroed-position null without position embeddings
                        continue
                    for site in self.residual:
                        if (condition, site) not in grids:
                            grids[condition, site] = acts[("windows", condition)].content_grid(site)
                        X = partial(pair_features, grids[condition, site], pairs, features)  # made in the worker
                        fit_on = None
                        if train is not None:  # fit on --corpus's window pairs of the same condition and site
                            t_pairs, t_groups = train["pairs"], train["groups"]
                            grid = self.train_acts[("windows", condition)].content_grid(site)
                            fit_on = (partial(pair_features, grid, t_pairs, features), getattr(t_pairs, _LABEL[target]),
                                      t_groups)  # fmt: skip
                        jobs.append(self.score_job(X, labels, groups, "classification", alpha,
                                                   control=control if condition == "none" else None,
                                                   data="windows", site=site, target=target, features=features,
                                                   token="pair", control_name=condition,
                                                   metrics=("accuracy", "macro_f1"), train=fit_on))  # fmt: skip
        return pd.concat(self.run(jobs, "relative order (pairs)"), ignore_index=True)

    def _train_pairs(self) -> dict[str, Any]:
        """``--eval-corpus``: the pairs sampled from ``--corpus``'s probed windows (as from the eval windows),
        their window groups and their tokens ``[window, pos]``."""
        t = self.train_acts[("windows", "none")]
        n_win = len(np.unique(t.seq))
        content = t.kind == CONTENT
        pairs = sample_pairs(n_win, self.s.window_len, self.s.pairs_per_window, seed=self.seed)
        return {"pairs": pairs, "groups": t.group[content].reshape(n_win, -1)[:, 0][pairs.seq],
                "tokens": t.token[content].reshape(n_win, -1)}  # fmt: skip

    def _pair_split_control(self, train: dict, target: str, tokens: np.ndarray, pairs: Any) -> tuple:
        """Hewitt-Liang pair control labels (one per (type_i, type_j)) of the training and the scored pairs,
        drawn once over both so that a type pair keeps its label across the corpora."""
        t_pairs, t_tokens = train["pairs"], train["tokens"]
        base = int(max(tokens.max(), t_tokens.max())) + 1
        types = np.concatenate([t_tokens[t_pairs.seq, t_pairs.i] * base + t_tokens[t_pairs.seq, t_pairs.j],
                                tokens[pairs.seq, pairs.i] * base + tokens[pairs.seq, pairs.j]])  # fmt: skip
        label = _LABEL[target]
        both = self._control_labels(types, np.concatenate([getattr(t_pairs, label), getattr(pairs, label)]))
        return both[: len(t_pairs.i)], both[len(t_pairs.i) :]

    # -- probe-free
    def probe_free(self, acts: dict, tables: dict[str, np.ndarray] | None) -> pd.DataFrame:
        s, fns = self.s, []
        # no table (rotary/relative positions): variance share only, no CKA with the table
        table = None if tables is None else tables["W_pos"][1 : s.window_len + 1]
        for condition in ("none", "shuffled", "zeroed_positions", "permuted_positions"):
            key = ("windows", "none" if condition == "permuted_positions" else condition)
            if key not in acts:  # no zeroed-position null without position embeddings
                continue
            sites = self.sites if condition == "none" or s.sublayer_controls else self.residual
            for site in sites:
                fns.append(partial(_probe_free_rows, acts[key].content_grid(site), table, site=site,
                                   condition=condition, n_boot=s.n_boot, seed=self.seed))  # fmt: skip
        out = self.jobs.map(fns)
        return self._frame(pd.DataFrame([row for rows in out for row in rows]))

    # -- position table
    def position_table(self, table: np.ndarray) -> pd.DataFrame:
        s = self.s
        res = probing.table_probes(table, n_folds=max(s.n_folds, 5), n_boot=s.n_boot, n_pairs=s.table_pairs,
                                   pair_alphas=s.alphas, pair_folds=s.n_folds, seed=self.seed, n_jobs=s.n_jobs,
                                   threads=s.blas_threads)  # fmt: skip
        res = res.assign(data="table", token="table", site="position_table", control="position_table")
        return self._frame(res.drop(columns=["labels"], errors="ignore"))

    # -- MDL
    def mdl(self, acts: dict) -> pd.DataFrame:
        """Online codelength of absolute position and of its control task per residual site (one step each)."""
        real = acts[("windows", "none")]
        sel = real.kind == CONTENT
        y, groups = real.pos[sel] - 1, real.group[sel]
        control = self._control_labels(real.token[sel], y)
        backend = self.backend()
        jobs = [Job("mdl", dict(site=site, alphas="per_block_prefix", backend=backend),
                    partial(probing.mdl_rows, real.feats[site][sel], y, groups, control, n_blocks=self.s.mdl_blocks,
                            seed=self.seed, backend=backend),
                    partial(self._mdl_frame, site=site)) for site in self.residual]  # fmt: skip
        return pd.concat(self.run(jobs, "MDL"), ignore_index=True)

    def _mdl_frame(self, rows: pd.DataFrame, site: str) -> pd.DataFrame:
        return self._frame(rows.assign(data="windows", site=site, target="abs_class", features="h"))

    # -- heatmaps
    def confusion(self, acts: dict) -> pd.DataFrame:
        real = acts[("windows", "none")]
        sel = real.kind == CONTENT
        y, groups = real.pos[sel] - 1, real.group[sel]
        alpha = self.alpha("abs_class")
        chosen = self.s.heatmap_sites or (self.residual[1], self.reference, self.residual[-1])
        fns = [partial(probing.grouped_oof_predict, real.feats[site][sel], y, groups, task="classification",
                       alpha=alpha, n_folds=self.s.n_folds, seed=self.seed, backend=self.s.backend)
               for site in chosen]  # fmt: skip
        if self.train_acts is not None:  # --eval-corpus: fit on --corpus's windows, predict every eval window
            train = [self._train(("windows", "none"), site, lambda a: a.kind == CONTENT, lambda a: a.pos - 1)
                     for site in chosen]  # fmt: skip
            fns = [partial(probing.split_predict, tr[0], tr[1], real.feats[site][sel], task="classification",
                           alpha=alpha, seed=self.seed, backend=self.s.backend)
                   for tr, site in zip(train, chosen, strict=True)]  # fmt: skip
        preds = self.jobs.map(fns)
        parts = []
        for i, site in enumerate(chosen):
            counts = pd.crosstab(y, preds[i]).stack().rename("count").reset_index()
            counts.columns = ["true", "pred", "count"]
            layer, component = site_layer(site)
            parts.append(counts.assign(site=site, layer=layer, component=component, **self.labels))
        return pd.concat(parts, ignore_index=True)

    # -- capacity sweep (Hewitt & Liang 2019): `capacity` fits one alpha path per fold
    def tune_capacity(self, tuning: Any) -> float:
        """Choose the operating point of the absolute-position probe by selectivity on the tuning windows
        (`capacity.sweep_scores` at every tuning site, mean selectivity, ties to the stronger L2). One cached
        step per site; the scores go to the notes."""
        sel = tuning.kind == CONTENT
        y, groups, types = tuning.pos[sel] - 1, tuning.group[sel], tuning.token[sel]
        control = self._control_labels(types, y)
        jobs = [Job("capacity_tuning", dict(site=site, alphas=tuple(self.s.sweep_alphas)),
                    partial(capacity.sweep_scores, tuning.feats[site][sel], y, groups, control,
                            alphas=self.s.sweep_alphas, n_folds=self.s.n_folds, seed=self.seed, n_boot=0))
                for site in self.tuning_sites]  # fmt: skip
        scores = pd.concat(self.run(jobs, "capacity (tuning windows)"))
        self._capacity = capacity.choose_capacity(scores)
        mean = scores[scores["control"] == "selectivity"].groupby("alpha")["value"].mean()
        self.notes["capacity_choice"] = {"alpha": self._capacity, "tuning_selectivity_by_alpha":
                                         {f"{a:g}": round(float(v), 4) for a, v in mean.items()}}  # fmt: skip
        return self._capacity

    def capacity_sweep(self, acts: dict) -> pd.DataFrame:
        """Accuracy, control accuracy and selectivity of the absolute-position probe along ``sweep_alphas``
        at the sweep sites of the probed windows (``probe="sweep"``, one cached step per site); the alpha
        chosen on the tuning windows (`tune_capacity`) is marked ``chosen="tuning_selectivity"``, the others
        ``"sweep"``."""
        real = acts[("windows", "none")]
        sel = real.kind == CONTENT
        y, groups, types = real.pos[sel] - 1, real.group[sel], real.token[sel]
        control = self._control_labels(types, y)
        sites = list(self.s.sweep_sites or (self.residual[1], self.residual[-1]))
        jobs = []
        for site in sites:
            key, train = dict(site=site, alphas=tuple(self.s.sweep_alphas), n_boot=self.s.sweep_boot), None
            tr = self._train(("windows", "none"), site, lambda a: a.kind == CONTENT, lambda a: a.pos - 1)
            if tr is not None:  # --eval-corpus: the sweep's probes fit on --corpus's windows
                c_tr, control = self._split_control(tr, types, y)
                key["trained_on"], train = "train_corpus", (tr[0], tr[1], c_tr)
            jobs.append(Job("capacity_sweep", key,
                            partial(capacity.sweep_scores, real.feats[site][sel], y, groups, control,
                                    alphas=self.s.sweep_alphas, n_folds=self.s.n_folds, seed=self.seed,
                                    n_boot=self.s.sweep_boot, train=train),
                            partial(self._sweep_frame, site=site)))  # fmt: skip
        parts = self.run(jobs, "capacity sweep")
        return pd.concat([res.assign(chosen=np.where(res["alpha"] == self._capacity, "tuning_selectivity", "sweep"))
                          for res in parts], ignore_index=True)  # fmt: skip

    def _sweep_frame(self, res: pd.DataFrame, site: str) -> pd.DataFrame:
        return self._frame(res.assign(data="windows", site=site, token="content", target="abs_class", features="h"))


_LABEL = {"order": "before", "distance_bucket": "bucket"}  # the `measures.Pairs` field of each pair target


def _probe_free_rows(grid: np.ndarray, table: np.ndarray | None, *, site: str, condition: str, n_boot: int,
                     seed: int) -> list[dict[str, Any]]:  # fmt: skip
    """Variance share (and CKA with the position table, when there is one) of one site's ``[window, pos, d]``
    grid; ``condition="permuted_positions"`` permutes positions inside each window first (the baseline)."""
    if condition == "permuted_positions":
        grid = permute_positions(grid, seed=seed)
    n = grid.shape[0] * grid.shape[1]
    share = variance_share(grid, n_boot=n_boot, seed=seed)
    meta = dict(data="windows", site=site, target="abs_position", features="h", probe="none", control=condition,
                n_test=n, n_groups=grid.shape[0])  # fmt: skip
    rows = [{**meta, "metric": "variance_share", "value": share["value"], "ci_low": share["ci_low"],
             "ci_high": share["ci_high"], "n_boot": n_boot},
            {**meta, "metric": "variance_share_raw", "value": share["raw"]}]  # fmt: skip
    if table is not None:
        cka = linear_cka(grid, table)
        rows.append({**meta, "metric": "cka_position_embedding", "value": cka["value"], "ci_low": cka["ci_low"],
                     "ci_high": cka["ci_high"]})  # fmt: skip
    return rows
