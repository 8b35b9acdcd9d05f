"""Is the parse tree in each layer's geometry? Structural probes (Hewitt & Manning 2019) with controls.

For every site (the embedding output, each block's output, and inside each block ``resid_mid``, plus ``attn_out``
and ``mlp_out`` with ``Settings(sublayers=True)``) a distance probe (UUAS, DSpr) and a depth probe (root accuracy,
NSpr) are trained on word vectors (mean of each word's pieces) of ``n_train`` sentences, early-stopped on ``n_dev``
others and scored on ``n_test`` held-out sentences (a seeded split by sentence, stated in every row). Conventions:
`bertscope.probes.structural` (the authors' loss, regimen and reporter). Training: three batched passes (`steps`),
every site, kind and rank of a pass at once, each probe trained to early stopping.

Controls: the embedding layer (non-contextual: layer 0); the same architecture with random weights
(``models.random_encoder``) at the residual sites; trees that use no representation (the linear chain, each
word attached to the next, and the expected UUAS of a random spanning tree); and a rank sweep (k = 1, 2, 4, ...
below d, plus full rank) of the distance probe at the trained model's residual sites, so a UUAS is also reported
at the smallest rank that reaches the full-rank interval (chosen on the dev sentences). Intervals: group
bootstrap over test sentences; every probe is also scored on the dev sentences, where the run selects.

Outputs in ``OUT/structure/``: ``results.parquet|csv`` (long table of the full-rank probes and the baselines,
columns `COLUMNS`), ``summary`` (per layer: the four metrics with intervals, the random-weights UUAS, the
baselines, the smallest rank), ``rank_sweep`` (distance probes of every rank at the trained model's residual sites),
``examples`` and ``example_edges`` (gold and predicted trees of a few test sentences at the layer with the
highest dev-split UUAS), ``training`` (per probe: best epoch, epochs trained, whether it stopped early, best
dev loss),
and the figures of `plot`. Word vectors and each pass are cached steps: an interrupted run resumes.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from bertscope.experiments.activations import open_capture
from bertscope.experiments.options import sentences_used
from bertscope.experiments.structure import data, measures, steps
from bertscope.experiments.structure.plots import plot  # noqa: F401 (old name `experiment.plot`; it lives in plots)
from bertscope.probes.structural import mst_edges, tree_distances
from bertscope.probes.structural_fit import ProbeSpec

NAME = "structure"
DIRNAME = "structure"
SUMMARY_TABLES = ["summary"]
MIN_SENTENCES = 6  # two each to train, stop early and score (`data.split_sentences`)
COLUMNS = ["model", "corpus", "encoder", "site", "layer", "component", "kind", "metric", "rank", "value", "ci_low",
           "ci_high", "split", "n_sentences", "n_train", "n_dev", "n_test", "dev_value", "dev_ci_low", "dev_ci_high",
           "test_corpus"]


@dataclass(frozen=True)
class Settings:
    """Sizes of the structure run. The regimen is the paper's (Adam 1e-3 with the learning rate cut tenfold on
    each epoch without dev improvement, batches of 20, patience 4), trained to early stopping (``max_epochs`` is
    a cap set high enough that probes stop before it; the ``training`` table says where each stopped)."""

    n_train: int = 400  # training sentences
    n_dev: int = 100  # early-stopping sentences
    n_test: int = 200  # scored sentences
    max_epochs: int = 100  # a cap only (the paper's configs: 40); probes stop early on the dev loss
    patience: int = 4  # stop when the best dev epoch is more than this many epochs old (regimen.py)
    batch_size: int = 20  # sentences per step (the paper's config)
    lr: float = 1e-3  # Adam (regimen.py)
    # also probe these sites inside every block (as positions does): True = attn_out, resid_mid and mlp_out,
    # False = none, or a tuple of some of those names
    sublayers: bool | tuple[str, ...] = ("resid_mid",)
    random_weights: bool = True  # the random-weights control at the residual sites
    ranks: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)  # rank sweep, plus full rank (ranks >= d are skipped)
    n_boot: int = 1000  # group-bootstrap resamples (sentences)
    ci: float = 0.95  # level of every percentile interval
    n_examples: int = 3  # test sentences drawn as gold vs predicted trees
    threads: int | None = None  # torch threads while training (None: leave as is)
    # processes that train the passes side by side (forked, one torch thread each; 1: one pass after another in
    # this process on ``threads``); equal to 1 up to the rounding of one- vs several-thread matrix products
    workers: int = 2

    def __post_init__(self) -> None:
        from bertscope.experiments.settings import require

        require(self, positive=("lr", "n_boot", "threads"), non_negative=("n_examples",), fraction=("ci",))
        for name in ("n_train", "n_dev", "n_test"):
            if getattr(self, name) < 2:
                raise ValueError(f"{name} must be >= 2, got {getattr(self, name)}")
        if self.max_epochs < 1 or self.batch_size < 1 or self.patience < 0 or self.workers < 1:
            raise ValueError("max_epochs, batch_size and workers must be >= 1, patience >= 0")
        if any(k < 1 for k in self.ranks):
            raise ValueError(f"ranks must be positive, got {self.ranks}")
        if not isinstance(self.sublayers, bool):
            unknown = set(self.sublayers) - set(data.BLOCK_COMPONENTS[:3])
            if unknown:
                raise ValueError(f"sublayers must be True, False or names among {data.BLOCK_COMPONENTS[:3]}, got "
                                 f"{sorted(unknown)}")


def check(inputs: Any, settings: Settings) -> None:
    """Refuse (`registry.CannotRun`) a corpus without gold dependency trees or with fewer than 6 sentences (2 to
    train, 2 to stop early, 2 to score), before anything is written."""
    from bertscope.experiments.registry import CannotRun

    eval_corpus = getattr(inputs, "eval_corpus", None)
    if eval_corpus is not None and (not eval_corpus.has_syntax or len(eval_corpus) < 2):
        raise CannotRun(f"--eval-corpus {eval_corpus.name!r} needs gold dependency trees and at least 2 sentences")
    corpus = inputs.corpus
    if not corpus.has_syntax:
        raise CannotRun(f"needs gold dependency trees, and corpus {corpus.name!r} has none; use --corpus builtin "
                        "or a .conllu file")
    if len(corpus) < MIN_SENTENCES:
        raise CannotRun(f"needs at least {MIN_SENTENCES} sentences with trees (train, dev and test), and corpus "
                        f"{corpus.name!r} has {len(corpus)}; use a larger --corpus or --max-sentences")


def run(ctx: Any, settings: Settings | None = None) -> pd.DataFrame:
    """Run the experiment into ``ctx.out_dir``; returns the main long table. Word vectors and each training
    pass are cached steps, so an interrupted run resumes with what it finished. The plan: the sentence split,
    word vectors per site (``data``), the training passes and their scores (``steps``), the tables."""
    settings = ctx.use_settings(settings)
    t0 = time.perf_counter()
    check(ctx.inputs, settings)
    ctx.note("settings", dataclasses.asdict(settings))
    split, chosen, test_corpus = _choose_sentences(ctx, settings)
    site_names = {"trained": data.trained_sites(ctx.model.config.n_layers, settings.sublayers)}
    if settings.random_weights:
        site_names["random_weights"] = data.residual_sites(ctx.model.config.n_layers)
    old_threads = torch.get_num_threads()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    try:
        vectors, parts = _vectors(ctx, split, chosen, site_names, t0)
        heads, punct = [list(s.heads) for s in chosen], data.punct_masks(chosen)
        info = {"model": ctx.model_id, "corpus": ctx.corpus_id, "split": "test", "test_corpus": test_corpus,
                "n_train": len(parts["train"]), "n_dev": len(parts["dev"]), "n_test": len(parts["test"])}
        rows, dev_rows, training, full = _train_and_score(ctx, settings, vectors, site_names, parts, heads, punct,
                                                          info)  # fmt: skip
    finally:
        torch.set_num_threads(old_threads)
    ctx.note("test_corpus", test_corpus)
    results = _write(ctx, settings, with_dev(pd.concat(rows, ignore_index=True),
                                             pd.concat(dev_rows, ignore_index=True)),
                     pd.concat(training, ignore_index=True))  # fmt: skip
    examples, edges = _examples(results, full, parts["test"], chosen, heads, punct, settings.n_examples)
    ctx.write_table(examples, "examples")
    ctx.write_table(edges, "example_edges")
    ctx.note("seconds_compute", round(time.perf_counter() - t0, 1))
    ctx.log(f"done in {time.perf_counter() - t0:.1f}s")
    return results


def _choose_sentences(ctx: Any, settings: Settings) -> tuple[data.Split, list, str]:
    """The train / dev / test split (test from ``--eval-corpus`` when given), the chosen sentences in that order
    and the test corpus's name (part of ``run``: it logs)."""
    eval_corpus = getattr(ctx.inputs, "eval_corpus", None)
    split = data.split_sentences(len(ctx.corpus), settings.n_train, settings.n_dev, settings.n_test,
                                 ctx.rng("split"), n_eval_available=None if eval_corpus is None else len(eval_corpus))
    test_source = ctx.corpus if eval_corpus is None else eval_corpus
    test_corpus = ctx.corpus_id if eval_corpus is None else str(eval_corpus.name)
    chosen = [ctx.corpus[int(i)] for i in np.concatenate([split.train, split.dev])]
    chosen += [test_source[int(i)] for i in split.test]  # test: indices into the evaluation corpus, if any
    _, why = sentences_used(ctx.options.max_sentences, None, len(ctx.corpus))
    ctx.log(f"{len(chosen)} sentences (train {len(split.train)}, dev {len(split.dev)} of {ctx.corpus_id}; test "
            f"{len(split.test)} of {test_corpus}) drawn from {len(ctx.corpus)} of {ctx.corpus_id} ({why})")
    return split, chosen, test_corpus


