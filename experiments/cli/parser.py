"""The ``bertscope`` argument parser: one function per subcommand, the option groups they share, and the
argument types (positive integers, byte sizes)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bertscope.experiments.registry import EXPERIMENTS

from .circuits_command import add_circuits
from .commands import cmd_capture, cmd_clean, cmd_explore, cmd_info, cmd_report, cmd_run, cmd_sae
from .threads import add_threads_option
from .threads import positive_int as _positive_int


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The argparse parser with every subcommand (``--help`` works on each; ``run NAME --help`` describes
    experiment NAME, so ``argv`` is looked at for that name).
    """
    parser = argparse.ArgumentParser(
        prog="bertscope",
        description="Mechanistic interpretability for BERT-family encoders: inspect, capture, experiment, report.",
        epilog="Quick start: bertscope run all && bertscope report results",
    )
    parser.add_argument("--version", action="version", version=f"bertscope {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_info(sub)
    _add_capture(sub)
    _add_run(sub, argv)
    _add_report(sub)
    _add_explore(sub)
    _add_clean(sub)
    add_circuits(sub, argv, run=_run_argv)
    _add_sae(sub, argv)
    return parser


def _run_argv(argv: list[str]) -> int:
    """Run the ``bertscope`` command line ``argv`` with its handler (what an alias such as ``circuits`` runs;
    `UsageError` propagates to ``main``)."""
    args = build_parser(argv).parse_args(argv)
    return args.handler(args)


def _add_clean(sub: Any) -> None:
    """``bertscope clean``: delete the step caches under a results folder."""
    p = sub.add_parser(
        "clean",
        help="delete the step caches (OUT/<experiment>/steps/) and half-written files under a results folder",
        description="Delete OUT/<experiment>/steps/ (intermediate results an interrupted run resumes from; a "
        "complete run never reads them again) and half-written *.partial files. Tables, figures, manifests and "
        "the report stay. Experiments still running (manifest status running) are left alone.",
    )
    p.add_argument("out", nargs="?", type=Path, default=Path("results"), help="results folder (default results)")
    p.add_argument("--dry-run", action="store_true", help="only say what would be deleted")
    p.set_defaults(handler=cmd_clean)


def _add_info(sub: Any) -> None:
    """``bertscope info``: describe a model."""
    p = sub.add_parser(
        "info",
        help="describe a model: sizes, parameters, weights' source and sha256, hook names",
        description="Describe a model: layers, heads, sizes, parameter count, weights' source and sha256, "
        "and every hook-point name.",
    )
    _add_model_options(p)
    p.add_argument("--json", action="store_true", help="print everything as JSON (all hook names listed)")
    p.set_defaults(handler=cmd_info)


def _add_capture(sub: Any) -> None:
    """``bertscope capture``: stream activations to shards."""
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
        default=None,
        help="hook names or globs, comma-separated, e.g. 'blocks.*.hook_resid_post,blocks.0.attn.hook_pattern' "
        "(see `bertscope info`); required unless --for",
    )
    p.add_argument(
        "--for",
        dest="for_experiment",
        choices=("positions",),
        default=None,
        help="capture what this experiment reads instead of the corpus's sentences: positions' windows cut "
        "across sentences, their shuffled copies and its other sequence sets at every site it probes, with the "
        "window plan in the index (same --model, --corpus, --seed, --max-sentences, --max-length and --set as "
        "the run; then `bertscope run positions --activations OUT`)",
    )
    p.add_argument("--set", action="append", default=[], metavar="NAME.FIELD=VALUE",
                   help="with --for: one of that experiment's settings, as `bertscope run` takes it (it decides "
                   "the windows, e.g. --set positions.window_len=16)")  # fmt: skip
    p.add_argument(
        "--shard-size",
        default=None,
        type=_shard_size,
        help="bytes per shard, e.g. 64MB, 1GiB; bounds memory use (default auto: about 64 shards of 32MiB to "
        "256MiB, from the capture's size alone, so several processes have shards to share)",
    )
    p.add_argument(
        "--nproc",
        type=_positive_int,
        default=None,
        help="split the corpus over N local processes launched with torchrun (same bytes as one process); "
        "for several machines run torchrun -m bertscope.experiments.capture yourself (docs/capture.md)",
    )
    _add_shared_options(p, out_default=Path("results/capture"))
    p.set_defaults(handler=run_capture)


