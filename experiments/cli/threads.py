"""``--threads N``, the CPU threads of a whole run (one definition for every command that computes; kept apart
from ``parser`` so that ``circuits_command``, which ``parser`` imports, can add it too)."""

from __future__ import annotations

import argparse


def add_threads_option(p: argparse.ArgumentParser) -> None:
    """``--threads N``: this process's torch threads, shared out among any worker processes
    (`experiments.jobs.worker_threads`); set once by `experiments.jobs.set_thread_budget`."""
    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="CPU threads for the whole run: torch's in this process, divided among the worker processes "
                   "an experiment starts (default: OMP_NUM_THREADS if set, else every core this process may use; on "
                   "a machine busy with other work, fewer, e.g. 1, is faster); recorded in the manifest")


def positive_int(text: str) -> int:
    """An argparse ``type``: an integer >= 1 (``--threads``, ``--batch-size``, ...)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value