def _vectors(ctx: Any, split: data.Split, chosen: list, site_names: dict[str, list[str]],
             t0: float) -> tuple[dict, dict]:
    """Word vectors per encoder (cached steps) and the split's local indices without the truncated sentences,
    noted and recorded as what the run used."""
    eval_corpus = getattr(ctx.inputs, "eval_corpus", None)
    n_fit = len(split.train) + len(split.dev)  # training-corpus sentences, encoded apart from the test ones
    vectors, truncated = _features(ctx, chosen, site_names, n_fit if eval_corpus is not None else None)
    parts = _local_parts(split, set(truncated))
    ctx.note("n_left_out_truncated", len(truncated))
    ctx.note("split", {k: len(v) for k, v in parts.items()})
    ctx.record_used({k: len(v) for k, v in parts.items()}, available=len(ctx.corpus) + (
        0 if eval_corpus is None else len(eval_corpus)), more="--set structure.n_train=N (and structure.n_dev, "
                    "structure.n_test)")  # fmt: skip
    ctx.log(f"{len(chosen)} sentences: {', '.join(f'{k} {len(v)}' for k, v in parts.items())}; word vectors "
            f"at {sum(map(len, site_names.values()))} sites ({time.perf_counter() - t0:.1f}s)")
    return vectors, parts


