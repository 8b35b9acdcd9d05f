"""``bertscope.similarity``: what makes two texts similar, the public name of ``bertscope.hooks.similarity``.

>>> import bertscope
>>> from bertscope import similarity
>>> model = bertscope.load()
>>> r = similarity.attribute(model, "A man plays a guitar.", "Someone is playing music.")
>>> r.top(3), r.score, r.target, r.error

Everything here is ``bertscope.hooks.similarity``'s (``attribute``, ``embed``, ``pool``, ``score``, ``decompose``,
``shares``, the method table ``TABLE``); see ``docs/similarity.md``.
"""

from __future__ import annotations

from bertscope.hooks.similarity import *  # noqa: F403
from bertscope.hooks.similarity import __all__  # noqa: F401
