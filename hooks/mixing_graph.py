"""Old path of ``bertscope.hooks.mixing.graph`` (an alias kept for code written before the move): importing it gives
that very module."""

import sys

from bertscope.hooks.mixing import graph

sys.modules[__name__] = graph
