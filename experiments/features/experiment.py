"""What do a dictionary's latents encode? One sparse dictionary per site, its latents labelled against known
variables, with neurons, PCA directions and the re-initialised model's dictionary as controls.

Sites (default): ``hook_resid_post`` at a low, a middle and the last block (TopK SAEs) and one MLP transcoder
(BatchTopK, ``hook_resid_mid`` -> ``hook_mlp_out``) at the middle block; trained with `probes.dictionary`'s
streaming trainer on the train sentences of the run's corpus (``tokens`` rows), or loaded from
``dictionaries`` (a folder of ``<site>/`` dictionaries as ``bertscope sae train`` writes them).

Known variables (`labels`): absolute position and distance to [SEP] (family ``position``), "repeats an earlier
token of the sentence" and "is the earlier copy" (``duplicate``), UPOS, dependency relation and tree depth from
the corpus's gold annotation (``syntax``), [CLS], [SEP] and punctuation (``special``), as binary concepts.

Splits: the corpus's sentences are split by sentence (seeded) into train (dictionaries, PCA, k-sparse probes),
dev (every selection: each unit's label and firing rule, each concept's best neuron / PCA direction) and test
(every reported number). Labelling (`measures`): a unit's label is the (concept, rule) with the best MCC on dev;
its score is that rule's MCC on test, with a group bootstrap over test sentences. A latent is a "position" /
"duplicate" / "syntax" / "special" feature when its label is in that family and its test MCC >= ``threshold``
(fixed, stated in the tables). Controls: the same procedure on the site's neurons, on its PCA directions, on the
re-initialised model's dictionary at the same site, and on the trained latents with the concept rows shuffled
(chance). k-sparse probing (SAEBench's protocol, `measures.sparse_probe`): per concept, the top-k units by mean
difference on balanced train rows, a logistic probe on them, balanced test accuracy; k = 1, 2, 5; from latents,
neurons, PCA directions and re-initialised latents.

Outputs in ``OUT/features/``: ``results`` (one row per unit: latents, neurons and PCA directions of both models,
their label, dev and test MCC with interval, whether labelled), ``summary`` (per site and model: alive latents,
labelled latents per family, the shuffled-label count, the share of labelled latents beating the best neuron and
PCA direction for their own label), ``sparse_probing`` (per site, source, concept and k; ``concept = mean`` rows
average a variable's concepts with a joint interval), ``baselines`` (per concept the best single unit of every
basis), the feature browser's tables (``browser_latents``, ``browser_contexts``, ``browser_tokens``) and
``feature_browser.html``, figures, and ``dictionaries/<site>/`` (the trained model's dictionaries in SAELens's
format, for ``bertscope explore --dictionary`` and ``--dictionaries``; not written when they were loaded).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import pandas as pd
from bertscope.experiments.features import data, labels, steps
from bertscope.experiments.registry import CannotRun
from bertscope.probes.dictionary.settings import RECIPE

NAME = "features"
DIRNAME = "features"
SUMMARY_TABLES = ["summary", "sparse_probing_summary"]
DICTIONARIES = "dictionaries"  # OUT/features/dictionaries/<site>/: the trained model's dictionaries (SAELens format)
INT_COLUMNS = {"layer", "unit", "latent", "k", "rank", "sentence", "position", "rule_sign", "d_sae", "tokens_trained"}


@dataclass(frozen=True)
class Settings:
    """Sizes of the features run (defaults: about 150 CPU-seconds with the bundled model; ``tokens`` scales the
    dictionary training up, ``dictionaries`` loads trained ones)."""

    n_train: int = 300  # sentences training the dictionaries, PCA and the k-sparse probes
    n_dev: int = 100  # sentences choosing every label, rule and best baseline unit
    n_test: int = 100  # sentences every reported number comes from
    layers: tuple[int, ...] = ()  # blocks with an SAE at hook_resid_post (default: first, middle, last)
    transcoder_layer: int | None = None  # block of the MLP transcoder (default: the middle one; -1: none)
    width: str = RECIPE.width  # latents: a multiple of the site's width or a number (the one recipe's)
    k: int = RECIPE.k  # active latents per token (TopK; BatchTopK on average)
    tokens: int = 12_000  # training rows per dictionary (--tokens N, = --set features.tokens=N, scales it up)
    batch_size: int = RECIPE.batch_size  # the one recipe's (bertscope.probes.dictionary.RECIPE)
    buffer_rows: int = 16384
    lr: float = RECIPE.lr
    dictionaries: str = ""  # --dictionaries DIR: trained dictionaries (DIR/<site>/cfg.json ...) to load, not train
    reinit: bool = True  # the re-initialised model's dictionaries (control)
    threshold: float = 0.5  # test MCC at or above which a unit's label counts
    ks: tuple[int, ...] = (1, 2, 5)
    probe_variables: tuple[str, ...] = ("position", "upos", "repeats_earlier")
    min_positives: int = 8  # a concept needs this many positive (and negative) rows in every split
    max_per_class: int = 2000  # balanced k-sparse probing samples at most this many rows per class
    n_top: int = 8  # top-activating contexts per latent in the browser
    n_promoted: int = 8  # vocabulary items per latent (models with a masked-LM head)
    n_boot: int = 200
    ci: float = 0.95

    def __post_init__(self) -> None:
        if min(self.n_train, self.n_dev, self.n_test) < 2:
            raise ValueError("n_train, n_dev and n_test must be >= 2")
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.tokens < 1 or self.k < 1:
            raise ValueError("tokens and k must be positive")
        from bertscope.experiments.settings import require

        variables = [v for family in labels.FAMILIES.values() for v in family]
        require(self, positive=("batch_size", "buffer_rows", "lr", "ks", "min_positives", "max_per_class", "n_top",
                                "n_boot"), non_negative=("layers", "n_promoted"), fraction=("ci",),
                subsets={"probe_variables": variables})
        width_latents(self.width, 1)  # "abc", "0x", "-3": refused here, before the model is loaded
        if self.transcoder_layer is not None and self.transcoder_layer < -1:
            raise ValueError(f"transcoder_layer must be a block number, -1 (none) or none, got {self.transcoder_layer}")


def width_latents(width: str, d_in: int) -> int:
    """The number of latents ``width`` gives at a site ``d_in`` wide (``2x``: twice ``d_in``; ``3072``: 3072);
    ``ValueError`` unless it is a positive multiple or a positive number."""
    from bertscope.experiments.dictionary import parse_width

    try:
        text = str(width).strip().lower()
        positive = float(text[:-1] if text.endswith("x") else text) > 0
        n = parse_width(width, d_in)
    except ValueError:
        positive, n = False, 0
    if not positive:
        raise ValueError(f"width must be a positive multiple of the site's width such as 2x, or a number of latents; "
                         f"got {width!r}")
    return max(n, 1)


def check(inputs: Any, settings: Settings) -> None:
    """The corpus needs enough sentences for three splits; ``--dictionaries DIR`` needs a dictionary of every site
    made for this model (`data.load_site_dictionaries`)."""
    n = len(inputs.corpus)
    if n < 12:
        raise CannotRun(f"features needs at least 12 sentences for its train/dev/test splits, the corpus has {n}; "
                        "use --corpus builtin or raise --max-sentences")
    if settings.dictionaries:  # every site's dictionary, fitting this model, before anything is written
        sites = data.default_sites(inputs.model.config.n_layers, settings.layers or None, settings.transcoder_layer)
        try:
            data.load_site_dictionaries(inputs.model, settings.dictionaries, sites)
        except ValueError as e:
            raise CannotRun(str(e)) from None


def check_settings(model: Any, settings: Settings) -> None:
    """The settings that depend on the model (its blocks and width): ``ValueError`` naming the setting, which the
    CLI refuses like any other bad ``--set`` (one line, exit 2) before anything is written."""
    n_layers, d_model = model.config.n_layers, model.config.d_model
    bad_layers = [la for la in settings.layers if not 0 <= la < n_layers]
    if bad_layers:
        raise ValueError(f"features.layers={','.join(map(str, settings.layers))}: block {bad_layers[0]} is "
                         f"outside 0..{n_layers - 1} (this model has {n_layers} blocks)")
    t = settings.transcoder_layer
    if t is not None and t >= n_layers:
        raise ValueError(f"features.transcoder_layer={t}: block {t} is outside 0..{n_layers - 1} (this model "
                         f"has {n_layers} blocks; -1: no transcoder)")
    latents = width_latents(settings.width, d_model)
    if not settings.dictionaries and settings.k >= latents:
        raise ValueError(f"features.k={settings.k}: TopK needs k below the dictionary's {latents} latents "
                         f"(width {settings.width} at d_model {d_model}); lower k or raise --set features.width")


def run(ctx: Any, settings: Settings | None = None) -> pd.DataFrame:
    """Run the experiment into ``ctx.out_dir``; returns the main long table (one row per labelled unit)."""
    settings = ctx.use_settings(settings)
    t0 = time.perf_counter()
    ctx.note("settings", dataclasses.asdict(settings))
    split = _choose_sentences(ctx, settings)
    ctx.note("sentences", {k: len(v) for k, v in split.items()})
    ctx.record_used({k: len(v) for k, v in split.items()}, available=len(ctx.corpus),
                    more="--set features.n_train=N (and features.n_dev, features.n_test)")
    ctx.log(f"train {len(split['train'])}, dev {len(split['dev'])}, test {len(split['test'])} sentences")
    sites = data.default_sites(ctx.model.config.n_layers, settings.layers or None, settings.transcoder_layer)
    info = {"model": ctx.model_id, "corpus": ctx.corpus_id, "syntax": labels.has_syntax(
        [s for v in split.values() for s in v])}
    key = {"sentences": [[s.id for s in v] for v in split.values()], "sites": [s.name for s in sites],
           "max_length": ctx.options.max_length}
    run_values = ctx.run_values(save_dictionaries=ctx.out_dir / DICTIONARIES)
    tables = ctx.step("features", lambda: steps.compute(run_values, settings, split, sites, info), **key)
    out = {name: _integers(g.drop(columns="table").dropna(axis=1, how="all").reset_index(drop=True))
           for name, g in tables.groupby("table", sort=False)}
    for name, table in out.items():
        if name != "results":
            ctx.write_table(table, name)
    ctx.note("seconds_compute", round(time.perf_counter() - t0, 1))
    ctx.log(f"done in {time.perf_counter() - t0:.1f}s")
    return out["results"]


def _integers(table: pd.DataFrame) -> pd.DataFrame:
    """Count and index columns back to int64 (the cached long frame holds them as floats beside NaN)."""
    cols = [c for c in table if c in INT_COLUMNS or c.startswith("n_")]
    return table.astype({c: "int64" for c in cols if table[c].notna().all()})


def _choose_sentences(ctx: Any, settings: Settings) -> dict[str, list]:
    """A seeded split of the run's corpus by sentence: test, dev, then train from the rest (``--max-sentences``
    has already capped the corpus)."""
    pool = [s for s in ctx.corpus if len(s) >= 2]
    order = ctx.rng("split").permutation(len(pool))
    n_test = min(settings.n_test, len(pool) // 4)
    n_dev = min(settings.n_dev, len(pool) // 4)
    if min(n_test, n_dev) < 2 or len(pool) - n_test - n_dev < 2:
        raise CannotRun(f"features needs at least 12 sentences of 2+ words for its splits, found {len(pool)}; use "
                        "--corpus builtin or raise --max-sentences")
    test = [pool[i] for i in order[:n_test]]
    dev = [pool[i] for i in order[n_test:n_test + n_dev]]
    train = [pool[i] for i in order[n_test + n_dev:n_test + n_dev + settings.n_train]]
    return {"train": train, "dev": dev, "test": test}
