"""``python -m bertscope``: the ``bertscope`` command line."""

import sys

from bertscope.experiments.cli import main

sys.exit(main())
