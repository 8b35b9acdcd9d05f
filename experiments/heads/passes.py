"""Old name of ``bertscope.experiments.heads.data`` (the template's role names, docs/architecture.md): importing it
gives that very module."""

import sys

from bertscope.experiments.heads import data

sys.modules[__name__] = data
