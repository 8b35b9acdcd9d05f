"""Old name of ``bertscope.experiments.structure.steps`` (the template's role names, docs/architecture.md): importing it
gives that very module."""

import sys

from bertscope.experiments.structure import steps

sys.modules[__name__] = steps
