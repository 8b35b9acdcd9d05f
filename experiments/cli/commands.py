"""The bodies of the ``bertscope`` subcommands (``info``, ``capture``, ``run``, ``report``, ``explore``) and
what they print; each takes the parsed arguments and returns the exit status."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bertscope.experiments.options import RunOptions, UsageError
from bertscope.experiments.registry import EXPERIMENTS
from bertscope.hooks.sites import parse_site

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def cmd_info(args: argparse.Namespace) -> int:
    """``bertscope info``: print the model's description."""
    from bertscope.experiments.options import load_model, model_summary, resolve_device, resolve_dtype

    model = load_model(args.model, device=resolve_device(args.device), dtype=resolve_dtype(args.dtype))
    summary = model_summary(model)
    names = model.hook_names()
    if args.json:
        print(json.dumps({**summary, "hook_names": names}, indent=2))
        return EXIT_OK
    c = summary["config"]
    lines = [
        f"model        {summary['source']}",
        f"weights      sha256 {summary['weights_sha256']}",
        f"layers       {c['n_layers']}    heads {c['n_heads']}    d_model {c['d_model']}    "
        f"d_head {c['d_model'] // c['n_heads']}    d_mlp {c['d_mlp']}",
        f"vocab        {c['vocab_size']}    max positions {c['max_positions']}    "
        f"token types {c['type_vocab_size']}",
        f"variant      norm {c['norm_placement']}    positions {c['position_encoding']}    "
        f"activation {c['activation']}    attention projections {c['attention_projections']}",
        f"parameters   {summary['n_parameters']:,}",
        f"tokenizer    {summary['tokenizer']} ({summary['tokenizer_vocab_size']} tokens)",
        f"hook points  {len(names)} (blocks.{{L}} = one entry per layer; --json lists every name)",
    ]
    lines += [f"  {name}" for name in group_hook_names(names)]
    print("\n".join(lines))
    return EXIT_OK


def cmd_capture(args: argparse.Namespace, worker_argv: Sequence[str] = ()) -> int:
    """``bertscope capture``: stream activations to shards (one process, N with --nproc, or under torchrun);
    ``worker_argv``: ``args`` as ``--nproc``'s workers get them (``parser.worker_argv``)."""
    options = options_from_args(args)  # usage errors before the capture package (and torch) is imported
    from bertscope.experiments.capture import run_command

    start_threads(options)
    return run_command(args, options, worker_argv)



def cmd_sae(args: argparse.Namespace) -> int:
    """``bertscope sae train|eval``: sparse dictionaries (bodies in ``experiments.cli.sae_command``)."""
    from bertscope.experiments.cli import sae_command

    run = sae_command.run_train_command if args.sae_command == "train" else sae_command.run_eval_command
    options = options_from_args(args)
    start_threads(options)
    return run(args, options)


