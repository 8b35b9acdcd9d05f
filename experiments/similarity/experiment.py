"""Experiment ``similarity``: what makes two texts similar to an embedding model, checked against gold scores.

Input: pairs of texts with a gold similarity (``--corpus PAIRS``: CSV/TSV with sentence 1, sentence 2, score, with
or without a header, or JSONL ``{"a", "b", "score"}``; STS-B, MTEB and sentence-transformers spellings of the
columns are accepted); without a pairs file, the builtin set of ``data.BUILTIN`` (44 pairs the authors wrote and
scored, for a demo). The pairs are split (seeded) into ``select`` (where the best site and pooling are chosen) and
``report`` (where every number is quoted).

Tables (``docs/experiments/similarity.md``): ``benchmark`` (Spearman and Pearson with gold per split, residual site
and pooling, bootstrap intervals over pairs; also returned as ``results`` with model and corpus columns),
``heads`` (each component's share of the cosine from the exact decomposition; each head's Spearman change when
mean-ablated), ``faithfulness`` and ``aopc`` (the similarity drop when each method's top-k token pairs are
replaced by the padding token or deleted, from one text at a time or from both, against random pairs),
``methods`` (each method's conservation error and time), ``claims`` (two published claims beside controls),
``negation`` and ``concentration`` (their per-item rows), ``matrices`` (the attribution matrices of the
attributed pairs); ``pairs.html``, the explorer's pair view.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from bertscope.experiments.corpus.pairs import PairsFormat, pairs_from_rows
from bertscope.experiments.registry import CannotRun
from bertscope.experiments.settings import require
from bertscope.experiments.similarity import data, measures
from bertscope.hooks import similarity

NAME = "similarity"
DIRNAME = "similarity"
SUMMARY_TABLES = ["benchmark", "aopc", "claims"]

#: The pairs file this experiment reads (``--corpus FILE``): sentence 1, sentence 2, gold score; header spellings
#: of STS-B (GLUE/HF ``sentence1``, ``sentence2``, ``label``), MTEB (``sentence1``, ``sentence2``, ``score``) and
#: sentence-transformers (``sentence_1``/``text_a``..., ``score``/``similarity``) are accepted.
PAIRS = PairsFormat(
    "similarity pairs", ("a", "b", "score"), optional=("kind",), numeric=("score",),
    aliases={"a": ("sentence1", "sentence_1", "sentence 1", "s1", "text_a", "text1", "anchor", "query"),
             "b": ("sentence2", "sentence_2", "sentence 2", "s2", "text_b", "text2", "positive", "document"),
             "score": ("label", "gold", "gold_score", "similarity", "similarity_score", "relatedness_score")},
)
DEFAULT_METHODS = ("integrated-jacobians", "bilrp", "grad-x-input", "integrated-gradients", "occlusion",
                   "mixing:rollout:attention")
MIN_PAIRS = 8  # pairs needed: at least 4 on each side of the select/report split


@dataclass(frozen=True)
class Settings:
    """Sizes and choices of the similarity experiment (recorded in the manifest; checked when built)."""

    select_fraction: float = 0.5  # share of the pairs the best site and pooling are chosen on (never reported)
    poolings: tuple[str, ...] = ("mean", "cls", "max")  # poolings of the benchmark (the model's own among them)
    methods: tuple[str, ...] = field(default_factory=lambda: DEFAULT_METHODS)  # pairwise attribution methods
    steps: int = 50  # path steps of integrated Jacobians / integrated gradients (the library's default)
    attributed: int = 10  # pairs attributed by every method (faithfulness, concentration, heatmaps, pair view)
    ks: tuple[int, ...] = (1, 2, 5, 10)  # top-k token pairs removed (faithfulness)
    n_random: int = 10  # random removals per pair and k (the baseline)
    removals: tuple[str, ...] = ("reference", "delete")  # how a token is removed: by [PAD] and/or deleted
    sides: tuple[str, ...] = ("one", "both")  # which texts lose a removed pair's tokens: one at a time, or both
    top_fraction: float = 0.05  # "a few token pairs dominate": the share of pairs called the top
    n_boot: int = 1000  # bootstrap resamples over pairs

    def __post_init__(self) -> None:
        """Refuse settings no run could use (each message names the setting)."""
        require(self, positive=("steps", "ks", "n_random", "n_boot"), fraction=("select_fraction", "top_fraction"),
                subsets={"poolings": similarity.POOLINGS, "methods": tuple(similarity.TABLE),
                         "removals": data.REMOVALS, "sides": data.SIDES},
                non_empty=("poolings", "methods", "ks", "removals", "sides"))
        if self.attributed < 2:
            raise ValueError(f"attributed must be at least 2 (intervals over pairs), got {self.attributed}")


def check(inputs: Any, settings: Settings) -> None:
    """Before anything is written: a pairs file needs at least ``MIN_PAIRS`` pairs and gold scores that vary."""
    pairs = getattr(inputs, "pairs", None)
    if pairs is None:
        return
    if len(pairs) < MIN_PAIRS:
        raise CannotRun(f"{pairs.source} has {len(pairs)} pair(s); the similarity experiment needs at least "
                        f"{MIN_PAIRS} (a select and a report split); give more rows or raise --max-sentences")
    if pairs.frame.score.nunique() < 2:
        raise CannotRun(f"every gold score in {pairs.source} is the same; Spearman with gold needs them to vary")


def check_settings(model: Any, settings: Settings) -> None:
    """The model's own pooling must be among ``poolings`` and linear (mean or cls) for the exact decomposition."""
    own = similarity.default_pooling(model)
    if own not in settings.poolings:
        raise ValueError(f"similarity.poolings={','.join(settings.poolings)}: the model's own pooling {own!r} "
                         "must be among them")
    if own == "max":
        raise ValueError("similarity: the model's own pooling is max, which has no exact decomposition (heads table)")


