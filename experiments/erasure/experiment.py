"""Amnesic probing: erase a concept at one layer during the forward pass and measure what breaks downstream.

For each concept (word position, UPOS, dependency relation, tree depth) and each erasure layer L, an eraser is
fitted on the training sentences' word vectors (mean of each word's pieces) at layer L's residual stream
(`data.site`: ``blocks.{L-1}.hook_resid_post``): LEACE (`probes.erasure.LeaceFitter`), INLP
(`probes.erasure.INLP`, amnesic probing's stopping rule) and mean projection; each beside a random subspace of
the same rank. The eraser runs as a hook on the evaluation sentences (every position of the site; activations
streamed, nothing written but the tables) and the clean and erased runs are compared on:

(a) word-level probes (ridge on one-hot labels, fixed alpha, trained on the CLEAN training sentences) for every
    concept at every later layer: accuracy on the erased run and its change from the clean run;
(b) a distance structural probe (Hewitt & Manning) trained on the clean training sentences at every later layer:
    UUAS and DSpr on the erased run;
(c) the pooled sentence embedding (mean of the last hidden state): cosine to clean, and the Spearman correlation
    of the pairwise sentence similarities with the clean ones;
(d) masked-LM accuracy (every 7th word piece masked) where the model has a masked-LM head (the bundled
    all-MiniLM-L6-v2 has none: no such rows);
and, at the erased site itself, the concept probe (fresh, trained and scored on erased vectors: ~majority after
LEACE) and a Hewitt & Liang control task (word identity): how much the eraser removes besides the concept.

Splits: erasers, probes and the control task are fitted on the training sentences only; every reported number
comes from the evaluation sentences (``split = eval``), with a group bootstrap over evaluation sentences. No
hyper-parameter is selected (fixed probe alpha, fixed INLP classifier; INLP's stopping uses a held-out 20% of the
training words). Corpora: ``--corpus`` trains and ``--eval-corpus`` evaluates when given; otherwise, when the run's
corpus is ``builtin`` and UD English EWT is on this machine (`corpus.ewt.find_ewt`), EWT train trains and EWT dev
evaluates; otherwise the run's corpus is split by sentence (seeded). The tables' ``train_corpus`` /
``eval_corpus`` columns say which.

Outputs in ``OUT/erasure/``: ``results`` (long table, columns `COLUMNS`), ``probing`` (clean word-level probes
per layer, and at every block's attention and MLP outputs, with control tasks and selectivity), ``summary`` (per
concept, method and erasure layer: the change
in the same concept's and the other concepts' probes at the last layer, UUAS at the last layer, the embedding
cosine; the random control beside each), figures.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import pandas as pd
from bertscope.experiments.erasure import data, measures, steps
from bertscope.experiments.registry import CannotRun

NAME = "erasure"
DIRNAME = "erasure"
SUMMARY_TABLES = ["summary", "probing"]
COLUMNS = ["model", "train_corpus", "eval_corpus", "split", "concept", "method", "erase_layer", "rank", "measure",
           "target", "layer", "value", "ci_low", "ci_high", "delta", "delta_ci_low", "delta_ci_high", "n_train",
           "n_eval", "selection"]


@dataclass(frozen=True)
class Settings:
    """Sizes of the erasure run (defaults: about a minute on 2 CPU cores with the bundled model)."""

    n_train: int = 150  # training sentences (erasers, probes, structural probes)
    n_eval: int = 80  # evaluation sentences (every reported number)
    min_words: int = 3
    max_words: int = 40  # sentences outside [min_words, max_words] words are skipped (before choosing)
    concepts: tuple[str, ...] = ("position", "upos")  # erased (also: "deprel", "depth", "xpos")
    probed: tuple[str, ...] = ("position", "upos", "xpos", "deprel", "depth")  # probed (xpos only where tagged)
    methods: tuple[str, ...] = ("leace", "inlp", "mean")
    sublayers: tuple[str, ...] = ("attn_out", "mlp_out")  # also probed (probing table) inside every block
    erase_layers: tuple[int, ...] = (1, 3)  # layer numbers (0 = embeddings, k = block k-1's output)
    inlp_iterations: int = 5
    inlp_classifier: str = "svm"  # "svm" (Ravfogel et al.), "sgd-log" (Elazar et al.), "logistic"
    inlp_max_rows: int = 1500  # INLP trains on at most this many training words (seeded sample)
    alpha: float = 1e-2  # ridge probe L2 strength on the mean loss (fixed: nothing is selected)
    max_position: int = 20  # position classes 0..19 and ">= 20"
    max_depth: int = 7
    structural_rank: int = 64
    structural_epochs: int = 40  # a cap: the probe stops early on a held-out 10% of the training sentences
    mlm_every: int = 7
    n_boot: int = 200
    ci: float = 0.95
    source: str = "auto"  # "auto" (EWT when the run's corpus is builtin and EWT is here) or "run" (the run's corpus)

    def __post_init__(self) -> None:
        from bertscope.experiments.settings import require

        if self.n_train < 2 or self.n_eval < 2:
            raise ValueError("n_train and n_eval must be >= 2")
        require(self, positive=("min_words", "max_words", "inlp_iterations", "inlp_max_rows", "alpha",
                                "max_position", "max_depth", "structural_rank", "structural_epochs", "mlm_every",
                                "n_boot"),
                non_negative=("erase_layers",), fraction=("ci",),
                choices={"inlp_classifier": ("svm", "sgd-log", "logistic")},
                non_empty=("concepts", "probed", "methods", "erase_layers"))
        if self.min_words > self.max_words:
            raise ValueError(f"min_words ({self.min_words}) must not exceed max_words ({self.max_words})")
        unknown = set(self.concepts + self.probed) - set(measures.CONCEPTS)
        if unknown:
            raise ValueError(f"unknown concepts {sorted(unknown)}; choose from {measures.CONCEPTS}")
        if set(self.methods) - {"leace", "inlp", "mean"}:
            raise ValueError(f"methods must be among leace, inlp, mean; got {self.methods}")
        if set(self.sublayers) - {"attn_out", "mlp_out", "resid_mid"}:
            raise ValueError(f"sublayers must be among attn_out, mlp_out, resid_mid; got {self.sublayers}")
        if self.source not in ("auto", "run"):
            raise ValueError(f"source must be 'auto' or 'run', got {self.source!r}")


def check_settings(model: Any, settings: Settings) -> None:
    """Erasure layers the model has (`steps.layers_to_erase`): else ``ValueError`` naming the setting, which the CLI
    refuses like any other bad ``--set`` (one line, exit 2) before anything is written."""
    try:
        steps.layers_to_erase(settings, model.config.n_layers)
    except ValueError as e:
        raise ValueError(f"erasure.erase_layers={','.join(map(str, settings.erase_layers))}: {e}") from None


#: Sentences of the run's corpus (with gold trees and UPOS, of ``min_words``-``max_words`` words) the seeded split
#: needs when no other corpus is used: a third (at least 2) evaluates, the rest (at least 2) trains.
MIN_SENTENCES = 6


def check(inputs: Any, settings: Settings) -> None:
    """Before anything is written: corpora that can feed it (else `registry.CannotRun`): sentences with gold trees
    and UPOS of ``min_words``-``max_words`` words in ``--corpus`` (unless EWT stands in for the builtin corpus) and
    in ``--eval-corpus`` when given."""
    lo, hi = settings.min_words, settings.max_words
    eval_corpus = getattr(inputs, "eval_corpus", None)
    fix = "use --corpus builtin or a .conllu file"
    if eval_corpus is not None:
        wanted = {"--corpus": (inputs.corpus, 2), "--eval-corpus": (eval_corpus, 2)}
    elif settings.source == "auto" and inputs.corpus.name == "builtin":
        return  # the builtin corpus has trees, and EWT (when found) stands in for it
    else:
        wanted = {"--corpus": (inputs.corpus, MIN_SENTENCES)}
    for option, (corpus, need) in wanted.items():
        found = len(data.usable(corpus, lo, hi))
        if found < need:
            what = "has no gold dependency trees and UPOS" if not corpus.has_syntax else (
                f"has {found} sentence(s) with gold trees and UPOS of {lo}-{hi} words")
            raise CannotRun(f"needs sentences with gold dependency trees and UPOS ({need} at least), and {option} "
                            f"{corpus.name!r} {what}; {fix}")


def run(ctx: Any, settings: Settings | None = None) -> pd.DataFrame:
    """Run the experiment into ``ctx.out_dir``; returns the main long table."""
    settings = ctx.use_settings(settings)
    t0 = time.perf_counter()
    ctx.note("settings", dataclasses.asdict(settings))
    split = _choose_sentences(ctx, settings)
    ctx.note("corpora", {"train": split.train_name, "eval": split.eval_name, "n_train": len(split.train),
                         "n_eval": len(split.eval)})
    ours = split.train_name in (ctx.corpus_id, f"{ctx.corpus_id}:train-part")  # else EWT, read in part
    ctx.record_used({"train": len(split.train), "eval": len(split.eval)},
                    available=len(ctx.corpus) + len(getattr(ctx.inputs, "eval_corpus", None) or []) if ours else None,
                    more="--set erasure.n_train=N --set erasure.n_eval=N")
    ctx.log(f"train {len(split.train)} sentences of {split.train_name}, evaluate on {len(split.eval)} of "
            f"{split.eval_name} ({time.perf_counter() - t0:.1f}s)")
    ctx.note("erase_layers", steps.layers_to_erase(settings, ctx.model.config.n_layers)[0])  # the layers erased
    probed = tuple(c for c in settings.probed if c != "xpos" or split.has_xpos)
    info = {"model": ctx.model_id, "train_corpus": split.train_name, "eval_corpus": split.eval_name,
            "split": "eval", "n_train": len(split.train), "n_eval": len(split.eval)}
    key = {"train": split.key, "probed": probed}
    tables = ctx.step("erasure", lambda: steps.compute(_run_values(ctx, split), settings, split, probed, info),
                      **key)
    results = tables[tables["table"] == "results"].reindex(columns=COLUMNS + ["majority"]).reset_index(drop=True)
    results = results.astype({c: "int64" for c in ("erase_layer", "rank", "layer", "n_train", "n_eval")})
    probing = tables[tables["table"] == "probing"].dropna(axis=1, how="all").drop(columns="table")
    probing = probing.astype({c: "int64" for c in ("layer", "n_train", "n_eval")})
    ctx.write_table(probing.reset_index(drop=True), "probing")
    ctx.write_table(steps.summary(results), "summary")
    ctx.note("seconds_compute", round(time.perf_counter() - t0, 1))
    ctx.log(f"done in {time.perf_counter() - t0:.1f}s")
    return results


def _run_values(ctx: Any, split: data.Split) -> steps.RunValues:
    """The plain values the measurement steps take from the run; with --activations, the capture serves the clean
    pass of the sentences that come from the run's corpus (--corpus: what the capture holds)."""
    from bertscope.experiments.activations import open_capture

    source = open_capture(ctx.options.activations, ctx.model)
    ours = (ctx.corpus_id, f"{ctx.corpus_id}:train-part", f"{ctx.corpus_id}:eval-part")
    return ctx.run_values(capture_train=source if split.train_name in ours else None,
                          capture_eval=source if split.eval_name in ours else None)