def _add_run(sub: Any, argv: Sequence[str] | None) -> None:
    """``bertscope run NAME``: run experiments (``run NAME --help`` describes NAME, looked up in ``argv``)."""
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
    p.add_argument("--keep-steps", choices=("yes", "no"), default="no",
                   help="keep OUT/<experiment>/steps/ (the cache an interrupted run resumes from) after the "
                   "experiment completes (default no: deleted then, since a complete run never reads it again)")
    p.add_argument("--set", action="append", default=[], metavar="NAME.FIELD=VALUE",
                   help="change one of an experiment's settings, e.g. --set heads.syntax_min_arcs=5 (repeat for "
                   "more; typed and checked; part of the manifest and of what a rerun must match). "
                   "`bertscope run NAME --help` lists NAME's settings with defaults and meanings")  # fmt: skip
    _add_run_options(p)
    p.add_argument(
        "--activations",
        type=Path,
        default=None,
        metavar="DIR",
        help="read the activations from this `bertscope capture` folder instead of running the forward (it must "
        "hold the sites the experiment reads, the run's sentences, model, dtype and --max-length); experiments "
        "whose forward a capture cannot replace refuse it (run all: they run the model and say so)",
    )
    if chosen and {"-h", "--help"} & set(argv):  # only for help: it imports the experiment (and torch)
        p.epilog = _settings_epilog(chosen)
    p.set_defaults(handler=cmd_run)


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """One group for the experiment-specific options (`registry.RUN_OPTIONS`): each is one experiment's
    ``--set NAME.FIELD=VALUE`` under a name (merged into ``--set`` by `commands.options_from_args`)."""
    from bertscope.experiments.registry import RUN_OPTIONS, run_option_dest

    group = p.add_argument_group("experiment options", "shorthands for one experiment's --set NAME.FIELD=VALUE "
                                 "(the same setting; with `run all` they apply to that experiment)")
    for flag, (_, _, metavar, text) in RUN_OPTIONS.items():
        group.add_argument(flag, dest=run_option_dest(flag), default=None, metavar=metavar,
                           type=_count if metavar == "N" else str, help=text)


def _settings_epilog(name: str) -> str | None:
    """``run NAME --help``'s list of NAME's settings (None when the experiment does not import)."""
    from bertscope.experiments.registry import load_experiment
    from bertscope.experiments.settings import settings_help

    try:
        module = load_experiment(name)
    except Exception as e:  # a broken experiment still gets its --help, saying why its settings are missing
        return f"settings of {name}: unavailable ({type(e).__name__}: {e})"
    return settings_help(name, type(module.Settings()))


def _add_report(sub: Any) -> None:
    """``bertscope report``: write the offline page."""
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


