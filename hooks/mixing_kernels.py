"""Old path of ``bertscope.hooks.mixing.kernels`` (an alias kept for code written before the move): importing it gives
that very module."""

import sys

from bertscope.hooks.mixing import kernels

sys.modules[__name__] = kernels