def _train_and_score(ctx: Any, settings: Settings, vectors: dict, site_names: dict[str, list[str]], parts: dict,
                     heads: list, punct: list, info: dict) -> tuple[list, list, list, dict]:
    """The training passes (jobs, each a cached step) scored on the test and dev splits, and the baselines:
    ``(test rows, dev rows, training records, full-rank predictions)``."""
    scored = {name: (parts[name], measures.resample_weights(len(parts[name]), settings.n_boot, [ctx.seed, seed]))
              for name, seed in (("test", 18), ("dev", 19))}  # the dev split chooses, the test split reports
    rows, dev_rows, training, full = [], [], [], {}
    pass_list = _passes(settings, site_names, ctx.model.config.d_model)
    t1 = time.perf_counter()
    # one thread per pass wherever it trains (identical results); one worker: this process on `threads`
    jobs = ctx.jobs(workers=settings.workers, threads=1 if settings.workers > 1 else settings.threads)
    trained = steps.train(jobs, settings, pass_list, vectors, site_names, parts, heads, seed=ctx.seed,
                          device=ctx.device)  # fmt: skip
    ctx.log(f"{len(pass_list)} training passes ({time.perf_counter() - t1:.1f}s)")
    for p, arrays in zip(pass_list, trained, strict=True):
        t1 = time.perf_counter()
        by_split = steps.score_splits(p, arrays, vectors, site_names, scored, heads, punct, settings.ci, info,
                                      ctx.device)  # fmt: skip
        r, tr, f = by_split["test"]
        rows.append(r)
        training.append(tr)
        full.update(f)
        dev_rows.append(by_split["dev"][0])
        tr = by_split["dev"][1]
        ctx.log(f"{p.name} pass: {len(p.specs)} probes at {len(p.sites)} sites, "
                f"{int(tr['stopped_epoch'].max())} epochs at most (scored in {time.perf_counter() - t1:.1f}s)")
    test = parts["test"]
    rows.append(_baseline_rows([heads[i] for i in test], [punct[i] for i in test], scored["test"][1],
                               settings.ci, info))
    return rows, dev_rows, training, full


