"""Old name of ``bertscope.experiments.positions.steps`` (the template's role names, docs/architecture.md): importing it
gives that very module."""

import sys

from bertscope.experiments.positions import steps

sys.modules[__name__] = steps
