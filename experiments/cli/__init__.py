"""The ``bertscope`` command line.

    bertscope info [--model M] [--json]
    bertscope capture --hooks GLOB [--corpus C] [--out DIR] [--shard-size auto] [--nproc N]
    bertscope run {same-token,heads,positions,all} [shared options]
    bertscope report [OUT] [--explore N | --explore-ids I,J | --no-explore] [--model M] [--mixing METHODS]
    bertscope explore "text" ["another text" ...] [--model M] [--mixing alti,attention_norm] [--out explore.html]

Bad input (unknown model or corpus, unavailable device, unsupported dtype, a hook glob that matches
nothing) prints one ``bertscope: error: ...`` line and exits with status 2; Ctrl-C exits with 130 and
keeps every finished file, so rerunning the same command resumes.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from bertscope.experiments.capture.allocator import keep_freed_memory
from bertscope.experiments.options import UsageError

from .commands import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, group_hook_names
from .parser import build_parser

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "UsageError", "build_parser",
           "group_hook_names", "main"]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``bertscope`` console script; returns the exit status."""
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    keep_freed_memory()  # glibc keeps freed pages: captures reuse them (experiments/capture/allocator.py)
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


def _fail(msg: str) -> int:
    print(f"bertscope: error: {' '.join(msg.split())}", file=sys.stderr)
    return EXIT_USAGE

