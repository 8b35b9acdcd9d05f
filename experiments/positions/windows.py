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
from pathlib import Path
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
    from bertscope.experiments.positions.experiment import _stream_length, plan_windows

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
    from bertscope.experiments.positions.experiment import check

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
    from bertscope.experiments.positions.experiment import check

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


def capture_source(ctx: Any, settings: Any) -> Any:
    """The `activations.CaptureSource` the run reads (``--activations`` naming a positions capture), or ``None``
    (run the forward; a log line says so when ``--activations`` names a capture of sentences, as in ``run all``)."""
    from bertscope.experiments.activations import CaptureSource

    folder = getattr(ctx.options, "activations", None)
    if folder is None:
        return None
    source = CaptureSource(Path(folder), ctx.model)
    why = check_capture(source, ctx.inputs, ctx.options, settings)
    if why is not None:
        ctx.log(f"--activations not used: {why}")
        return None
    ctx.note("activations", str(folder))
    ctx.log(f"reading the windows' activations from the capture {folder}")
    return source
