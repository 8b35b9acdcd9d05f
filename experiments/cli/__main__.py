"""``python -m bertscope.experiments.cli ARGS``: the ``bertscope`` command."""

import sys

from . import main

sys.exit(main())
