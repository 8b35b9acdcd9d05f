"""Old path of ``bertscope.hooks.mixing.inputs`` (an alias kept for code written before the move): importing it gives
that very module."""

import sys

from bertscope.hooks.mixing import inputs

sys.modules[__name__] = inputs