def activation_sites(model: Any) -> list[str]:
    """The sites the clean passes read (what ``--activations`` must hold): every layer's residual output, the
    sublayer outputs the probing table probes, and the last block's output (the pooled embedding). The erased
    runs intervene on the model, so they always run it; with EWT chosen automatically (run corpus ``builtin``)
    the sentences are not the capture's and the model runs too."""
    from bertscope.experiments.erasure import steps

    settings = Settings()
    sites = [data.site(k) for k in steps.layers_of(model)] + [at for _, _, at in steps.sublayer_sites(model, settings)]
    return list(dict.fromkeys([*sites, f"blocks.{model.config.n_layers - 1}.hook_resid_post"]))


def _choose_sentences(ctx: Any, settings: Settings) -> data.Split:
    """Training and evaluation sentences: --corpus / --eval-corpus; else EWT train / dev (``source="auto"``, run
    corpus ``builtin``, EWT found); else a seeded split of the run's corpus by sentence."""
    lo, hi = settings.min_words, settings.max_words
    eval_corpus = getattr(ctx.inputs, "eval_corpus", None)
    if eval_corpus is not None:
        train, evaluate = data.usable(ctx.corpus, lo, hi), data.usable(eval_corpus, lo, hi)
        names = (ctx.corpus_id, str(eval_corpus.name))
    else:
        ewt = data.ewt_pair(settings) if settings.source == "auto" and ctx.corpus_id == "builtin" else None
        if ewt is not None:
            (train_c, eval_c) = ewt
            train, evaluate = data.usable(train_c, lo, hi), data.usable(eval_c, lo, hi)
            names = (train_c.name, eval_c.name)
        else:
            pool = data.usable(ctx.corpus, lo, hi)
            order = ctx.rng("split").permutation(len(pool))
            n_eval = min(settings.n_eval, len(pool) // 3)
            evaluate = [pool[i] for i in order[:n_eval]]
            train = [pool[i] for i in order[n_eval:]]
            names = (f"{ctx.corpus_id}:train-part", f"{ctx.corpus_id}:eval-part")
    cap = ctx.options.max_sentences or max(settings.n_train, settings.n_eval)  # --max-sentences caps both
    n_train, n_eval = min(settings.n_train, cap), min(settings.n_eval, cap)
    train, evaluate = _fits(ctx, train[: 3 * n_train + 20])[:n_train], _fits(ctx, evaluate[: 3 * n_eval + 20])[:n_eval]
    if len(train) < 2 or len(evaluate) < 2:
        raise CannotRun(f"erasure needs sentences with gold trees and UPOS of {lo}-{hi} words: found {len(train)} "
                         f"for training and {len(evaluate)} for evaluation; use --corpus builtin or a .conllu file")
    return data.Split(train, evaluate, names[0], names[1])


def _fits(ctx: Any, sentences: list) -> list:
    """The sentences that fit --max-length whole (the others are left out and counted in the manifest)."""
    import warnings

    from bertscope.experiments.corpus import encode, unencodable

    cut = set(unencodable(sentences, ctx.model.tokenizer, max_length=ctx.options.max_length))  # EWT read here
    fit = [s for s in sentences if s.id not in cut]
    if fit:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            enc = encode(fit, ctx.model.tokenizer, max_length=ctx.options.max_length, batch_size=64)
        cut |= set(enc.truncated_ids)
    if cut:
        ctx.note("n_left_out_too_long", ctx.notes.get("n_left_out_too_long", 0) + len(cut))
    return [s for s in sentences if s.id not in cut]
