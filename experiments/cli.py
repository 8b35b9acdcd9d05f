"""The ``bertscope`` command line.

    bertscope info [--model M] [--json]
    bertscope capture --hooks GLOB [--corpus C] [--out DIR] [--shard-size 256MB] [--nproc N]
    bertscope run {same-token,heads,positions,all} [shared options]
    bertscope report [OUT] [--explore N | --explore-ids I,J | --no-explore] [--model M] [--mixing METHODS]
    bertscope explore "text" ["another text" ...] [--model M] [--mixing alti,attention_norm] [--out explore.html]

Bad input (unknown model or corpus, unavailable device, unsupported dtype, a hook glob that matches
nothing) prints one ``bertscope: error: ...`` line and exits with status 2; Ctrl-C exits with 130 and
keeps every finished file, so rerunning the same command resumes.
"""

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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``bertscope`` console script; returns the exit status."""
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.handler(args)
    except UsageError as e:
        return _fail(str(e))
    except BrokenPipeError:  # `bertscope info --json | head`: the reader left; not an error of ours
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        print(
            "\nbertscope: interrupted; finished files are kept, rerun the same command to resume",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("bertscope")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The argparse parser with every subcommand (``--help`` works on each; ``run NAME --help`` describes
    experiment NAME, so ``argv`` is looked at for that name).

    Longer than 60 lines: a flat list of argparse declarations, one per option, read top to bottom like the
    ``--help`` output; splitting it would scatter the CLI's options across helpers.
    """
    parser = argparse.ArgumentParser(
        prog="bertscope",
        description="Mechanistic interpretability for BERT-family encoders: inspect, capture, experiment, report.",
        epilog="Quick start: bertscope run all && bertscope report results",
    )
    parser.add_argument("--version", action="version", version=f"bertscope {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "info",
        help="describe a model: sizes, parameters, weights' source and sha256, hook names",
        description="Describe a model: layers, heads, sizes, parameter count, weights' source and sha256, "
        "and every hook-point name.",
    )
    _add_model_options(p)
    p.add_argument("--json", action="store_true", help="print everything as JSON (all hook names listed)")
    p.set_defaults(handler=cmd_info)

    p = sub.add_parser(
        "capture",
        help="stream selected activations for a corpus to safetensors shards",
        description="Run the model over a corpus and stream the activations at the selected hook points to "
        "OUT/shard-*.safetensors (one row per real token, never padding; row metadata rows.* maps each row "
        "to its sentence and position) with OUT/index.json and OUT/sentences.parquet. Memory stays "
        "within about one shard; an interrupted capture resumes where it stopped. Load it back with "
        "bertscope.load_capture(OUT).",
    )
    p.add_argument(
        "--hooks",
        required=True,
        help="hook names or globs, comma-separated, e.g. 'blocks.*.hook_resid_post,blocks.0.attn.hook_pattern' "
        "(see `bertscope info`)",
    )
    p.add_argument(
        "--shard-size",
        default="256MB",
        type=_size,
        help="bytes per shard, e.g. 64MB, 1GiB (default 256MB); bounds memory use",
    )
    p.add_argument(
        "--nproc",
        type=_positive_int,
        default=None,
        help="split the corpus over N local processes launched with torchrun (same bytes as one process); "
        "for several machines run torchrun -m bertscope.experiments.capture yourself (docs/capture.md)",
    )
    _add_shared_options(p, out_default=Path("results/capture"))
    p.set_defaults(handler=cmd_capture)

    from bertscope.experiments.registry import help_text

    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv[argv.index("run") + 1:] if a in EXPERIMENTS), None) if "run" in argv else None
    p = sub.add_parser(
        "run",
        help="run an experiment (or all of them) and write tables, figures and manifests",
        description=(f"{chosen}: {help_text(chosen)}\n\n" if chosen else "")
        + "Run an experiment, or all that are installed, writing OUT/<experiment>/results.parquet "
        "and .csv, figures (PNG and PDF) and manifest.json, then OUT/index.html. Finished experiments with "
        "the same settings are skipped unless --force.",
        epilog=None if chosen else "experiments:\n" + "\n".join(f"  {n}: {help_text(n)}" for n in EXPERIMENTS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("experiment", choices=[*EXPERIMENTS, "all"], help="which experiment")
    _add_shared_options(p, out_default=Path("results"))
    p.add_argument("--no-report", action="store_true", help="do not write OUT/index.html afterwards")
    p.set_defaults(handler=cmd_run)

    p = sub.add_parser(
        "report",
        help="write OUT/index.html: one offline page with every figure, key table and manifest",
        description="Write OUT/index.html, a self-contained page (figures embedded, key tables, manifests) "
        "that opens offline in a browser.",
    )
    p.add_argument("out", nargs="?", type=Path, default=Path("results"), help="results folder (default results)")
    p.add_argument(
        "--link-figures",
        action="store_true",
        help="link figures by relative path instead of embedding them (smaller page; keep the folder together)",
    )
    _add_report_explore_options(p)
    p.set_defaults(handler=cmd_report)

    p = sub.add_parser(
        "explore",
        help="write one offline HTML page with interactive attention (and mixing) views of your sentences",
        description="Run the model on each TEXT and write an interactive page (head view, model view, "
        "query-key view; context-mixing methods in a menu with --mixing): one self-contained HTML file.",
    )
    p.add_argument("texts", nargs="+", metavar="TEXT", help="one or more sentences (quote each)")
    _add_model_options(p)
    p.add_argument("--max-length", type=_positive_int, default=128,
                   help="word pieces per text incl. [CLS]/[SEP]; a longer text is an error (default 128)")  # fmt: skip
    p.add_argument("--mixing", default=None, metavar="METHODS",
                   help="context-mixing methods for the menu, comma-separated, e.g. alti,attention_norm")  # fmt: skip
    p.add_argument("--out", type=Path, default=Path("explore.html"), help="HTML file to write (default explore.html)")
    p.set_defaults(handler=cmd_explore)
    return parser


# ----------------------------------------------------------------------------------------------- commands


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

    return run_command(args, _options(args))


def cmd_run(args: argparse.Namespace) -> int:
    """``bertscope run``: run experiments, then write the report."""
    from bertscope.experiments.options import prepare_inputs
    from bertscope.experiments.registry import load_experiment
    from bertscope.experiments.runner import run_experiment

    options = _options(args)
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

    results = []
    if inputs is not None:
        def on_start(name: str, out_dir: Path) -> None:
            _say(options, f"bertscope: running {name} -> {out_dir}")

        for module in modules.values():
            result = run_experiment(module, options, inputs, on_start=on_start)
            if result.status == "failed":
                print(f"bertscope: {result.name} failed:\n{result.error}", file=sys.stderr)
            results.append(result)

    print(_summary(results, broken))
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


# ----------------------------------------------------------------------------------------------- helpers


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


def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=None,
        help="model folder (transformers or sentence-transformers layout) or a hub id already in the local "
        "cache; default: the bundled all-MiniLM-L6-v2",
    )
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda or cuda:N (default auto)")
    p.add_argument("--dtype", default="float32", help="float32 (default), float16, bfloat16 or float64")


def _add_report_explore_options(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("explorer", "an interactive attention explorer for a few corpus sentences "
                                 "(default: where the notable heads in the saved tables are most active)")  # fmt: skip
    which = group.add_mutually_exclusive_group()
    which.add_argument("--explore", type=_positive_int, default=None, metavar="N",
                       help="embed the first N sentences of the run's corpus")  # fmt: skip
    which.add_argument("--explore-ids", default=None, metavar="I,J",
                       help="embed these corpus sentence indices (0-based)")  # fmt: skip
    which.add_argument("--no-explore", action="store_true", help="embed no explorer")
    group.add_argument("--mixing", default=None, metavar="METHODS",
                       help="context-mixing methods for the explorer's menu, e.g. alti,attention_norm")  # fmt: skip
    _add_model_options(group)
    group.set_defaults(model=None)


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


def _add_shared_options(p: argparse.ArgumentParser, out_default: Path) -> None:
    _add_model_options(p)
    p.add_argument(
        "--corpus",
        default="builtin",
        help="builtin (default; generated English with gold syntax), repeated-random, or a .txt/.conllu/.jsonl path",
    )
    p.add_argument("--max-sentences", type=_positive_int, default=None, help="use at most this many sentences")
    p.add_argument(
        "--max-length",
        type=_positive_int,
        default=128,
        help="word pieces per sequence incl. [CLS]/[SEP]; longer ones are truncated and counted (default 128)",
    )
    p.add_argument("--batch-size", type=_positive_int, default=32, help="sequences per forward pass (default 32)")
    p.add_argument("--seed", type=int, default=0, help="random seed for corpora, sampling and probes (default 0)")
    p.add_argument("--out", type=Path, default=out_default, help=f"output folder (default {out_default})")
    p.add_argument("--force", action="store_true", help="recompute even what is already finished")
    p.add_argument("--quiet", action="store_true", help="no progress bars or log lines")


def _options(args: argparse.Namespace) -> RunOptions:
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


def _summary(results: list[Any], broken: dict[str, str]) -> str:
    lines = []
    for r in results:
        took = "" if r.status == "skipped" else f" in {r.seconds:.1f} s"
        why = ""
        if r.status == "skipped":
            why = " (already complete with the same settings; --force recomputes)"
            if r.code_changed:
                why = " (complete with the same settings, but its code changed since: --force recomputes)"
        lines.append(f"  {r.name:<12} {r.status}{took}{why}  -> {r.out_dir}/")
    lines += [f"  {name:<12} import failed" for name in broken]
    return "experiments:\n" + "\n".join(lines) if lines else "experiments: none ran"


def _say(options: RunOptions, msg: str) -> None:
    if not options.quiet:
        print(msg, file=sys.stderr, flush=True)


def _fail(msg: str) -> int:
    print(f"bertscope: error: {' '.join(msg.split())}", file=sys.stderr)
    return EXIT_USAGE


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _size(text: str) -> int:
    from bertscope.experiments.io import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


if __name__ == "__main__":
    sys.exit(main())
