"""The bodies of the ``bertscope`` subcommands (``info``, ``capture``, ``run``, ``report``, ``explore``) and
what they print; each takes the parsed arguments and returns the exit status."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bertscope.experiments.options import RunOptions, UsageError
from bertscope.experiments.registry import EXPERIMENTS

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


def cmd_capture(args: argparse.Namespace) -> int:
    """``bertscope capture``: stream activations to shards (one process, N with --nproc, or under torchrun)."""
    from bertscope.experiments.capture import run_command

    return run_command(args, options_from_args(args))


def cmd_run(args: argparse.Namespace) -> int:
    """``bertscope run``: run experiments, then write the report."""
    from bertscope.experiments.options import prepare_inputs
    from bertscope.experiments.registry import load_experiment
    from bertscope.experiments.runner import FigurePipeline, run_experiment

    options = options_from_args(args)
    names = list(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    modules, broken = {}, {}
    for name in names:
        try:
            modules[name] = load_experiment(name)
        except Exception as e:  # a package that does not import is a bug: report it, go on with the others
            if args.experiment != "all":
                raise
            broken[name] = f"{type(e).__name__}: {e}"
    inputs = prepare_inputs(options) if modules else None  # bad input stops here, before any output
    for name, err in broken.items():
        print(f"bertscope: {name} failed to import: {err}", file=sys.stderr)
    refused = _refused(modules, inputs, alone=args.experiment != "all")

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
        from bertscope.experiments.report import build_report

        page = build_report(options.out)
        print(f"report:  {page}  (open it in a browser)")
    failed = broken or any(r.status == "failed" for r in results)
    return EXIT_FAILED if failed else EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    """``bertscope report``: write OUT/index.html."""
    from bertscope.experiments.report import build_report

    if not args.out.is_dir():
        raise UsageError(f"{args.out} is not a folder; run `bertscope run all --out {args.out}` first")
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
    from bertscope.experiments.options import load_model, resolve_device, resolve_dtype

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
    model = load_model(args.model, device=resolve_device(args.device), dtype=resolve_dtype(args.dtype))
    lengths = [len(ids) for ids in model.tokenizer(texts)["input_ids"]]
    too_long = [i + 1 for i, n in enumerate(lengths) if n > args.max_length]
    if too_long:
        raise UsageError(f"TEXT {too_long[0]} is {lengths[too_long[0] - 1]} word pieces long; --max-length is "
                         f"{args.max_length}")  # fmt: skip
    try:
        view = explore(model, texts, mixing=args.mixing)
    except ValueError as e:
        raise UsageError(str(e)) from e
    path = view.save(args.out)
    print(f"explorer: {path}  ({len(texts)} sentence(s), {view.nbytes / 1e6:.2f} MB; open it in a browser)")
    return EXIT_OK



def group_hook_names(names: Sequence[str]) -> list[str]:
    """Collapse per-layer names: ``blocks.0.attn.hook_q`` ... ``blocks.5.attn.hook_q`` ->
    ``blocks.{0..5}.attn.hook_q`` (first-seen order)."""
    grouped: dict[str, list[int]] = {}
    for name in names:
        m = re.match(r"^blocks\.(\d+)\.(.+)$", name)
        key = f"blocks.{{L}}.{m.group(2)}" if m else name
        grouped.setdefault(key, []).append(int(m.group(1)) if m else -1)
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



def options_from_args(args: argparse.Namespace) -> RunOptions:
    """The shared ``RunOptions`` of ``capture`` and ``run`` from their parsed arguments."""
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out {args.out} is a file, not a folder; choose another --out")
    return RunOptions(
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
    )


def _refused(modules: dict[str, Any], inputs: Any, alone: bool) -> dict[str, str]:
    """Check every experiment against the inputs before anything runs (`registry.check_inputs`): an experiment
    asked for alone that cannot run is a `UsageError` (exit 2, nothing written); in ``run all`` it is dropped
    from ``modules`` with one line saying why. Returns ``{name: reason}`` of the dropped ones."""
    from bertscope.experiments.registry import CannotRun, check_inputs

    refused = {}
    for name, module in list(modules.items()):
        try:
            check_inputs(module, inputs)
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

