"""The bodies of ``bertscope sae train`` and ``bertscope sae eval`` (sparse dictionaries, ``docs/dictionaries.md``).

Both check every option before any work (`UsageError`: one line, exit 2, nothing written), then run through the
runner (`runner.run_command`): a ``manifest.json`` in ``--out`` like every other command's, a finished folder
with the same settings is "already complete", one with other settings is refused without ``--force``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

from bertscope.experiments.options import UsageError

__all__ = ["capture_sentences", "check_train_options", "run_eval_command", "run_train_command"]


def _finite(name: str, value: float | None, *, positive: bool = False) -> None:
    """One-line `UsageError` unless ``value`` is finite and ``> 0`` (``positive``) or ``>= 0``."""
    if value is None:
        return
    if not math.isfinite(value):
        raise UsageError(f"{name} must be a finite number, got {value}")
    if positive and value <= 0:
        raise UsageError(f"{name} must be > 0, got {value}")
    if value < 0:
        raise UsageError(f"{name} must be >= 0, got {value}")


def check_train_options(args: Any) -> None:
    """Every ``sae train`` option that can be checked without the model: learning rates, penalties, the buffer
    against the batch, tokens against the batch, the architecture against the kind. `UsageError` otherwise."""
    from bertscope.probes.dictionary import architectures

    _finite("--lr", args.lr, positive=True)
    _finite("--l1", args.l1)
    _finite("--l0", args.l0)
    _finite("--aux-coefficient", getattr(args, "aux_coefficient", None))
    _finite("--e2e-lambda (the FVU's mse_coefficient)", getattr(args, "e2e_lambda", None))
    _finite("--e2e-lr", getattr(args, "e2e_lr", None), positive=True)
    if args.tokens < args.train_batch:
        raise UsageError(f"--tokens {args.tokens} is fewer than one training batch ({args.train_batch}); "
                         "train on more tokens")
    if args.buffer < 2 * args.train_batch:
        raise UsageError(f"--buffer {args.buffer} must hold at least two training batches "
                         f"({2 * args.train_batch} rows with --train-batch {args.train_batch})")
    spec = architectures.get(args.arch)
    if args.kind not in spec.kinds:
        raise UsageError(f"a {args.kind.replace('_', ' ')} is {', '.join(architectures.for_kind(args.kind))} "
                         f"(SAELens's format has no {args.arch} {args.kind.replace('_', ' ')})")


def _train_settings(args: Any, options: Any, sites: Sequence[str]) -> dict[str, Any]:
    """What ``sae train`` records as its settings (the manifest's; a rerun with other ones is refused). The AuxK
    convention and coefficient are recorded when not the defaults (so older folders still match)."""
    auxk = {k: v for k, v in (("auxk", getattr(args, "auxk", "saelens")),
                              ("aux_coefficient", getattr(args, "aux_coefficient", 1.0)))
            if v != {"auxk": "saelens", "aux_coefficient": 1.0}[k]}
    return auxk | {"sites": list(sites), "site_out": args.site_out, "arch": args.arch, "k": args.k, "kind": args.kind,
            "width": str(args.width), "tokens": args.tokens, "train_batch": args.train_batch, "buffer": args.buffer,
            "lr": args.lr, "l1": args.l1, "l0": args.l0, "include_special": args.include_special,
            "checkpoint_every": args.checkpoint_every, "controls": not args.no_controls,
            "activations": None if args.activations is None else str(args.activations),
            "e2e_steps": getattr(args, "e2e_steps", None), "e2e_lambda": getattr(args, "e2e_lambda", None),
            "e2e_lr": getattr(args, "e2e_lr", None)}


def run_train_command(args: Any, options: Any) -> int:
    """``bertscope sae train``: check every input before anything is written (UsageError: one line, exit 2),
    train, save, print where."""
    from bertscope.experiments import dictionary as dict_mod
    from bertscope.experiments.capture.layout import CaptureError
    from bertscope.experiments.options import prepare_inputs
    from bertscope.experiments.runner import run_command
    from bertscope.probes.dictionary import TrainSettings, architectures
    from bertscope.probes.dictionary.placement import site_width, transcoder_sites

    check_train_options(args)
    inputs = prepare_inputs(options)
    model = inputs.model
    if args.kind != "sae" and len(args.site) == 1:
        try:
            site_in, site_out = transcoder_sites(model, args.site[0], args.site_out)
        except KeyError as e:
            raise UsageError(str(e.args[0])) from None
        args.site, args.site_out = [site_in], site_out
    sites = list(args.site) + ([args.site_out] if args.site_out else [])
    uses_k = architectures.get(args.arch).uses_k
    for site in sites:
        try:
            d_in = site_width(model, site)
        except KeyError as e:
            raise UsageError(str(e.args[0])) from None
        if site in args.site:
            width = _width_or_usage(args.width, d_in)
            if uses_k and args.k >= width:
                raise UsageError(f"--k {args.k} must be smaller than the width ({width} latents)")
    if args.kind != "sae" and (not args.site_out or len(args.site) != 1):
        raise UsageError("a transcoder reads one --site and predicts --site-out (e.g. --site "
                         "blocks.3.hook_resid_mid --site-out blocks.3.hook_mlp_out)")
    e2e = _e2e_settings(args, model, options)
    capture = None
    if args.activations is not None:
        from bertscope.experiments.activations import open_capture

        try:
            capture = open_capture(args.activations, model)
            missing = [s for s in sites if s not in capture.resolve(sites)]
        except (CaptureError, KeyError, FileNotFoundError) as e:
            raise UsageError(f"--activations {args.activations}: {' '.join(str(e).split())}") from None
        if missing:
            raise UsageError(f"--activations {args.activations} holds no site {missing[0]}")
    sentences = list(inputs.corpus)
    max_length = options.max_length
    if capture is not None:
        sentences, max_length = capture_sentences(capture, sentences, options.corpus, sites)
    available = dict_mod.corpus_tokens(model, sentences, max_length)
    if available < args.train_batch:
        raise UsageError(f"the corpus has {available} usable tokens (special tokens left out), fewer than one "
                         f"training batch ({args.train_batch}); use a larger --corpus")
    settings = TrainSettings(tokens=args.tokens, batch_size=args.train_batch, buffer_rows=args.buffer,
                             lr=args.lr, seed=options.seed, device=str(inputs.device),
                             dtype=str(inputs.dtype).removeprefix("torch."), include_special=args.include_special,
                             checkpoint_tokens=args.checkpoint_every, progress=not options.quiet,
                             l1_coefficient=args.l1, l0_coefficient=args.l0,
                             auxk=getattr(args, "auxk", "saelens"),
                             aux_coefficient=getattr(args, "aux_coefficient", 1.0))
    whole = args.tokens - args.tokens % args.train_batch
    partial = (f"--tokens {args.tokens:,} is not a whole number of training batches of {args.train_batch:,}: "
               f"training {whole:,} tokens ({whole // args.train_batch} batches)") if whole != args.tokens else None
    dicts: dict[str, Any] = {}

    def body(ctx: Any) -> None:
        if partial:
            ctx.log(partial)  # said before training, kept in the manifest
        if options.force:
            (options.out / "checkpoint.pt").unlink(missing_ok=True)
        dicts.update(dict_mod.train_sae(
            model, sentences, args.site, options.out, arch=args.arch, k=args.k, width=args.width, kind=args.kind,
            site_out=args.site_out, settings=settings, capture=capture, batch_size=options.batch_size,
            max_length=max_length, controls=not args.no_controls, e2e=e2e,
            corpus=inputs.corpus_info))
        ctx.notes["tokens_trained"] = whole

    result = run_command("sae train", options, inputs, options.out, _train_settings(args, options, sites), body,
                         finished=lambda out: (out / "training.json").is_file())
    if result.status == "skipped":
        print(f"bertscope: {options.out} is already complete with the same settings; nothing to do "
              "(--force retrains)")
        return 0
    if not options.quiet:
        print(dict_mod.describe(dicts))
        print(f"saved under {options.out} (SAELens format); evaluate with: bertscope sae eval {options.out} "
              "--corpus HELD_OUT")
    return 0


def _e2e_settings(args: Any, model: Any, options: Any) -> Any:
    """``--e2e-steps`` / ``--e2e-lambda`` / ``--e2e-lr`` as ``E2ESettings`` (None without ``--e2e-steps``);
    UsageError (one line) for a transcoder or a bad value."""
    from bertscope.probes.dictionary import E2ESettings

    steps = getattr(args, "e2e_steps", None)
    if not steps:
        if getattr(args, "e2e_lambda", None) is not None or getattr(args, "e2e_lr", None) is not None:
            raise UsageError("--e2e-lambda and --e2e-lr need --e2e-steps N")
        return None
    if args.kind != "sae":
        raise UsageError("--e2e-steps fine-tunes SAEs end to end; a transcoder is not fine-tuned (use --kind sae)")
    kw = {"steps": steps, "seed": options.seed, "progress": not options.quiet,
          "include_special": args.include_special}
    if args.e2e_lambda is not None:
        kw["mse_coefficient"] = args.e2e_lambda
    if args.e2e_lr is not None:
        kw["lr"] = args.e2e_lr
    try:
        return E2ESettings(**kw)
    except ValueError as e:
        raise UsageError(f"--e2e: {e}") from None


def capture_sentences(capture: Any, sentences: Sequence[Any], corpus_name: str,
                      sites: Sequence[str]) -> tuple[list[Any], int]:
    """The sentences of ``--corpus`` that the capture holds, and the capture's ``--max-length`` (a capture of a
    subset, e.g. ``--max-sentences``, trains on that subset); ``UsageError`` (one line) when it holds none of
    them or was made by another model or dtype."""
    from bertscope.experiments.capture.layout import CaptureError

    held = [s for s in sentences if capture.locate(s) is not None]
    if not held:
        made_from = (capture.index.get("corpus") or {}).get("name", "another corpus")
        raise UsageError(f"--activations {capture.folder} holds none of the sentences of --corpus {corpus_name} "
                         f"(it was made from {made_from}); pass the corpus it was captured from")
    try:
        capture.check(capture.max_length, held, sites)
    except CaptureError as e:
        raise UsageError(" ".join(str(e).split())) from None
    return held, capture.max_length


def _width_or_usage(width: str, d_in: int) -> int:
    from bertscope.experiments.dictionary import parse_width

    try:
        value = parse_width(width, d_in)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if value < 1:
        raise UsageError(f"--width {width} gives no latents")
    return value


def _in_sample(dictionaries: Any, held: dict[str, Any], *, separate: bool) -> str | None:
    """``"yes"`` when the scoring corpus ``held`` is the one a dictionary records it was trained on (same name,
    or same content), ``"maybe"`` for dictionaries that record no corpus scored on ``--corpus`` (no separate
    ``--eval-corpus``), None otherwise."""
    recorded = [d.config.metadata.get("corpus") for d in dictionaries]
    for corpus in recorded:
        if corpus and (corpus.get("sha256") == held.get("sha256") or corpus.get("name") == held.get("name")):
            return "yes"
    return "maybe" if not separate and not any(recorded) else None


def run_eval_command(args: Any, options: Any) -> int:
    """``bertscope sae eval DIR``: evaluate every dictionary under DIR on the held-out corpus (``--eval-corpus``,
    else ``--corpus``), saying when that is the corpus the dictionaries were trained on (in-sample); write the
    tables and a manifest."""
    import pandas as pd
    from bertscope.experiments import dictionary as dict_mod
    from bertscope.experiments.options import prepare_inputs
    from bertscope.experiments.runner import run_command
    from bertscope.probes.dictionary import DictionaryFormatError, load_dictionary
    from bertscope.probes.dictionary.placement import find_dictionaries, load_for_model

    try:
        found = find_dictionaries(args.folder)
        loaded = {name: load_dictionary(path) for name, path in found.items()}
    except DictionaryFormatError as e:
        raise UsageError(str(e)) from None
    inputs = prepare_inputs(options)
    model = inputs.model
    if args.objective == "mlm" and getattr(model, "mlm_head", None) is None:
        raise UsageError(f"--objective mlm: model {model.source} has no masked-LM head (load a checkpoint saved from "
                         "a *ForMaskedLM model, or use --objective sentence)")
    for name, path in found.items():
        try:
            load_for_model(path, model)
        except ValueError as e:
            raise UsageError(f"{name}: {e}") from None
    held_out = inputs.eval_corpus if inputs.eval_corpus is not None else inputs.corpus
    held_info = inputs.eval_corpus_info if inputs.eval_corpus is not None else inputs.corpus_info
    in_sample = _in_sample(loaded.values(), held_info, separate=inputs.eval_corpus is not None)
    which = "--eval-corpus" if inputs.eval_corpus is not None else "--corpus"
    if in_sample:
        print(f"bertscope: scoring on {which} {held_info.get('name', '')}, the corpus the dictionaries were trained "
              f"on{'' if in_sample == 'yes' else ' (or may be)'}: the scores are in-sample (give held-out sentences "
              "with --eval-corpus)", file=sys.stderr)
    table_box: dict[str, Any] = {}

    def body(ctx: Any) -> None:
        table = dict_mod.evaluate_sae(model, args.folder, list(held_out), objective=args.objective,
                                      batch_size=options.batch_size, include_special=args.include_special,
                                      max_length=options.max_length)
        ctx.notes.update(in_sample=in_sample or "no", scored_on=which, corpus=held_info.get("name"),
                         sentences=len(held_out))
        table_box["paths"] = dict_mod.write_evaluation(table, options.out)
        table_box["table"] = table

    settings = {"folder": str(args.folder), "objective": args.objective, "include_special": args.include_special,
                "dictionaries": {n: str(p) for n, p in found.items()}}
    result = run_command("sae eval", options, inputs, options.out, settings, body)
    if result.status == "skipped":
        print(f"bertscope: {options.out} is already complete with the same settings; nothing to do "
              "(--force recomputes)")
        return 0
    if not options.quiet:
        with pd.option_context("display.width", 160, "display.max_columns", 20):
            print(dict_mod.summary(table_box["table"]).to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        print(f"tables: {', '.join(str(p) for ps in table_box['paths'].values() for p in ps)}")
    return 0
