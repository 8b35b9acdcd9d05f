"""``python -m bertscope.experiments.capture ARGS`` and ``torchrun ... -m bertscope.experiments.capture ARGS``:
the options of ``bertscope capture`` (the command line, above the capture package, parses them)."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """``bertscope capture ARGS`` by another name (``ARGS`` default: this process's arguments)."""
    from bertscope.experiments import cli

    return cli.main(["capture", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