def run(ctx: Any, settings: Settings | None = None) -> pd.DataFrame:
    """The benchmark per site and pooling, the heads, the methods' faithfulness, the two claims and the pair view;
    returns the benchmark with model and corpus columns."""
    settings = ctx.use_settings(settings)
    model, pairs = ctx.model, _pairs(ctx, settings)
    frame = pairs.frame.reset_index(drop=True)
    a, b, gold = list(frame.a), list(frame.b), frame.score.to_numpy(float)
    pooling = similarity.default_pooling(model)
    select = data.split(len(a), settings.select_fraction, ctx.seed)
    ctx.log(f"{int(select.sum())} pairs choose the site and pooling, {int((~select).sum())} report")
    scores = _site_scores(ctx, a, b, settings)
    own = (similarity.final_site(model), pooling)
    benchmark = measures.benchmark_table(scores, gold, select, own=own, n_boot=settings.n_boot, seed=ctx.seed)
    ctx.write_table(benchmark, "benchmark")
    ctx.write_table(_heads(ctx, a, b, gold, scores[own], pooling, settings), "heads")
    chosen = data.attributed(len(a), settings.attributed, ctx.seed)
    ctx.log(f"attributes {len(chosen)} of the {len(a)} pairs (--set similarity.attributed=N)")
    ctx.note("attributed_pairs", [int(frame.id.iloc[i]) for i in chosen])
    matrices = _attributions(ctx, frame, chosen, settings)
    mats = measures.matrices_by_method(matrices, [int(frame.id.iloc[i]) for i in chosen])
    ctx.write_table(matrices, "matrices")
    _faithfulness(ctx, [a[i] for i in chosen], [b[i] for i in chosen], mats, pooling, settings)
    _claims(ctx, a + b, gold, scores[own], mats, pooling, settings)
    from bertscope.experiments.explorer import similarity as pair_view

    pair_view.save(matrices, frame, ctx.out_dir / "pairs.html", title=f"{ctx.model_id}: token pairs ({pairs.name})")
    benchmark.insert(0, "corpus", pairs.name)
    benchmark.insert(0, "model", ctx.model_id)
    return benchmark


def _pairs(ctx: Any, settings: Settings) -> Any:
    """The run's pairs (``--corpus FILE`` read by the CLI, else the builtin set), noted in the manifest."""
    pairs = getattr(ctx.inputs, "pairs", None)
    if pairs is None:
        pairs = pairs_from_rows("builtin-pairs", data.builtin_rows(), PAIRS)
        ctx.log(f"no pairs file (--corpus PAIRS): the {len(pairs)} builtin pairs (authors' gold scores, a demo)")
    ctx.note("pairs", pairs.summary())
    ctx.note("settings", asdict(settings))
    ctx.record_used({"pairs": len(pairs)}, unit=f"pairs of {pairs.name}")
    return pairs


