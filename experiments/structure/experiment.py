"""Is the parse tree in each layer's geometry? Structural probes (Hewitt & Manning 2019) with controls.

For every site (the embedding output, each block's output, and with ``sublayers`` each block's ``attn_out``,
``resid_mid`` and ``mlp_out``) a distance probe (UUAS, DSpr) and a depth probe (root accuracy, NSpr) are
trained on word vectors (mean of each word's pieces) of ``n_train`` sentences, early-stopped on ``n_dev``
others and scored on ``n_test`` held-out sentences (a seeded split by sentence, stated in every row). All the
sites of a group are trained in one batched pass (`probes.StructuralProbe` with ``[n_sites, n_words, d]``
inputs). Conventions: `bertscope.probes.structural` (the authors' loss, regimen and reporter).

Controls: the embedding layer (non-contextual: layer 0); the same architecture with random weights
(``models.random_encoder``) at the residual sites; trees that use no representation (the linear chain, each
word attached to the next, and the expected UUAS of a random spanning tree); and a rank sweep (k = 1, 2, 4, ...
below d, plus full rank) of the distance probe at the residual sites, so a UUAS is also reported at the smallest
rank that reaches the full-rank interval. Intervals: group bootstrap over test sentences.

Outputs in ``OUT/structure/``: ``results.parquet|csv`` (long table, columns `COLUMNS`), ``summary`` (per
layer: the four metrics with intervals, the random-weights UUAS, the baselines, the smallest rank),
``rank_sweep``, ``examples`` and ``example_edges`` (gold and predicted trees of a few test sentences at the
layer with the highest UUAS), ``training`` (epochs and best dev loss per probe), and the figures of `plot`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from bertscope.experiments.structure import data, measures
from bertscope.probes.structural import KINDS, StructuralProbe, mst_edges, tree_distances

NAME = "structure"
DIRNAME = "structure"
SUMMARY_TABLES = ["summary.csv"]
COLUMNS = ["model", "corpus", "encoder", "site", "layer", "component", "kind", "metric", "rank", "value", "ci_low",
           "ci_high", "split", "n_sentences", "n_train", "n_dev", "n_test"]


@dataclass(frozen=True)
class Settings:
    """Sizes of the structure run. The regimen is the paper's (Adam 1e-3, batches of 20, patience 4); the sizes
    are cut to fit the default-run budget on 2 CPU cores: 400/100/200 sentences, at most 20 epochs, residual
    sites only (``sublayers=True`` adds attn_out, resid_mid, mlp_out: about 3.5x the time)."""

    n_train: int = 400  # training sentences
    n_dev: int = 100  # early-stopping sentences
    n_test: int = 200  # scored sentences
    max_epochs: int = 20  # the paper's config has 40
    patience: int = 4  # stop when the best dev epoch is more than this many epochs old (regimen.py)
    batch_size: int = 20  # sentences per step (the paper's config)
    lr: float = 1e-3  # Adam (regimen.py)
    sublayers: bool = False  # also probe attn_out, resid_mid, mlp_out of every block
    random_weights: bool = True  # the random-weights control at the residual sites
    ranks: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)  # rank sweep, plus full rank (ranks >= d are skipped)
    n_boot: int = 1000  # group-bootstrap resamples (sentences)
    ci: float = 0.95
    n_examples: int = 3  # test sentences drawn as gold vs predicted trees
    threads: int | None = 1  # torch threads while training (None: leave as is); many small steps

    def __post_init__(self) -> None:
        for name in ("n_train", "n_dev", "n_test"):
            if getattr(self, name) < 2:
                raise ValueError(f"{name} must be >= 2, got {getattr(self, name)}")
        if self.max_epochs < 1 or self.batch_size < 1 or self.patience < 0:
            raise ValueError("max_epochs and batch_size must be >= 1, patience >= 0")
        if any(k < 1 for k in self.ranks):
            raise ValueError(f"ranks must be positive, got {self.ranks}")


def run(ctx: Any, settings: Settings | None = None) -> pd.DataFrame:
    """Run the experiment into ``ctx.out_dir``; returns the main long table. Each trained probe is a cached
    step (its projection), so an interrupted run resumes with the probes it finished."""
    from bertscope.experiments.options import UsageError

    settings = ctx.use_settings(settings)
    t0 = time.perf_counter()
    corpus = ctx.corpus
    if not corpus.has_syntax:
        raise UsageError(f"structure needs gold dependency trees, and corpus {ctx.corpus_id!r} has none; use "
                         "--corpus builtin or a .conllu file")
    ctx.note("settings", dataclasses.asdict(settings))
    model = ctx.model.eval()
    n_layers = model.config.n_layers
    split = data.split_sentences(len(corpus), settings.n_train, settings.n_dev, settings.n_test, ctx.rng("split"))
    chosen = [corpus[int(i)] for i in split.all()]
    encoded = ctx.encode(chosen, sort_by_length=True)
    residual = data.residual_sites(n_layers)
    sites = residual + (data.sublayer_sites(n_layers) if settings.sublayers else [])
    n_words = [len(s) for s in chosen]
    old_threads = torch.get_num_threads()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    try:
        vectors, truncated = data.collect(model, encoded, sites, n_words)
        parts = _local_parts(split, set(truncated))
        ctx.note("n_left_out_truncated", len(truncated))
        ctx.note("split", {k: len(v) for k, v in parts.items()})
        ctx.log(f"{len(chosen)} sentences: {', '.join(f'{k} {len(v)}' for k, v in parts.items())}; "
                f"{len(sites)} sites ({time.perf_counter() - t0:.1f}s)")
        heads = [list(s.heads) for s in chosen]
        punct = data.punct_masks(chosen)
        info = {"model": ctx.model_id, "corpus": ctx.corpus_id, "split": "test",
                "n_train": len(parts["train"]), "n_dev": len(parts["dev"]), "n_test": len(parts["test"])}
        runner = _Runner(ctx, settings, parts, heads, punct, info)
        rows, preds = [], {}
        groups = [("residual", residual)] + ([("sublayer", sites[len(residual):])] if settings.sublayers else [])
        for kind in KINDS:
            for _group, group_sites in groups:
                site_index = [sites.index(s) for s in group_sites]
                r, p = runner.probe("trained", vectors, site_index, group_sites, kind)
                rows.append(r)
                preds.update({(kind, s): p[i] for i, s in enumerate(group_sites)} if kind == "distance" else {})
        d = model.config.d_model
        sweep = [runner.probe("trained", vectors, list(range(len(residual))), residual, "distance", rank=k)[0]
                 for k in settings.ranks if k < d]
        if settings.random_weights:
            from bertscope.models import random_encoder

            rnd = random_encoder(model.config, seed=ctx.seed, tokenizer=model.tokenizer)
            rnd = rnd.to(device=ctx.device, dtype=ctx.dtype).eval()
            rnd_vectors, _ = data.collect(rnd, encoded, residual, n_words)
            del rnd
            for kind in KINDS:
                rows.append(runner.probe("random_weights", rnd_vectors, list(range(len(residual))), residual, kind)[0])
        rows.append(runner.baselines())
    finally:
        torch.set_num_threads(old_threads)
    results = pd.concat(rows, ignore_index=True)[COLUMNS]
    full = results[(results["encoder"] == "trained") & (results["kind"] == "distance")
                   & results["site"].isin(residual)]  # fmt: skip  (UUAS and DSpr at full rank)
    rank_sweep = pd.concat([*sweep, full], ignore_index=True)[COLUMNS] if sweep else full[COLUMNS]
    ctx.write_table(rank_sweep, "rank_sweep")
    ctx.write_table(summary_table(results, rank_sweep), "summary")
    ctx.write_table(pd.DataFrame(runner.training), "training")
    examples, edges = _examples(results, preds, parts["test"], chosen, heads, punct, settings.n_examples)
    ctx.write_table(examples, "examples")
    ctx.write_table(edges, "example_edges")
    ctx.note("seconds_compute", round(time.perf_counter() - t0, 1))
    ctx.log(f"done in {time.perf_counter() - t0:.1f}s")
    return results


def plot(out_dir: Path) -> list[Path]:
    """Redraw every figure from the saved tables in ``out_dir`` (no model needed)."""
    from bertscope.experiments.structure.plots import plot as draw

    return draw(Path(out_dir))


# ------------------------------------------------------------------------------------------------ pieces


class _Runner:
    """Trains (or reads from the step cache) one batched probe per (encoder, kind, site group, rank) and scores
    it on the test sentences."""

    def __init__(self, ctx: Any, settings: Settings, parts: dict, heads: list, punct: list, info: dict) -> None:
        self.ctx, self.settings, self.parts = ctx, settings, parts
        self.heads, self.punct, self.info = heads, punct, info
        self.training: list[dict] = []

    def probe(self, encoder: str, vectors: dict, site_index: list[int], sites: list[str], kind: str,
              rank: int | None = None) -> tuple[pd.DataFrame, list[list[np.ndarray]]]:
        s, parts = self.settings, self.parts
        params = dict(rank=rank, lr=s.lr, batch_size=s.batch_size, max_epochs=s.max_epochs, patience=s.patience,
                      seed=self.ctx.seed, device=self.ctx.device)

        def fit() -> dict[str, np.ndarray]:
            probe = StructuralProbe(kind, **params).fit(
                data.gather(vectors, parts["train"], site_index), [self.heads[i] for i in parts["train"]],
                data.gather(vectors, parts["dev"], site_index), [self.heads[i] for i in parts["dev"]])
            return {"proj": probe.proj_.cpu().numpy(), "best_epoch": probe.best_epoch_, "dev_loss": probe.dev_loss_,
                    "n_epochs": np.array(probe.n_epochs_)}

        t0 = time.perf_counter()
        arrays = self.ctx.step_arrays("probe", fit, encoder=encoder, kind=kind, sites=sites, rank=rank)
        probe = StructuralProbe.from_projection(arrays["proj"], kind, **params)
        test = parts["test"]
        pred = probe.predict(data.gather(vectors, test, site_index))  # per sentence [n_sites, ...]
        heads, punct = [self.heads[i] for i in test], [self.punct[i] for i in test]
        rows, per_site = [], []
        for j, site in enumerate(sites):
            p = [x[j] for x in pred]
            per_site.append(p)
            layer, component = data.site_layer(site)
            for metric, stat in measures.metric_stats(p, heads, punct, kind).items():
                low, high = stat.interval(s.n_boot, [self.ctx.seed, j, len(metric)], s.ci)
                rows.append({**self.info, "encoder": encoder, "site": site, "layer": layer, "component": component,
                             "kind": kind, "metric": metric, "rank": rank or arrays["proj"].shape[-1],
                             "value": stat.point(), "ci_low": low, "ci_high": high, "n_sentences": len(test)})
            self.training.append({"encoder": encoder, "kind": kind, "site": site,
                                  "rank": rank or arrays["proj"].shape[-1],
                                  "best_epoch": int(arrays["best_epoch"][j]), "dev_loss": float(arrays["dev_loss"][j]),
                                  "n_epochs": int(arrays["n_epochs"])})
        self.ctx.log(f"{encoder} {kind} probes at {len(sites)} sites, rank {rank or 'full'}: "
                     f"{time.perf_counter() - t0:.1f}s")
        return pd.DataFrame(rows), per_site

    def baselines(self) -> pd.DataFrame:
        test = self.parts["test"]
        stats = measures.baseline_stats([self.heads[i] for i in test], [self.punct[i] for i in test])
        rows = []
        for name, stat in stats.items():
            low, high = stat.interval(self.settings.n_boot, [self.ctx.seed, 99, len(name)], self.settings.ci)
            rows.append({**self.info, "encoder": f"baseline:{name}", "site": "", "layer": -1, "component": "",
                         "kind": "distance", "metric": "uuas", "rank": 0, "value": stat.point(), "ci_low": low,
                         "ci_high": high, "n_sentences": len(test)})
        return pd.DataFrame(rows)


def _local_parts(split: data.Split, truncated: set[int]) -> dict[str, np.ndarray]:
    """Positions in ``split.all()`` of the train / dev / test sentences, truncated ones left out."""
    out, start = {}, 0
    for name in ("train", "dev", "test"):
        n = len(getattr(split, name))
        out[name] = np.array([i for i in range(start, start + n) if i not in truncated], dtype=np.int64)
        start += n
    return out


def summary_table(results: pd.DataFrame, rank_sweep: pd.DataFrame) -> pd.DataFrame:
    """Per residual site (layer): UUAS, DSpr, root accuracy, NSpr with intervals, the random-weights UUAS, the
    linear-chain and random-tree UUAS, and the smallest rank whose UUAS reaches the full-rank interval."""
    res = results[results["component"].isin(["embed", "resid_post"])]
    base = {r.encoder.split(":", 1)[1]: r.value for r in results[results["encoder"].str.startswith("baseline:")]
            .itertuples()}  # fmt: skip
    out = []
    for (site, layer), g in res.groupby(["site", "layer"], sort=False):
        row: dict[str, Any] = {"site": site, "layer": layer}
        for r in g[g["encoder"] == "trained"].itertuples():
            row[r.metric], row[f"{r.metric}_ci_low"], row[f"{r.metric}_ci_high"] = r.value, r.ci_low, r.ci_high
        for r in g[g["encoder"] == "random_weights"].itertuples():
            row[f"random_{r.metric}"] = r.value
        row["linear_chain_uuas"] = base.get("linear_chain", np.nan)
        row["random_tree_uuas"] = base.get("random_tree", np.nan)
        sw = rank_sweep[(rank_sweep["site"] == site) & (rank_sweep["metric"] == "uuas")]
        full = sw[sw["rank"] == sw["rank"].max()]
        k = measures.smallest_rank(dict(zip(sw["rank"], sw["value"], strict=True)),
                                   float(full["ci_low"].iloc[0])) if len(full) else None
        row["smallest_rank"] = k if k is not None else np.nan
        row["uuas_at_smallest_rank"] = float(sw.loc[sw["rank"] == k, "value"].iloc[0]) if k is not None else np.nan
        out.append(row)
    return pd.DataFrame(out).sort_values("layer", kind="stable").reset_index(drop=True)


def _examples(results: pd.DataFrame, preds: dict, test: np.ndarray, chosen: list, heads: list, punct: list,
              n_examples: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Words and gold / predicted MST edges (no punctuation) of a few short test sentences at the residual
    site with the highest UUAS."""
    uuas = results[(results["encoder"] == "trained") & (results["metric"] == "uuas")
                   & results["component"].isin(["embed", "resid_post"])]  # fmt: skip
    words_rows, edge_rows = [], []
    if uuas.empty or n_examples < 1:
        return pd.DataFrame(words_rows), pd.DataFrame(edge_rows)
    best = uuas.loc[uuas["value"].idxmax()]
    picks = [j for j, i in enumerate(test) if 7 <= len(heads[i]) <= 14][:n_examples]
    for e, j in enumerate(picks):
        i = int(test[j])
        keep = ~punct[i]
        for w, word in enumerate(chosen[i].words):
            words_rows.append({"example": e, "sentence_id": chosen[i].id, "word_index": w, "word": word,
                               "punct": bool(punct[i][w]), "head": int(heads[i][w])})
        for source, dist in (("gold", tree_distances(heads[i])), ("predicted", preds[("distance", best["site"])][j])):
            for a, b in sorted(mst_edges(dist, keep)):
                edge_rows.append({"example": e, "source": source, "i": a, "j": b, "site": best["site"],
                                  "layer": int(best["layer"])})
    return pd.DataFrame(words_rows), pd.DataFrame(edge_rows)