# ------------------------------------------------------------------------------------------------ pieces


def _features(ctx: Any, chosen: list, site_names: dict[str, list[str]],
              n_fit: int | None = None) -> tuple[dict, list[int]]:
    """Word vectors of the chosen sentences per encoder (``trained``, ``random_weights``), each a cached step.
    ``n_fit`` (with --eval-corpus): the first ``n_fit`` sentences (train and dev, of --corpus) are batched apart
    from the rest (the evaluation corpus's), so not even their padding depends on the evaluation sentences; a
    capture (--activations) holds --corpus only, so the evaluation sentences are run through the model."""
    model = ctx.model.eval()
    groups = [chosen] if n_fit is None else [chosen[:n_fit], chosen[n_fit:]]
    encoded = [ctx.encode(g, sort_by_length=True) for g in groups]
    vectors, truncated = {}, []
    source = open_capture(ctx.options.activations, model)  # --activations: the trained model's from a capture
    for encoder, sites in site_names.items():
        def collect(encoder: str = encoder, sites: list = sites) -> dict[str, np.ndarray]:
            net = model
            if encoder == "random_weights":
                from bertscope.models import random_encoder

                net = random_encoder(model.config, seed=ctx.seed, tokenizer=model.tokenizer)
                net = net.to(device=ctx.device, dtype=ctx.dtype).eval()
            parts, start = [], 0
            for g, (sentences, enc) in enumerate(zip(groups, encoded, strict=True)):
                wv, cut = data.collect(net, enc, sites, [len(s) for s in sentences], corpus=sentences,
                                       capture=source if encoder == "trained" and g == 0 else None,
                                       progress=lambda it, g=g: ctx.progress(it, f"word vectors ({encoder}, part "
                                                                             f"{g + 1} of {len(groups)})",
                                                                             total=len(it)))
                parts.append((wv, [start + i for i in cut]))
                start += len(sentences)
            return {"words": np.concatenate([wv.words for wv, _ in parts], axis=1),
                    "lengths": np.concatenate([wv.lengths for wv, _ in parts]),
                    "truncated": np.asarray([i for _, cut in parts for i in cut], dtype=np.int64)}

        arrays = ctx.step_arrays("vectors", collect, encoder=encoder, sites=sites, n_fit=n_fit)
        vectors[encoder] = data.WordVectors(arrays["words"], arrays["lengths"])
        truncated = arrays["truncated"].tolist()
    return vectors, truncated


def activation_sites(model: Any) -> list[str]:
    """The sites the trained model's word vectors come from (what ``--activations`` must hold; the random-weights
    control is another model, so its forward always runs)."""
    return data.trained_sites(model.config.n_layers, Settings().sublayers)