def cmd_run(args: argparse.Namespace) -> int:
    """``bertscope run``: run experiments, then write the report."""
    from bertscope.experiments.options import prepare_inputs, read_pairs_spec
    from bertscope.experiments.registry import load_experiment
    from bertscope.experiments.runner import FigurePipeline, run_experiment

    options = options_from_args(args)
    names = list(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    _check_set_targets(options, names)
    modules, broken = {}, {}
    for name in names:
        try:
            modules[name] = load_experiment(name)
        except Exception as e:  # a package that does not import is a bug: report it, go on with the others
            if args.experiment != "all":
                raise
            broken[name] = f"{type(e).__name__}: {e}"
    _type_settings(options, modules)  # a bad --set stops here, before the model is loaded
    # a pairs experiment run alone reads --corpus as its pairs file (a bad one stops here, before torch loads)
    pairs = read_pairs_spec(modules[args.experiment], options) if args.experiment in modules else None
    start_threads(options)
    inputs = prepare_inputs(options, pairs) if modules else None  # bad input stops here, before any output
    if inputs is not None and options.activations is not None:
        check_activations(options, inputs, modules, alone=args.experiment != "all")
    for name, err in broken.items():
        print(f"bertscope: {name} failed to import: {err}", file=sys.stderr)
    refused = _refused(modules, inputs, alone=args.experiment != "all", overrides=options.settings)

    results = []
    if inputs is not None:
        def on_start(name: str, out_dir: Path) -> None:
            _say(options, f"bertscope: running {name} -> {out_dir}")

        # With several experiments, each one's figures are drawn in the background while the next computes.
        with FigurePipeline() as figures:
            pipeline = figures if len(modules) > 1 else None
            for module in modules.values():
                results.append(run_experiment(module, options, inputs, on_start=on_start, figures=pipeline))
            results = [figures.finish(r) for r in results]
        for result in results:
            if result.status == "failed":
                print(f"bertscope: {result.name} failed:\n{result.error}", file=sys.stderr)
            elif result.status == "refused":  # found only while running (the check up front passed)
                if args.experiment != "all":
                    raise UsageError(f"{result.name}: {result.error}")
                print(f"bertscope: skipped {result.name}: {result.error}", file=sys.stderr)

    print(_summary(results, broken, refused))
    print(f"results: {options.out}/")
    if not args.no_report and (options.out.is_dir() and any(options.out.glob("*/manifest.json"))):
        page, explorer = _run_report(options, inputs)
        print(f"report:  {page}  (open it in a browser)")
        if explorer.html is None:
            _say(options, f"explorer: {explorer.message}")
    failed = broken or any(r.status == "failed" for r in results)
    return EXIT_FAILED if failed else EXIT_OK


def _run_report(options: RunOptions, inputs: Any) -> tuple[Path, Any]:
    """The report `run` writes: the same page as `bertscope report OUT` (default explorer included), built with
    the model already loaded. Returns (page, the explorer choice)."""
    from bertscope.experiments import report_explore
    from bertscope.experiments.options import load_model, resolve_device, resolve_dtype
    from bertscope.experiments.report import build_report

    def load() -> Any:
        if inputs is not None:
            return inputs.model
        return load_model(options.model, device=resolve_device(options.device), dtype=resolve_dtype(options.dtype))

    explorer = report_explore.choose(options.out, load_model=load)
    return build_report(options.out, explorer=explorer), explorer


def cmd_report(args: argparse.Namespace) -> int:
    """``bertscope report``: write OUT/index.html."""
    if not args.out.is_dir():
        raise UsageError(f"{args.out} is not a folder; run `bertscope run all --out {args.out}` first")
    from bertscope.experiments.report import build_report
    explorer = _report_explorer(args)
    try:
        page = build_report(args.out, embed_figures=not args.link_figures, explorer=explorer)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(str(e)) from e
    if explorer is not None:
        print(f"explorer: {explorer.message}", file=sys.stderr if explorer.html is None else sys.stdout)
    print(f"report: {page}")
    return EXIT_OK


def cmd_explore(args: argparse.Namespace) -> int:
    """``bertscope explore``: write an explorer page for the given texts."""
    from bertscope.experiments.explorer import explore, mixing_methods
    from bertscope.experiments.options import check_max_length, load_model, resolve_device, resolve_dtype

    texts = list(args.texts)
    if any(not t.strip() for t in texts):
        raise UsageError("every TEXT must hold some words; got an empty one")
    if args.out.is_dir() or args.out.suffix.lower() not in (".html", ".htm"):
        raise UsageError(f"--out {args.out} must be an .html file path")
    if not args.out.parent.is_dir():
        raise UsageError(f"--out {args.out}: folder {args.out.parent} does not exist")
    try:
        mixing_methods(args.mixing)
    except ValueError as e:
        raise UsageError(str(e)) from e
    dictionary, latent = getattr(args, "dictionary", None), getattr(args, "latent", None)
    if (dictionary is None) != (latent is None):
        raise UsageError("--dictionary DIR and --latent N go together: give both to colour tokens by a latent")
    if dictionary is not None:
        from bertscope.probes.dictionary import is_dictionary

        if not is_dictionary(dictionary):  # before the model loads
            inside = sorted(p.name for p in dictionary.glob("*") if is_dictionary(p)) if dictionary.is_dir() else []
            if inside:  # a `sae train --out` folder: one dictionary per site
                raise UsageError(f"--dictionary {dictionary} holds one dictionary per site; give one of its "
                                 f"sub-folders: {', '.join(str(dictionary / n) for n in inside)}")
            raise UsageError(f"--dictionary {dictionary} is not a dictionary folder (cfg.json + "
                             "sae_weights.safetensors); train one with `bertscope sae train` or `run features`")
    model = load_model(args.model, device=resolve_device(args.device), dtype=resolve_dtype(args.dtype))
    check_max_length(args.max_length, model)
    lengths = [len(ids) for ids in model.tokenizer(texts)["input_ids"]]
    too_long = [i + 1 for i, n in enumerate(lengths) if n > args.max_length]
    if too_long:
        raise UsageError(f"TEXT {too_long[0]} is {lengths[too_long[0] - 1]} word pieces long; --max-length is "
                         f"{args.max_length}")  # fmt: skip
    try:
        view = explore(model, texts, mixing=args.mixing, dictionary=dictionary, latents=latent)
    except ValueError as e:
        raise UsageError(str(e)) from e
    path = view.save(args.out)
    shown = view.payload.get("latents")
    extra = f"; latent view: {', '.join(map(str, shown['ids']))} of {shown['site']}" if shown else ""
    print(f"explorer: {path}  ({len(texts)} sentence(s), {view.nbytes / 1e6:.2f} MB{extra}; open it in a browser)")
    return EXIT_OK



def cmd_clean(args: argparse.Namespace) -> int:
    """``bertscope clean``: delete the step caches and partial files under OUT (see `runner.clean_results`)."""
    from bertscope.experiments.runner import clean_results

    if not args.out.is_dir():
        raise UsageError(f"{args.out} is not a folder; give a results folder (e.g. results)")
    removed, kept = clean_results(args.out, dry_run=args.dry_run)
    for name in kept:
        print(f"  {name:<12} manifest says running: its steps are kept (delete them by hand if no process runs it)")
    freed = sum(size for _, size in removed)
    verb = "would free" if args.dry_run else "freed"
    print(f"clean: {len(removed)} file(s) under {args.out}/, {verb} {_bytes(freed)}")
    return EXIT_OK


def _bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def group_hook_names(names: Sequence[str]) -> list[str]:
    """Collapse per-layer names: ``blocks.0.attn.hook_q`` ... ``blocks.5.attn.hook_q`` ->
    ``blocks.{0..5}.attn.hook_q`` (first-seen order)."""
    grouped: dict[str, list[int]] = {}
    for name in names:
        site = parse_site(name)
        key = name if site.layer is None else f"blocks.{{L}}.{site.suffix}"
        grouped.setdefault(key, []).append(-1 if site.layer is None else site.layer)
    lines = []
    for key, layers in grouped.items():
        if "{L}" in key:
            span = "{" + f"{min(layers)}..{max(layers)}" + "}" if len(layers) > 1 else str(layers[0])
            key = key.replace("{L}", span)
        lines.append(key)
    return lines



def _report_explorer(args: argparse.Namespace) -> Any:
    """The report's ``ExploreChoice`` from ``--explore``/``--explore-ids``/``--no-explore`` (None: no section)."""
    from bertscope.experiments import report_explore
    from bertscope.experiments.explorer import mixing_methods
    from bertscope.experiments.options import load_model, resolve_device, resolve_dtype

    if args.no_explore:
        return None
    try:
        ids = None if args.explore_ids is None else report_explore.parse_ids(args.explore_ids)
        mixing_methods(args.mixing)
    except ValueError as e:
        raise UsageError(str(e)) from e
    options = report_explore.run_options(args.out) or {}

    def load():
        spec = args.model if args.model is not None else options.get("model")
        return load_model(spec, device=resolve_device(args.device), dtype=resolve_dtype(args.dtype))

    try:
        return report_explore.choose(args.out, load_model=load, n=args.explore, ids=ids, mixing=args.mixing)
    except ValueError as e:
        raise UsageError(str(e)) from e



def _check_set_targets(options: RunOptions, names: list[str]) -> None:
    """``--set`` for an experiment this command does not run is a mistake: a `UsageError`."""
    for name, fields in options.settings.items():
        if name not in names:
            item = f"{name}.{next(iter(fields))}"
            raise UsageError(f"--set {item}=...: `bertscope run {names[0] if len(names) == 1 else 'all'}` does not "
                             f"run {name}; drop it or run {name}")  # fmt: skip


def _type_settings(options: RunOptions, modules: dict[str, Any]) -> None:
    """Type and check each experiment's ``--set`` values against its ``Settings`` (`UsageError` if bad); the
    options then hold the typed values (what the manifest and the fingerprint record)."""
    from bertscope.experiments.settings import apply_overrides, changed_fields

    for name, texts in list(options.settings.items()):
        if name in modules:
            defaults = modules[name].Settings()
            typed = apply_overrides(name, defaults, texts)
            # with the fields the Settings derive from them (circuits' task_sha256 from its task file)
            options.settings[name] = {**{k: getattr(typed, k) for k in texts}, **changed_fields(defaults, typed)}


def options_from_args(args: argparse.Namespace) -> RunOptions:
    """The shared ``RunOptions`` of ``capture`` and ``run`` from their parsed arguments."""
    from bertscope.experiments.options import check_corpus_spelling

    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out {args.out} is a file, not a folder; choose another --out")
    check_corpus_spelling(args.corpus)
    options = RunOptions(
        model=args.model,
        corpus=args.corpus,
        max_sentences=args.max_sentences,
        max_length=args.max_length,
        batch_size=args.batch_size,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        out=args.out,
        force=args.force,
        quiet=args.quiet,
        keep_steps=getattr(args, "keep_steps", "no") == "yes",
        settings=_set_assignments(args),
        activations=getattr(args, "activations", None),
        eval_corpus=getattr(args, "eval_corpus", None),
        threads=getattr(args, "threads", None),
    )
    return options


def start_threads(options: RunOptions) -> None:
    """Set the run's thread budget once, where the CLI starts any work (after the usage checks, which answer
    without importing torch); ``options.threads`` then holds the number used (the manifest records it)."""
    from bertscope.experiments.jobs import set_thread_budget

    options.threads = set_thread_budget(options.threads)


def _set_assignments(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """``--set NAME.FIELD=VALUE`` items, with `run`'s experiment options (``--tokens N`` = ``--set
    features.tokens=N``, `registry.RUN_OPTIONS`) added, split by experiment (texts; typed once the experiments are
    imported)."""
    from bertscope.experiments.registry import RUN_OPTIONS, run_option_dest
    from bertscope.experiments.settings import parse_assignments

    items = list(getattr(args, "set", None) or [])
    for flag, (name, field, _, _) in RUN_OPTIONS.items():  # `run`'s experiment options: the same --set items
        value = getattr(args, run_option_dest(flag), None)
        if value is None:
            continue
        experiment = getattr(args, "experiment", name)
        if experiment not in (name, "all"):
            raise UsageError(f"{flag} is an option of `bertscope run {name}`; `bertscope run {experiment}` does not "
                             f"run {name}")
        if any(i.partition("=")[0].strip().replace("_", "-") == f"{name}.{field}" for i in items):
            raise UsageError(f"{flag} and --set {name}.{field}=... give the same setting; give one of them")
        items.append(f"{name}.{field}={value}")
    return parse_assignments(items, list(EXPERIMENTS))


def check_activations(options: RunOptions, inputs: Any, modules: dict[str, Any], *, alone: bool) -> None:
    """``--activations DIR`` before anything is written: the capture must hold the sites each experiment reads
    (its ``activation_sites(model)``), the sentences it uses, the run's model, dtype and ``--max-length``, else
    `UsageError`. An experiment whose forward a capture cannot replace (``NO_ACTIVATIONS``: why) is refused
    when asked for alone; in ``run all`` it runs the model itself, and a line says so. An experiment that reads
    a capture of its own sequences (``check_capture``: positions' windows, `bertscope capture --for`) checks the
    capture itself: a capture of sentences is then refused alone and, in ``run all``, leaves it its forward."""
    from bertscope.experiments.activations import CaptureSource
    from bertscope.experiments.capture import CaptureError
    from bertscope.experiments.options import sentences_used
    from bertscope.experiments.settings import experiment_settings

    try:
        source = CaptureSource(options.activations, inputs.model)
        for name, module in modules.items():
            own = getattr(module, "check_capture", None)  # a capture of the experiment's own sequences
            if own is not None:
                why = own(source, inputs, options, experiment_settings(module, options.settings))
                if why is not None and alone:
                    raise UsageError(f"--activations: {why}")
                if why is not None:
                    _say(options, f"bertscope: {name} runs the model itself ({why})")
                continue
            sites = getattr(module, "activation_sites", None)
            if sites is None:
                why = getattr(module, "NO_ACTIVATIONS", "it runs the model itself")
                if alone:
                    raise UsageError(f"--activations: {name} cannot read its activations from a capture: {why}")
                _say(options, f"bertscope: {name} runs the model itself ({why}); --activations is not used there")
                continue
            default = getattr(module.Settings(), "max_sentences", None)
            n, _ = sentences_used(options.max_sentences, default, len(inputs.corpus))
            source.check(options.max_length, list(inputs.corpus)[:n], sites=sites(inputs.model))
    except CaptureError as e:
        raise UsageError(f"--activations: {e}") from None


def _refused(modules: dict[str, Any], inputs: Any, alone: bool,
             overrides: dict[str, dict[str, Any]] | None = None) -> dict[str, str]:
    """Check every experiment against the inputs, with the settings it will run with (``overrides``: the typed
    ``--set`` values), before anything runs: a setting the model cannot take (`registry.check_settings`: a layer
    it lacks) is a `UsageError` (exit 2, nothing written, in ``run all`` too); then `registry.check_inputs`: an
    experiment asked for alone that cannot run is a `UsageError`; in ``run all`` it is dropped from ``modules``
    with one line saying why. Returns ``{name: reason}`` of the dropped ones."""
    from bertscope.experiments.registry import CannotRun, check_inputs, check_settings
    from bertscope.experiments.settings import experiment_settings

    settings = {name: experiment_settings(module, overrides) for name, module in modules.items()}
    for name, module in modules.items():
        try:
            check_settings(module, inputs.model, settings[name])
        except ValueError as e:
            raise UsageError(f"--set {' '.join(str(e).split())}") from None
    refused = {}
    for name, module in list(modules.items()):
        try:
            check_inputs(module, inputs, settings[name])
        except CannotRun as e:
            if alone:
                raise UsageError(f"{name}: {e}") from None
            refused[name] = str(e)
            del modules[name]
            print(f"bertscope: skipped {name}: {e}", file=sys.stderr)
    return refused


def _summary(results: list[Any], broken: dict[str, str], refused: dict[str, str] | None = None) -> str:
    lines = []
    for r in results:
        took = "" if r.status == "skipped" else f" in {r.seconds:.1f} s"
        why = ""
        if r.status == "skipped":
            why = " (already complete with the same settings; --force recomputes)"
            if r.code_changed:
                why = " (complete with the same settings, but its code changed since: --force recomputes)"
        if r.status == "refused":
            lines.append(f"  {r.name:<12} skipped: {r.error}")
            continue
        lines.append(f"  {r.name:<12} {r.status}{took}{why}  -> {r.out_dir}/")
    lines += [f"  {name:<12} skipped: {why}" for name, why in (refused or {}).items()]
    lines += [f"  {name:<12} import failed" for name in broken]
    return "experiments:\n" + "\n".join(lines) if lines else "experiments: none ran"


def _say(options: RunOptions, msg: str) -> None:
    if not options.quiet:
        print(msg, file=sys.stderr, flush=True)

