"""``bertscope circuits``: the circuits analysis of a user's task file (pairs JSONL + a metric)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bertscope.experiments.options import UsageError

from .threads import add_threads_option

#: the default head-score methods; `ALL_HEAD_METHODS` = "exact" + `bertscope.hooks.circuits.attribution.METHODS`
#: (named here so that building the parser imports no torch; tests/test_circuits_cli.py checks they agree)
HEAD_METHODS = ("exact", "atp", "atp*", "eap-ig", "eap-ig-act")
ALL_HEAD_METHODS = (*HEAD_METHODS, "ig-act-own")
#: `bertscope.hooks.circuits.METRICS`, named here so that building the parser imports no torch
#: (tests/test_circuits_cli.py checks the two agree)
METRIC_NAMES = ("cosine", "dot", "mask-logit-diff")


def add_circuits(sub: Any) -> None:
    """The ``circuits`` subparser (built without importing torch, so that usage errors answer at once)."""
    p = sub.add_parser(
        "circuits",
        help="find the heads and the circuit behind your own counterfactual task (pairs JSONL + a metric)",
        description="Read counterfactual pairs (one JSON object a line: clean, corrupted, plus query for "
        "cosine/dot or answers [a, b] for mask-logit-diff; the two texts of a pair must tokenise to the same "
        "length), score every head by exact patching, AtP, AtP* and EAP-IG, score edges on the frozen-LayerNorm "
        "graph, find a circuit by greedy pruning with exact patching, and write its faithfulness curve with "
        "CPR/CMD against random circuits. Definitions: docs/experiments/circuits.md.",
    )
    p.add_argument("--task", type=Path, required=True, help="pairs JSONL file")
    p.add_argument("--metric", required=True, help=f"one of {', '.join(METRIC_NAMES)}")
    p.add_argument("--model", default=None, help="model folder or cached hub id; default: the bundled all-MiniLM-L6-v2")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda or cuda:N (default auto)")
    p.add_argument("--dtype", default="float32", help="float32 (default), float16, bfloat16 or float64")
    p.add_argument("--methods", default=",".join(HEAD_METHODS),
                   help=f"head-score methods, comma-separated, from {', '.join(ALL_HEAD_METHODS)} "
                   f"(default {','.join(HEAD_METHODS)})")
    p.add_argument("--edges", default="eap-ig", choices=("eap", "eap-ig"), help="edge method (default eap-ig)")
    p.add_argument("--steps", type=int, default=5, help="EAP-IG steps (default 5)")
    p.add_argument("--candidates", type=int, default=30, help="top edges the greedy search starts from (default 30)")
    p.add_argument("--threshold", type=float, default=0.02,
                   help="drop an edge when it moves the metric by less than this share of m(full) - m(empty)")
    p.add_argument("--n-random", type=int, default=3, help="random edge orders for the faithfulness control")
    p.add_argument("--batch-size", type=int, default=16, help="pairs per forward pass (default 16)")
    p.add_argument("--seed", type=int, default=0, help="seed for random controls and bootstraps (default 0)")
    p.add_argument("--out", type=Path, default=Path("circuits_out"), help="output folder (default circuits_out)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    add_threads_option(p)
    p.set_defaults(handler=cmd_circuits)


def cmd_circuits(args: argparse.Namespace) -> int:
    """Validate everything, then compute, then write the tables (nothing is written on bad input)."""
    import sys

    from bertscope.experiments import io
    from bertscope.experiments.circuits import measures
    from bertscope.experiments.options import load_model, resolve_device, resolve_dtype
    from bertscope.hooks.circuits import TaskError, load_task

    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    bad = [m for m in methods if m not in ALL_HEAD_METHODS]
    if bad or not methods:
        raise UsageError(f"--methods: unknown {bad or 'empty'}; choose from {', '.join(ALL_HEAD_METHODS)}")
    for name in ("steps", "candidates", "batch_size"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if args.n_random < 0 or not 0 <= args.threshold < 1:
        raise UsageError("--n-random must be >= 0 and --threshold in [0, 1)")
    if not args.task.is_file():
        raise UsageError(f"--task {args.task}: no such file")
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out {args.out} is a file, not a folder")
    from bertscope.experiments.jobs import set_thread_budget

    set_thread_budget(args.threads)
    model = load_model(args.model, device=resolve_device(args.device), dtype=resolve_dtype(args.dtype)).eval()
    try:
        task = load_task(model, args.task, args.metric)
    except TaskError as e:
        raise UsageError(str(e)) from e
    settings = measures.AnalysisSettings(methods=methods, ig_steps=args.steps, edge_method=args.edges,
                                         candidates=args.candidates, threshold=args.threshold,
                                         n_random=args.n_random, batch_size=args.batch_size)
    say = (lambda msg: None) if args.quiet else (lambda msg: print(f"[circuits] {msg}", file=sys.stderr, flush=True))
    tables = measures.analyse(model, task, settings, progress=say, seed=args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, df in tables.items():
        io.write_table(df, args.out / name, formats=("csv",))
    c = tables["circuit"]
    f = float(c.faithfulness.iloc[0]) if len(c) else float("nan")
    print(f"circuits: {args.out}  ({task.n_pairs} pairs; circuit of {len(c)} edges, faithfulness {f:.2f})")
    return 0