def _passes(settings: Settings, site_names: dict[str, list[str]], d: int) -> list[steps.Pass]:
    """The residual pass (the trained model's residual sites: full-rank probes and the rank sweep), the
    random-weights pass (its residual sites: full-rank probes) and the sublayer pass (the trained model's
    sublayer sites: full-rank probes)."""
    full = (ProbeSpec("distance"), ProbeSpec("depth"))
    sweep = tuple(ProbeSpec("distance", k) for k in settings.ranks if k < d)
    residual = [s for s in site_names["trained"] if data.site_layer(s)[1] in ("embed", "resid_post")]
    out = [steps.Pass("residual", tuple(("trained", s) for s in residual), full + sweep)]
    if site_names.get("random_weights"):
        out.append(steps.Pass("random_weights", tuple(("random_weights", s) for s in site_names["random_weights"]),
                               full))
    sub = [("trained", s) for s in site_names["trained"] if s not in residual]
    if sub:
        out.append(steps.Pass("sublayer", tuple(sub), full))
    return out


def _baseline_rows(heads: list, punct: list, weights: np.ndarray, ci: float, info: dict) -> pd.DataFrame:
    rows = []
    for name, sc in measures.baselines(heads, punct, weights, ci).items():
        rows.append({**info, "encoder": f"baseline:{name}", "site": "", "layer": -1, "component": "",
                     "kind": "distance", "metric": "uuas", "rank": 0, "value": float(sc.value),
                     "ci_low": float(sc.ci_low), "ci_high": float(sc.ci_high), "n_sentences": len(heads)})
    return pd.DataFrame(rows)


def _write(ctx: Any, settings: Settings, rows: pd.DataFrame, training: pd.DataFrame) -> pd.DataFrame:
    """``rank_sweep``, ``summary`` and ``training``; the manifest notes how the probes stopped. Returns
    ``results`` (full-rank probes and baselines), which the framework writes."""
    d = ctx.model.config.d_model
    results = rows[(rows["rank"] == d) | rows["encoder"].str.startswith("baseline:")][COLUMNS]
    results = results.reset_index(drop=True)
    sweep = rows[(rows["kind"] == "distance") & rows["component"].isin(["embed", "resid_post"])
                 & (rows["encoder"] == "trained")][COLUMNS]  # fmt: skip
    ctx.write_table(sweep.reset_index(drop=True), "rank_sweep")
    ctx.write_table(summary_table(results, sweep), "summary")
    training["max_epochs"] = settings.max_epochs
    ctx.write_table(training, "training")
    ctx.note("training", {"probes": len(training), "early_stopped": int(training["early_stopped"].sum()),
                          "stopped_epoch_min": int(training["stopped_epoch"].min()),
                          "stopped_epoch_max": int(training["stopped_epoch"].max()),
                          "max_epochs": settings.max_epochs})
    return results


def _local_parts(split: data.Split, truncated: set[int]) -> dict[str, np.ndarray]:
    """Positions in ``split.all()`` of the train / dev / test sentences, truncated ones left out."""
    out, start = {}, 0
    for name in ("train", "dev", "test"):
        n = len(getattr(split, name))
        out[name] = np.array([i for i in range(start, start + n) if i not in truncated], dtype=np.int64)
        start += n
    return out


def with_dev(test_rows: pd.DataFrame, dev_rows: pd.DataFrame) -> pd.DataFrame:
    """The test rows with the same probe's dev-split score beside them (``dev_value``, ``dev_ci_low``,
    ``dev_ci_high``; NaN for the baselines): what the run selects (best layer, smallest rank) is chosen on these."""
    keys = ["encoder", "site", "kind", "metric", "rank"]
    dev = dev_rows[keys + ["value", "ci_low", "ci_high"]].rename(
        columns={"value": "dev_value", "ci_low": "dev_ci_low", "ci_high": "dev_ci_high"})
    return test_rows.merge(dev, on=keys, how="left", validate="one_to_one")


