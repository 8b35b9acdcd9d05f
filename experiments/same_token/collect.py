"""Old name of ``bertscope.experiments.same_token.data`` (the template's role names, docs/architecture.md): importing it
gives that very module."""

import sys

from bertscope.experiments.same_token import data

sys.modules[__name__] = data
