"""``python -m bertscope.experiments.capture ARGS`` and ``torchrun ... -m bertscope.experiments.capture ARGS``:
the options of ``bertscope capture``."""

import sys

from .command import main

sys.exit(main())
