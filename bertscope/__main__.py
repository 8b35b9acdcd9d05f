"""``python -m bertscope``: the ``bertscope`` command line."""

import sys

from bertscope.experiments.cli import main

if __name__ == "__main__":  # not when a spawned worker process re-imports the main module
    sys.exit(main())