def _site_scores(ctx: Any, a: list[str], b: list[str], settings: Settings) -> dict[tuple[str, str], np.ndarray]:
    """Each pair's cosine at every residual site and pooling (cached)."""
    arrays = ctx.step_arrays("site_scores", lambda: {f"{s}|{p}": v for (s, p), v in data.site_scores(
        ctx.model, a, b, settings.poolings, batch_size=ctx.options.batch_size).items()})
    return {tuple(k.split("|")): v for k, v in arrays.items()}  # type: ignore[misc]


def _heads(ctx: Any, a: list[str], b: list[str], gold: np.ndarray, base: np.ndarray, pooling: str,
           settings: Settings) -> pd.DataFrame:
    """The heads table: shares of the cosine (decomposition) and the Spearman change under mean ablation."""
    ctx.log(f"decomposition and mean ablation of {ctx.model.config.n_layers * ctx.model.config.n_heads} heads")
    shares = ctx.step("shares", lambda: data.head_shares(ctx.model, a, b, pooling=pooling))
    ablated = ctx.step_arrays("ablated", lambda: {"cos": data.head_ablation_scores(
        ctx.model, a, b, pooling=pooling, batch_size=ctx.options.batch_size)})["cos"]
    return measures.heads_table(shares, ablated, base, gold, n_boot=settings.n_boot, seed=ctx.seed)


def _attributions(ctx: Any, frame: pd.DataFrame, chosen: np.ndarray, settings: Settings) -> pd.DataFrame:
    """Every method's matrices of the attributed pairs (one cached step per method), with the seconds per pair;
    the ``methods`` table (conservation error, time) is written from them."""
    a, b = [frame.a.iloc[i] for i in chosen], [frame.b.iloc[i] for i in chosen]
    ids = [int(frame.id.iloc[i]) for i in chosen]

    def compute(method: str) -> pd.DataFrame:
        start = time.perf_counter()
        out = data.attributions(ctx.model, a, b, [method], steps=settings.steps, progress=ctx.log)
        seconds = (time.perf_counter() - start) / len(a)
        return measures.matrices_table(out, ids).assign(seconds_per_pair=seconds)

    parts = [ctx.step("attributions", lambda m=m: compute(m), method=m) for m in settings.methods]
    matrices = pd.concat(parts, ignore_index=True)
    ctx.write_table(measures.methods_table(matrices, settings.steps), "methods")
    return matrices


def _faithfulness(ctx: Any, a: list[str], b: list[str], mats: dict[str, list[np.ndarray]], pooling: str,
                  settings: Settings) -> None:
    """Remove each method's top-k token pairs (and random ones) and write ``faithfulness`` and ``aopc``."""
    ids_a, ids_b = data.piece_ids(ctx.model, a), data.piece_ids(ctx.model, b)
    special_a = [data.special_positions(ctx.model, i) for i in ids_a]
    special_b = [data.special_positions(ctx.model, i) for i in ids_b]
    plans = measures.removal_plans(mats, special_a, special_b, settings.ks, settings.n_random, ctx.seed)
    cosines = {how: data.removal_cosines(ctx.model, ids_a, ids_b, plans, pooling=pooling, removal=how,
                                         sides=settings.sides, batch_size=ctx.options.batch_size)
               for how in settings.removals}
    after = {(how, sides): cosines[how][sides] for sides in settings.sides for how in settings.removals}
    before = data.removal_scores(ctx.model, ids_a, ids_b, measures.intact_plans(len(a)), pooling=pooling)
    faith, aopc = measures.faithfulness_tables(plans, after, before, n_boot=settings.n_boot, seed=ctx.seed)
    ctx.write_table(faith, "faithfulness")
    ctx.write_table(aopc, "aopc")


def _claims(ctx: Any, texts: list[str], gold: np.ndarray, own: np.ndarray, mats: dict[str, list[np.ndarray]],
            pooling: str, settings: Settings) -> None:
    """The two claims beside their controls: ``negation``, ``concentration`` and ``claims``."""
    edits = data.negation_edits(texts)
    skipped = int((edits.skipped != "").sum())
    ctx.log(f"negation rule: {len(edits) - skipped} of {len(edits)} distinct texts negated, {skipped} skipped")
    negation = data.edit_cosines(ctx.model, edits, pooling=pooling, batch_size=ctx.options.batch_size)
    concentration = measures.concentration_table(mats, settings.top_fraction)
    claims = measures.claims_table(negation, skipped, own[gold >= 4], concentration, settings.methods[0],
                                   settings.top_fraction, n_boot=settings.n_boot, seed=ctx.seed)
    ctx.write_table(negation, "negation")
    ctx.write_table(concentration, "concentration")
    ctx.write_table(claims, "claims")