def _add_explore(sub: Any) -> None:
    """``bertscope explore``: write an explorer page for given texts."""
    p = sub.add_parser(
        "explore",
        help="write one offline HTML page with interactive attention (and mixing) views of your sentences",
        description="Run the model on each TEXT and write an interactive page (head view, model view, "
        "query-key view; context-mixing methods in a menu with --mixing; tokens coloured by a dictionary's latent "
        "with --dictionary DIR --latent N): one self-contained HTML file.",
    )
    p.add_argument("texts", nargs="+", metavar="TEXT", help="one or more sentences (quote each)")
    _add_model_options(p)
    p.add_argument("--max-length", type=_int, default=128,
                   help="word pieces per text incl. [CLS]/[SEP]; a longer text is an error (default 128)")  # fmt: skip
    p.add_argument("--mixing", default=None, metavar="METHODS",
                   help="context-mixing methods for the menu, comma-separated, e.g. alti,attention_norm")  # fmt: skip
    p.add_argument("--dictionary", type=Path, default=None, metavar="DIR",
                   help="a saved sparse dictionary (`bertscope sae train` output, or OUT/features/dictionaries/<site> "
                   "of `bertscope run features`): with --latent, colour each token by a latent's activation at the "
                   "dictionary's site")  # fmt: skip
    p.add_argument("--latent", default=None, metavar="N[,M...]",
                   help="the dictionary's latent(s) to colour tokens by, e.g. 17 or 17,302")  # fmt: skip
    p.add_argument("--out", type=Path, default=Path("explore.html"), help="HTML file to write (default explore.html)")
    p.set_defaults(handler=cmd_explore)


