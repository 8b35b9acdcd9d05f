"""Old name of ``bertscope.experiments.positions.steps_more`` (the template's role names,
docs/architecture.md): importing it gives that very module."""

import sys

from bertscope.experiments.positions import steps_more

sys.modules[__name__] = steps_more
