"""Dictionary architectures: one file each, registered in one table (:mod:`.table`).

``TABLE`` maps a name to its :class:`Architecture`; importing this package registers the built-in ones
(``relu``, ``topk``, ``batchtopk``, ``jumprelu``). A new architecture is one file calling ``register`` (see
``docs/dictionaries.md``, "Adding an architecture").
"""

from . import batchtopk, jumprelu, relu, topk  # noqa: F401 - registers the built-in architectures
from .table import KINDS, TABLE, Architecture, for_kind, from_saelens, get, names, register, unregister, with_k

#: the architecture a config gets when it names none (and ``sae train``'s ``--arch`` default)
DEFAULT = topk.TOPK.name

__all__ = ["DEFAULT", "KINDS", "TABLE", "Architecture", "for_kind", "from_saelens", "get", "names", "register",
           "unregister", "with_k"]