def _add_sae(sub: Any, argv: Sequence[str] | None = None) -> None:
    """``bertscope sae train|eval``: sparse dictionaries (docs/dictionaries.md). The ``--arch`` choices and their
    help are the dictionary architecture table's, read when ``argv`` asks for ``sae`` (the table's built-in
    entries import torch, which no other command's usage errors wait for)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    table = _dictionary_architectures() if "sae" in argv else None
    recipe = _dictionary_recipe() if "sae" in argv else _NO_RECIPE
    p = sub.add_parser("sae", help="train and evaluate sparse dictionaries (SAEs, transcoders) on a model's sites",
                       description="Sparse autoencoders and transcoders: `sae train` streams activations from a "
                       "corpus (or a capture) into dictionaries saved in SAELens's format; `sae eval` scores them "
                       "on held-out sentences, per token class and spliced into the model.")
    inner = p.add_subparsers(dest="sae_command", metavar="ACTION", required=True)
    t = inner.add_parser(
        "train", help="train dictionaries at one or more sites",
        description="Stream the model's activations at each --site over --corpus (or a `bertscope capture` folder "
        "with --activations) into one sparse dictionary per site, saved in SAELens's format under OUT/<site>/ "
        "with each latent's top activating contexts and quantile samples (OUT/<site>/latent_contexts.parquet), "
        "PCA and neuron-basis controls at the same L0 (OUT/controls/), OUT/training.json and "
        "OUT/manifest.json. Every option is checked before the model loads; a finished OUT with the same settings "
        "is left as it is, one with other settings needs --force; an interrupted run resumes from its checkpoint. "
        "Training runs in whole --train-batch batches (docs/dictionaries.md).",
        epilog="Example: bertscope sae train --site blocks.3.hook_resid_post --arch topk --k 32 --width 8x "
        "--tokens 2M --corpus en_ewt-ud-train.conllu --out results/sae")
    t.add_argument("--site", action="append", required=True, help="hook name to read (repeat for several)")
    t.add_argument("--site-out", default=None,
                   help="transcoders: the hook to predict (default: the --site block's hook_mlp_out; "
                   "--site blocks.3 reads that block's MLP input)")
    t.add_argument("--kind", choices=["sae", "transcoder", "skip_transcoder"], default="sae",
                   help="sae (reads and predicts one site), transcoder or skip_transcoder (predicts --site-out)")
    t.add_argument("--arch", choices=None if table is None else list(table.names()),
                   default=None if table is None else table.DEFAULT,
                   help="the dictionary architecture" if table is None else
                   "; ".join(f"{a.name}: {a.summary}" for a in table.TABLE.values()) + f" (default {table.DEFAULT})")
    with_k = "" if table is None else f": {', '.join(table.with_k())}"
    t.add_argument("--k", type=_positive_int, default=recipe.k,
                   help=f"active latents per token (architectures that take k{with_k}; default {recipe.k})")
    t.add_argument("--width", default=recipe.width, help="latents: a multiple of the site's width (8x) or a number "
                   f"(default {recipe.width})")
    t.add_argument("--tokens", type=_count, default=recipe.tokens,
                   help=f"training tokens, e.g. 2M (default {recipe.tokens:,})")
    t.add_argument("--activations", default=None, metavar="DIR", help="read a `bertscope capture` folder "
                   "instead of running the model (its corpus is --corpus)")
    t.add_argument("--include-special", action="store_true", help="train on [CLS]/[SEP]-like tokens too")
    t.add_argument("--train-batch", type=_positive_int, default=recipe.batch_size,
                   help=f"tokens per step (default {recipe.batch_size}, the recipe chosen on held-out data: "
                   "docs/dictionaries.md)")
    t.add_argument("--buffer", type=_count, default=262_144, help="buffer rows (bounds memory; a corpus that fits "
                   "is computed once and reshuffled every epoch; default 262144)")
    t.add_argument("--lr", type=float, default=recipe.lr, help=f"Adam learning rate (default {recipe.lr:g})")
    t.add_argument("--l1", type=float, default=5.0, help="L1 coefficient of an L1-penalised architecture (relu; "
                   ">= 0, default 5)")
    t.add_argument("--l0", type=float, default=1e-3, help="L0 coefficient of a thresholded architecture (jumprelu; "
                   ">= 0, default 1e-3)")
    t.add_argument("--auxk", choices=["saelens", "gao"], default="saelens",
                   help="AuxK convention for dead TopK/BatchTopK latents: saelens (SAELens's, default) or gao "
                   "(openai/sparse_autoencoder's: 256 dead latents, normalised MSE; its coefficient is 1/32, "
                   "set with --aux-coefficient)")
    t.add_argument("--aux-coefficient", type=float, default=1.0, help="AuxK coefficient (>= 0, default 1.0)")
    t.add_argument("--checkpoint-every", type=_count, default=500_000, help="tokens between checkpoints")
    t.add_argument("--no-controls", action="store_true", help="skip the PCA / neuron-basis controls")
    t.add_argument("--e2e-steps", type=_positive_int, default=None, metavar="N",
                   help="then fine-tune each SAE end to end for N steps against the model's own objective (sentence "
                   "embedding, or MLM KL with a masked-LM head) on the same training sentences (docs/dictionaries.md)")
    t.add_argument("--e2e-lambda", type=float, default=None, metavar="X",
                   help="weight of the site's normalised MSE (FVU) in the end-to-end loss (default 0.01)")
    t.add_argument("--e2e-lr", type=float, default=None, help="Adam learning rate of the fine-tune (default 1e-4)")
    _add_shared_options(t, out_default=Path("results/sae"))
    t.set_defaults(handler=cmd_sae)
    e = inner.add_parser(
        "eval", help="evaluate dictionaries on held-out sentences",
        description="Score every dictionary under FOLDER (a dictionary folder, or a `sae train` output with its "
        "controls) on --eval-corpus (else --corpus): reconstruction per token class, and the model's own "
        "objective with each dictionary spliced in against zero- and mean-ablation. Writes OUT/evaluation.parquet "
        "(+ .csv), OUT/summary.csv and OUT/manifest.json; says when the sentences are the ones the dictionaries "
        "were trained on (in-sample). A dictionary of another model (width or weights) is refused in one line.",
        epilog="Example: bertscope sae eval results/sae --eval-corpus en_ewt-ud-dev.conllu --out results/sae-eval")
    e.add_argument("folder", type=Path, help="a dictionary folder, or a `sae train` output folder")
    e.add_argument("--objective", choices=["auto", "sentence", "mlm"], default="auto",
                   help="spliced-in objective (auto: mlm with a masked-LM head, else sentence embeddings)")
    e.add_argument("--include-special", action="store_true", help="score and splice special tokens too")
    _add_shared_options(e, out_default=Path("results/sae-eval"))
    e.set_defaults(handler=cmd_sae)


class _NoRecipe:
    """Placeholder defaults for the ``sae`` parser when the command line is another command's (never used)."""

    k, width, tokens, batch_size, lr = None, None, 0, None, 0.0


