"""What the positions experiment reads, as one plan: the sequence sets it collects activations for, and a capture
of them (``bertscope capture --for positions``) that ``bertscope run positions --activations DIR`` reads instead
of running the forward.

The sets (`Plan.datasets`): ``windows`` (the probed windows), ``windows_shuffled`` (their content pieces
permuted), ``sentences`` and ``sentences_shuffled`` (natural sentences, residual sites), ``windows_zeroed_positions``
(the probed windows through the model with ``embed.hook_pos`` zeroed; models with a position table only) and
``tuning`` (the windows each probe family's alpha is chosen on). Each is collected through the activations
stage (`data.collect`): batches of ``Settings.batch_size`` sequences ordered by length, so a capture made with
the same plan gives the same numbers bit for bit.

A capture for positions is the ordinary capture format (`experiments.capture`, unchanged on disk): every
sequence of every set is one "sentence" with id ``"{set}:{group}"`` (group: window number in the corpus stream,
or sentence index) and text its token ids; each shard holds every site of `data.position_sites`. Its index adds
``positions``: the window plan (`Plan.describe`: window length, seed, numbers of windows, tuning windows and
sentences, batch size, --max-length, whether the zeroed-position set is there). A run reads it only when that
plan, the corpus (sha256), the model, dtype and --max-length are the run's own (`check_capture`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from bertscope.experiments.positions.data import (
    Sequences,
    encode_windows,
    main_sites,
    make_windows,
    position_sites,
    sentences_from_encoded,
    shuffle_content,
    subset,
)

#: The null model: the trained weights with the position embeddings zeroed (``embed.hook_pos`` -> 0).
ZERO_POSITIONS = (("embed.hook_pos", lambda t, hook: t * 0),)
#: index.json key of a positions capture's plan
PLAN_KEY = "positions"


@dataclass
class Plan:
    """The sequences of one positions run: ``windows`` (probed), ``tuning`` (alpha choice), ``sentences`` (the
    first ``n`` of the corpus), the ``settings`` they were cut with (a short corpus gets shorter windows), the
    ``seed``, ``max_length`` (--max-length), ``warnings`` to show and ``why`` (how many sentences, and why)."""

    settings: Any
    windows: Sequences
    tuning: Sequences
    sentences: Sequences
    seed: int
    max_length: int
    zeroed: bool
    n_layers: int
    why: str = ""
    warnings: list[str] = field(default_factory=list)

    def datasets(self, tuning_sites: list[str] | None = None) -> list[tuple[str, Sequences, list[str], tuple]]:
        """``(name, sequences, sites, fwd_hooks)`` of every set, in the order a run collects them
        (``tuning_sites``: the sites the tuning windows are read at; default every site)."""
        n_layers = self.n_layers
        sites, residual = position_sites(n_layers), main_sites(n_layers)
        out = [
            ("windows", self.windows, sites, ()),
            ("windows_shuffled", shuffle_content(self.windows, seed=self.seed), sites, ()),
            ("sentences", self.sentences, residual, ()),
            ("sentences_shuffled", shuffle_content(self.sentences, seed=self.seed), residual, ()),
        ]
        if self.zeroed:
            out.append(("windows_zeroed_positions", self.windows, sites, ZERO_POSITIONS))
        out.append(("tuning", self.tuning, sites if tuning_sites is None else list(tuning_sites), ()))
        return out

    def describe(self) -> dict[str, Any]:
        """The window plan a capture records and a run must match (JSON-able)."""
        s = self.settings
        return {"window_len": int(s.window_len), "seed": int(self.seed), "n_windows": len(self.windows),
                "n_tune_windows": len(self.tuning), "n_sentences": len(self.sentences),
                "max_windows": int(s.max_windows), "tune_windows": int(s.tune_windows),
                "shuffle": "content pieces permuted per sequence, seed = seed", "batch_size": int(s.batch_size),
                "max_length": int(self.max_length), "zeroed_positions": bool(self.zeroed)}  # fmt: skip


def plan_inputs(model: Any, corpus: Any, settings: Any, *, seed: int, max_sentences: int | None, max_length: int,
                encode: Callable[[Any], Any] | None = None) -> Plan:  # fmt: skip
    """The run's `Plan` from the model's tokenizer, the corpus, the experiment's `Settings`, ``--seed``,
    ``--max-sentences`` and ``--max-length``: probe and disjoint tuning windows (seeded, `plan_windows`) and the
    first sentences (``encode(sentences)``: the run context's ``ctx.encode``; default `corpus.encode` at
    ``max_length``). The corpus must pass `experiment.check`."""
    from bertscope.experiments.options import sentences_used

    warnings = []
    want = settings.max_windows + settings.tune_windows
    plan = plan_windows(_stream_length(corpus, model.tokenizer), settings)
    assert plan is not None, "positions.check lets no corpus through that plan_windows refuses"
    length, n_pool, n_tune = plan
    pool = make_windows(corpus, model.tokenizer, length, max_windows=want, seed=seed)
    if length != settings.window_len:
        warnings.append(f"the corpus is too short for {4 * settings.n_folds} windows of {settings.window_len} "
                        f"pieces; using windows of {length}")  # fmt: skip
        settings = dataclasses.replace(settings, window_len=length)
    if len(pool) < want:
        warnings.append(f"the corpus gives {len(pool)} windows of {length}, fewer than the {want} asked for; "
                        f"using {len(pool) - n_tune} for probing and {n_tune} for tuning alphas")  # fmt: skip
    order = np.random.default_rng([seed, 7]).permutation(len(pool))
    windows, tuning = subset(pool, np.sort(order[n_tune:])), subset(pool, np.sort(order[:n_tune]))
    n_used, why = sentences_used(max_sentences, settings.max_sentences, len(corpus))
    kept = list(corpus)[:n_used]  # a prefix, so sentence_index still points into the corpus
    if encode is None:
        from bertscope.experiments.corpus import encode as encode_corpus

        def encode(s: Any) -> Any:
            return encode_corpus(s, model.tokenizer, max_length=max_length)

    sentences = sentences_from_encoded(encode(kept))
    return Plan(settings=settings, windows=windows, tuning=tuning, sentences=sentences, seed=seed,
                max_length=max_length, zeroed="embed.hook_pos" in model.hook_dict, why=why, warnings=warnings,
                n_layers=model.config.n_layers)  # fmt: skip


# ------------------------------------------------------------------------------------------------ capture


def capture_positions(inputs: Any, options: Any, settings: Any, *, shard_size: int | None = None,
                      info: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """``bertscope capture --for positions``: capture every sequence set of the run's `Plan` (same model,
    corpus, settings, --seed, --max-sentences, --max-length) at every site of `data.position_sites` into
    ``options.out``; returns the index (`capture.capture`'s, with ``positions``: `Plan.describe`)."""
    from bertscope.experiments.capture import stream
    from bertscope.experiments.corpus import Corpus, Encoded

    check(inputs, settings)
    model = inputs.model
    plan = plan_inputs(model, inputs.corpus, settings, seed=options.seed, max_sentences=options.max_sentences,
                       max_length=options.max_length)  # fmt: skip
    sentences, batches, hooks = [], [], []
    for name, seqs, _, fwd_hooks in plan.datasets():
        part, encoded = encode_windows(seqs, model.config.pad_token_id, batch_size=plan.settings.batch_size,
                                       name=name, max_length=options.max_length)  # fmt: skip
        offset = len(sentences)
        sentences += part
        for batch in encoded:
            batches.append(dataclasses.replace(batch, sentence_index=[i + offset for i in batch.sentence_index]))
            hooks.append(fwd_hooks)
    corpus = Corpus(f"{inputs.corpus.name} (positions windows)", "positions", sentences)
    encoded = Encoded(batches=batches, n_truncated=0, n_sequences=len(sentences), max_length=options.max_length,
                      pair=False)  # fmt: skip
    info = dict(info or {}) | {PLAN_KEY: plan.describe()}
    return stream.capture(model, corpus, position_sites(model.config.n_layers), options.out,
                          max_length=options.max_length, batch_size=plan.settings.batch_size, shard_size=shard_size,
                          force=options.force, quiet=options.quiet, info=info, encoded=encoded,
                          batch_hooks=hooks)  # fmt: skip


def check_capture(source: Any, inputs: Any, options: Any, settings: Any) -> str | None:
    """``--activations DIR`` for positions, before anything is written: ``None`` when the capture (a
    `activations.CaptureSource`) serves this run; a reason (str) when it is no positions capture at all (made
    without ``--for positions``: ``run positions`` refuses it, ``run all`` runs positions' own forward); a
    `CaptureError` (one line) when it is one made by another model or corpus, with another dtype,
    --max-length or window plan, or lacking a site."""
    from bertscope.experiments.capture import CaptureError

    stored = source.index.get(PLAN_KEY)
    if stored is None:
        return (f"capture {source.folder} holds the corpus's sentences, not positions' windows; make one with "
                "`bertscope capture --for positions` (same --model, --corpus, --seed, --max-sentences, "
                "--max-length, --set positions.*)")  # fmt: skip
    if getattr(inputs, "eval_corpus", None) is not None:
        raise CaptureError("positions reads a capture of --corpus's windows only; with --eval-corpus run it "
                           "without --activations")  # fmt: skip
    want = (inputs.corpus_info or {}).get("sha256")
    have = (source.index.get("corpus") or {}).get("sha256")
    if want is not None and have != want:
        name = (source.index.get("corpus") or {}).get("name", "another corpus")
        raise CaptureError(f"capture {source.folder} was made from another corpus ({name}); recapture this "
                           "--corpus with `bertscope capture --for positions`")  # fmt: skip
    source.check(options.max_length, [], sites=position_sites(inputs.model.config.n_layers))
    check(inputs, settings)
    plan = plan_inputs(inputs.model, inputs.corpus, settings, seed=options.seed,
                       max_sentences=options.max_sentences, max_length=options.max_length).describe()  # fmt: skip
    differ = [k for k in sorted(set(plan) | set(stored)) if plan.get(k) != stored.get(k)]
    if differ:
        what = ", ".join(f"{k} {stored.get(k)} (this run: {plan.get(k)})" for k in differ)
        raise CaptureError(f"capture {source.folder} was made with another window plan: {what}; recapture with "
                           "`bertscope capture --for positions` and this run's settings")  # fmt: skip
    return None


# ------------------------------------------------------------------------------------------------ window plan


def check(inputs: Any, settings: Any) -> None:
    """Refuse (`registry.CannotRun`) a model too short for a window, or a corpus (``--corpus``, and
    ``--eval-corpus`` when given) too short for the windows the probes need (`plan_windows`), before anything
    is written."""
    _check_corpus(inputs.model, inputs.corpus, settings, "--corpus")
    eval_corpus = getattr(inputs, "eval_corpus", None)
    if eval_corpus is not None:
        _check_corpus(inputs.model, eval_corpus, settings, "--eval-corpus")


def _check_corpus(model: Any, corpus: Any, settings: Any, option: str) -> None:
    """`check` for one corpus (``option`` names it in the message)."""
    from bertscope.experiments.registry import CannotRun

    if settings.window_len + 2 > model.config.max_length:
        raise CannotRun(f"windows of {settings.window_len} word pieces plus [CLS] and [SEP] exceed the model's "
                        f"{model.config.max_length} positions; use a model with at least {settings.window_len + 2}")
    n_pieces = _stream_length(corpus, model.tokenizer)
    if plan_windows(n_pieces, settings) is None:
        need = _MIN_WINDOW * 4 * settings.n_folds
        raise CannotRun(f"needs at least {need} word pieces of text ({4 * settings.n_folds} windows of "
                        f"{_MIN_WINDOW}: {settings.n_folds} folds to probe and to tune on), and corpus "
                        f"{corpus.name!r} has {n_pieces}; use a longer {option} or a larger --max-sentences")


_MIN_WINDOW = 4  # the shortest window a short corpus is cut into (`plan_windows`)


def plan_windows(n_pieces: int, settings: Any) -> tuple[int, int, int] | None:
    """``(window length, windows cut, of which tuning windows)`` for a corpus stream of ``n_pieces`` word pieces,
    or None when even windows of 4 pieces are too few. A corpus too short for ``4 * n_folds`` windows of
    ``window_len`` pieces gets shorter windows (halved, down to 4); with fewer windows than the
    ``max_windows + tune_windows`` asked for, the tuning windows shrink in proportion (at least ``2 * n_folds``);
    at least ``2 * n_folds`` windows must remain to probe."""
    want = settings.max_windows + settings.tune_windows
    length = settings.window_len
    while n_pieces // length < 4 * settings.n_folds and length // 2 >= _MIN_WINDOW:
        length //= 2
    n_pool = min(n_pieces // length, want)
    n_tune = settings.tune_windows
    if n_pool < want:
        n_tune = max(2 * settings.n_folds, n_pool * settings.tune_windows // want)
    if n_pool < 2 or n_pool - n_tune < 2 * settings.n_folds:
        return None
    return length, n_pool, n_tune


_STREAM_LENGTHS: dict[tuple[int, int], tuple[Any, Any, int]] = {}  # the check, the runner and run ask alike


def _stream_length(corpus: Any, tokenizer: Any) -> int:
    """Word pieces in the corpus's stream (its sentences tokenized without special tokens, as windows are cut);
    counted once per corpus and tokenizer object (about 1 s for the builtin corpus)."""
    hit = _STREAM_LENGTHS.get((id(corpus), id(tokenizer)))
    if hit is not None and hit[0] is corpus and hit[1] is tokenizer:
        return hit[2]
    texts = [s.text for s in corpus]
    n = sum(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]) if texts else 0
    _STREAM_LENGTHS.clear()  # one entry: no corpus is kept alive beyond the next count
    _STREAM_LENGTHS[(id(corpus), id(tokenizer))] = (corpus, tokenizer, n)
    return n
