"""Names a package imports on first use (PEP 562), the one mechanism behind ``bertscope.hooks`` and
``bertscope.experiments.capture``: importing the package stays cheap (no analysis, no torch) until a name is asked
for.

    _LAZY = {"contributions": "bertscope.hooks.mixing"}   # name -> the module that defines it
    __getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY, submodules=("mixing",))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from importlib import import_module
from typing import Any


def lazy_names(package: str, namespace: dict[str, Any], names: Mapping[str, str],
               submodules: Iterable[str] = ()) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package`` (its ``globals()`` as ``namespace``):
    ``names`` maps a name to the module that defines it, ``submodules`` are ``package``'s own submodules reachable
    as attributes; each is imported when first asked for and then kept in ``namespace``."""
    submodules = tuple(submodules)

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(import_module(names[name]), name)
        elif name in submodules:
            value = import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names, *submodules})

    return __getattr__, __dir__