_NO_RECIPE = _NoRecipe()


def _dictionary_recipe() -> Any:
    """``bertscope.probes.dictionary.RECIPE``: the defaults of ``sae train`` (read only when ``argv`` asks for
    ``sae``, as the architecture table is)."""
    from bertscope.probes.dictionary import RECIPE

    return RECIPE


def _dictionary_architectures() -> Any:
    """``bertscope.probes.dictionary.architectures`` (the table, with its built-in entries registered)."""
    from bertscope.probes.dictionary import architectures

    return architectures


def _count(text: str) -> int:
    """A count with an optional k / M / G suffix (``2M`` = 2,000,000)."""
    scale = {"k": 10**3, "m": 10**6, "g": 10**9}
    t = text.strip().lower()
    try:
        value = int(float(t[:-1]) * scale[t[-1]]) if t and t[-1] in scale else int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (e.g. 500000, 500k, 2M)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("bertscope")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


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



def _add_shared_options(p: argparse.ArgumentParser, out_default: Path) -> None:
    _add_model_options(p)
    p.add_argument(
        "--corpus",
        default="builtin",
        help="builtin (default; generated English with gold syntax), repeated-random, or a .txt/.conllu/.jsonl path",
    )
    p.add_argument(
        "--eval-corpus",
        default=None,
        help="report on this corpus (e.g. a .conllu dev split) while training and every selection use --corpus; "
        "experiments that support it (erasure, structure, heads, positions) say which split each number comes from",
    )
    p.add_argument(
        "--max-sentences",
        type=_positive_int,
        default=None,
        help="use the first N sentences of the corpus (a cap: all of them if it has fewer); without it each "
        "experiment uses its own default size (its Settings.max_sentences); each prints the number it used",
    )
    p.add_argument(
        "--max-length",
        type=_int,  # its one lower bound is the model's (options.check_max_length)
        default=128,
        help="word pieces per sequence incl. [CLS]/[SEP]; longer ones are truncated and counted (default 128)",
    )
    p.add_argument("--batch-size", type=_positive_int, default=32, help="sequences per forward pass (default 32)")
    p.add_argument("--seed", type=int, default=0, help="random seed for corpora, sampling and probes (default 0)")
    p.add_argument("--out", type=Path, default=out_default, help=f"output folder (default {out_default})")
    p.add_argument("--force", action="store_true", help="recompute even what is already finished")
    p.add_argument("--quiet", action="store_true", help="no progress bars or log lines")
    add_threads_option(p)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None




def _shard_size(text: str) -> int | None:
    """``--shard-size``: a size, or ``auto`` (``None``: the capture picks one)."""
    return None if text.strip().lower() == "auto" else _size(text)


def _size(text: str) -> int:
    from bertscope.experiments.io import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def worker_argv(args: argparse.Namespace) -> list[str]:
    """The ``bertscope capture`` arguments that reproduce ``args``, less the launcher's own (``--nproc``): what
    ``--nproc``'s workers are started with."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["capture"]
    argv: list[str] = []
    for action in sub._actions:
        flag = next((o for o in action.option_strings if o.startswith("--")), None)
        if flag is None or action.dest in ("help", "nproc"):
            continue
        value = getattr(args, action.dest, None)
        if action.dest == "threads" and value is not None and getattr(args, "nproc", None):
            value = max(1, value // args.nproc)  # --threads is the whole run's: each process gets its share
        if isinstance(action, argparse._StoreTrueAction):
            argv += [flag] if value else []
        elif isinstance(value, list):
            argv += [x for item in value for x in (flag, str(item))]
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def run_capture(args: argparse.Namespace) -> int:
    """The ``capture`` subcommand's handler: ``cmd_capture`` with the arguments its ``--nproc`` workers get."""
    return cmd_capture(args, worker_argv(args))