def summary_table(results: pd.DataFrame, rank_sweep: pd.DataFrame) -> pd.DataFrame:
    """Per residual site (layer): UUAS, DSpr, root accuracy, NSpr on the test split with intervals, the same on
    the dev split (``dev_*``, the values any selection uses), the random-weights model's, the linear-chain and
    random-tree UUAS, and the smallest rank whose *dev* UUAS reaches the full-rank probe's dev interval, with
    that rank's *test* UUAS. ``best_on_dev``: the metrics for which this layer scores highest on the dev split."""
    res = results[results["component"].isin(["embed", "resid_post"])]
    rank_sweep = rank_sweep[rank_sweep["encoder"] == "trained"]
    base = {r.encoder.split(":", 1)[1]: r.value for r in results[results["encoder"].str.startswith("baseline:")]
            .itertuples()}  # fmt: skip
    out = []
    for (site, layer), g in res.groupby(["site", "layer"], sort=False):
        row: dict[str, Any] = {"site": site, "layer": layer}
        for r in g[g["encoder"] == "trained"].itertuples():
            row[r.metric], row[f"{r.metric}_ci_low"], row[f"{r.metric}_ci_high"] = r.value, r.ci_low, r.ci_high
            row[f"dev_{r.metric}"] = r.dev_value
        for r in g[g["encoder"] == "random_weights"].itertuples():
            row[f"random_{r.metric}"] = r.value
        row["linear_chain_uuas"] = base.get("linear_chain", np.nan)
        row["random_tree_uuas"] = base.get("random_tree", np.nan)
        sw = rank_sweep[(rank_sweep["site"] == site) & (rank_sweep["metric"] == "uuas")]
        full = sw[sw["rank"] == sw["rank"].max()]
        k = measures.smallest_rank(dict(zip(sw["rank"], sw["dev_value"], strict=True)),
                                   float(full["dev_ci_low"].iloc[0])) if len(full) else None
        row["smallest_rank"] = k if k is not None else np.nan
        row["uuas_at_smallest_rank"] = float(sw.loc[sw["rank"] == k, "value"].iloc[0]) if k is not None else np.nan
        out.append(row)
    table = pd.DataFrame(out).sort_values("layer", kind="stable").reset_index(drop=True)
    best = {m: table[f"dev_{m}"].idxmax() for m in ("uuas", "dspr", "root_acc", "nspr")
            if f"dev_{m}" in table and table[f"dev_{m}"].notna().any()}
    table["best_on_dev"] = [",".join(m for m, i in best.items() if i == j) for j in table.index]
    where = {c: f" (of {results[c].iloc[0]})" if c in results and len(results) else ""
             for c in ("corpus", "test_corpus")}
    table["selection"] = (f"best layer and smallest rank chosen on the dev sentences{where['corpus']}; values on the "
                          f"test sentences{where['test_corpus']}")
    return table


def _examples(results: pd.DataFrame, full: dict, test: np.ndarray, chosen: list, heads: list, punct: list,
              n_examples: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Words and gold / predicted MST edges (no punctuation) of a few short test sentences at the residual
    site with the highest dev-split UUAS."""
    uuas = results[(results["encoder"] == "trained") & (results["metric"] == "uuas")
                   & results["component"].isin(["embed", "resid_post"])]  # fmt: skip
    words_rows, edge_rows = [], []
    if uuas.empty or n_examples < 1:
        return pd.DataFrame(words_rows), pd.DataFrame(edge_rows)
    best = uuas.loc[uuas["dev_value"].idxmax()]
    picks = [j for j, i in enumerate(test) if 7 <= len(heads[i]) <= 14][:n_examples]
    for e, j in enumerate(picks):
        i = int(test[j])
        keep = ~punct[i]
        for w, word in enumerate(chosen[i].words):
            words_rows.append({"example": e, "sentence_id": chosen[i].id, "word_index": w, "word": word,
                               "punct": bool(punct[i][w]), "head": int(heads[i][w])})
        for source, dist in (("gold", tree_distances(heads[i])), ("predicted", full[("trained", best["site"])][j])):
            for a, b in sorted(mst_edges(dist, keep)):
                edge_rows.append({"example": e, "source": source, "i": a, "j": b, "site": best["site"],
                                  "layer": int(best["layer"])})
    return pd.DataFrame(words_rows), pd.DataFrame(edge_rows)
