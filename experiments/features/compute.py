"""Old name of ``bertscope.experiments.features.steps`` (the template's role names, docs/architecture.md): importing
it gives that very module."""

import sys

from bertscope.experiments.features import steps

sys.modules[__name__] = steps
