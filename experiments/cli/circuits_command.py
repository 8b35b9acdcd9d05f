"""``bertscope circuits``: the old name of ``bertscope run circuits --task FILE`` (kept as an alias).

It says so in one line, then runs exactly that command: the same settings class, defaults, checks, runner and
manifest (``OUT/circuits/``). Its options map onto ``run``'s: ``--methods`` -> ``--set circuits.methods``,
``--edges`` -> ``circuits.edge_method``, ``--steps`` -> ``circuits.ig_steps``, ``--candidates``, ``--threshold``,
``--n-random`` -> the settings of the same names; an option left out takes the one default
(``bertscope.hooks.circuits.table.DEFAULTS``, through the experiment's ``Settings``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .threads import add_threads_option

#: `bertscope.hooks.circuits.METRICS`, named here so that building the parser imports no torch
#: (tests/cli/test_circuits_cli.py checks the two agree)
METRIC_NAMES = ("cosine", "dot", "mask-logit-diff")

#: old option (argparse dest) -> the circuits setting it sets
SETTING_OF = {"methods": "methods", "edges": "edge_method", "steps": "ig_steps", "candidates": "candidates",
              "threshold": "threshold", "n_random": "n_random"}


def __getattr__(name: str) -> Any:
    """Old names, read from the node table when asked for: ``HEAD_METHODS`` (the default head methods) and
    ``ALL_HEAD_METHODS`` (every registered node method)."""
    if name not in ("HEAD_METHODS", "ALL_HEAD_METHODS"):  # (import machinery asks for others: no torch for them)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from bertscope.hooks.circuits import table

    return table.node_methods(default=True) if name == "HEAD_METHODS" else table.node_methods()


def _method_help(argv: Sequence[str] | None) -> tuple[str, str]:
    """``--methods`` and ``--edges`` help: the tables' names when the command line asks for ``circuits`` (reading
    the tables imports torch, which other commands' usage errors must not wait for)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "circuits" not in argv:
        return "head-score methods, comma-separated", "edge method"
    from bertscope.hooks.circuits import table

    return (f"head-score methods, comma-separated, from {', '.join(table.node_methods())} (default "
            f"{','.join(table.node_methods(default=True))})",
            f"edge method: {', '.join(table.edge_methods())} (default {table.DEFAULTS.edge_method})")


def add_circuits(sub: Any, argv: Sequence[str] | None = None,
                 run: Callable[[list[str]], int] | None = None) -> None:
    """The ``circuits`` subparser (the alias of ``run circuits --task FILE``; ``run(argv)`` runs a ``bertscope``
    command line, given by the parser's builder so that this module imports no other CLI module)."""
    p = sub.add_parser(
        "circuits",
        help="alias of `bertscope run circuits --task FILE --metric M` (your own counterfactual task)",
        description="The old name of `bertscope run circuits --task FILE --metric M` (it says so, then runs that, "
        "writing OUT/circuits/ with its manifest). Reads counterfactual pairs (one JSON object a line: clean, "
        "corrupted, plus query for cosine/dot or answers [a, b] for mask-logit-diff; the two texts of a pair must "
        "tokenise to the same length; at least 2 pairs), scores every head by exact patching and the node "
        "attribution methods, scores edges on the frozen-LayerNorm graph, finds a circuit by greedy pruning with "
        "exact patching and writes its faithfulness curve with CPR/CMD against random circuits. Definitions: "
        "docs/experiments/circuits.md.",
    )
    methods_help, edges_help = _method_help(argv)
    p.add_argument("--task", type=Path, required=True, help="pairs JSONL file")
    p.add_argument("--metric", required=True, help=f"one of {', '.join(METRIC_NAMES)}")
    p.add_argument("--model", default=None, help="model folder or cached hub id; default: the bundled all-MiniLM-L6-v2")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda or cuda:N (default auto)")
    p.add_argument("--dtype", default="float32", help="float32 (default), float16, bfloat16 or float64")
    p.add_argument("--methods", default=None, help=f"{methods_help} (= --set circuits.methods)")
    p.add_argument("--edges", default=None, help=f"{edges_help} (= --set circuits.edge_method)")
    p.add_argument("--steps", default=None, help="integrated-gradient steps (= --set circuits.ig_steps)")
    p.add_argument("--candidates", default=None, help="top edges the greedy search starts from "
                   "(= --set circuits.candidates)")
    p.add_argument("--threshold", default=None, help="drop an edge when it moves the metric by less than this share "
                   "of m(full) - m(empty) (= --set circuits.threshold)")
    p.add_argument("--n-random", default=None, help="random edge orders for the faithfulness control "
                   "(= --set circuits.n_random)")
    p.add_argument("--batch-size", default=None, help="pairs per forward pass (default: `run`'s, 32)")
    p.add_argument("--seed", default=None, help="seed for random controls and bootstraps (default 0)")
    p.add_argument("--out", type=Path, default=Path("circuits_out"),
                   help="output folder; the tables go to OUT/circuits/ (default circuits_out)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    add_threads_option(p)
    p.set_defaults(handler=lambda args: cmd_circuits(args, run))


def run_argv(args: argparse.Namespace) -> list[str]:
    """The ``bertscope run circuits`` arguments that do what ``args`` (``bertscope circuits``'s) ask."""
    argv = ["run", "circuits", "--task", str(args.task), "--metric", args.metric, "--device", args.device,
            "--dtype", args.dtype, "--out", str(args.out), "--no-report"]
    for flag in ("model", "batch_size", "seed", "threads"):
        value = getattr(args, flag)
        argv += [f"--{flag.replace('_', '-')}", str(value)] if value is not None else []
    argv += ["--quiet"] if args.quiet else []
    for dest, setting in SETTING_OF.items():
        value = getattr(args, dest)
        if value is not None:
            argv += ["--set", f"circuits.{setting}={value}"]
    return argv


def cmd_circuits(args: argparse.Namespace, run: Callable[[list[str]], int] | None) -> int:
    """Say that the command is now ``bertscope run circuits --task FILE``, then run that (``run(argv)``)."""
    argv = run_argv(args)
    print(f"bertscope circuits is now `bertscope {' '.join(argv[:6])} ...`; running it (tables in "
          f"{args.out / 'circuits'})", flush=True)
    if run is None:
        raise RuntimeError("add_circuits was built without a way to run `bertscope run`")
    return run(argv)
