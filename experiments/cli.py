"""The ``bertscope`` command line.

    bertscope info [--model M] [--json]
    bertscope capture --hooks GLOB [--corpus C] [--out DIR] [--shard-size 256MB]
    bertscope run {same-token,heads,positions,all} [shared options]
    bertscope report [OUT]

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
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.handler(args)
    except UsageError as e:
        return _fail(str(e))
    except KeyboardInterrupt:
        print(
            "\nbertscope: interrupted; finished files are kept, rerun the same command to resume",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser with every subcommand (``--help`` works on each).

    Longer than 60 lines: a flat list of argparse declarations, one per option, read top to bottom like the
    ``--help`` output; splitting it would scatter the CLI's options across helpers.
    """
    parser = argparse.ArgumentParser(
        prog="bertscope",
        description="Mechanistic interpretability for BERT-family encoders: inspect, capture, experiment, report.",
        epilog="Quick start: bertscope run all && bertscope report results",
    )
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
        "within about one shard; an interrupted capture resumes where it stopped.",
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
    _add_shared_options(p, out_default=Path("results/capture"))
    p.set_defaults(handler=cmd_capture)

    p = sub.add_parser(
        "run",
        help="run an experiment (or all of them) and write tables, figures and manifests",
        description="Run an experiment, or all that are installed, writing OUT/<experiment>/results.parquet "
        "and .csv, figures (PNG and PDF) and manifest.json, then OUT/index.html. Finished experiments with "
        "the same settings are skipped unless --force.",
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
    p.set_defaults(handler=cmd_report)
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
    """``bertscope capture``: stream activations to shards."""
    from bertscope.experiments.capture import CaptureError, capture
    from bertscope.experiments.options import prepare_inputs
    from bertscope.experiments.runner import device_summary, package_versions

    options = _options(args)
    inputs = prepare_inputs(options)
    info = {
        "model": inputs.model_info,
        "corpus": inputs.corpus_info,
        "options": options.to_dict() | {"hooks": args.hooks, "shard_size": args.shard_size},
        "device": device_summary(inputs.device),
        "packages": package_versions(),
    }
    try:
        index = capture(
            inputs.model, inputs.corpus, args.hooks, options.out,
            max_length=options.max_length, batch_size=options.batch_size, shard_size=args.shard_size,
            force=options.force, quiet=options.quiet, info=info,
        )  # fmt: skip
    except CaptureError as e:
        raise UsageError(str(e)) from e
    n_bytes = sum(s["bytes"] for s in index["shards"])
    if index.get("n_truncated"):
        print(
            f"warning: {index['n_truncated']} sentences were longer than --max-length {options.max_length} "
            "and were truncated (see sentences.parquet, column truncated)",
            file=sys.stderr,
        )
    print(
        f"captured {len(index['hooks'])} hook(s), {index['n_rows']:,} token rows from {index['n_sentences']:,} "
        f"sentences into {len(index['shards'])} shard(s), {n_bytes / 1e6:,.1f} MB\n"
        f"index: {options.out / 'index.json'}"
    )
    return EXIT_OK


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

    try:
        page = build_report(args.out, embed_figures=not args.link_figures)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(str(e)) from e
    print(f"report: {page}")
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
