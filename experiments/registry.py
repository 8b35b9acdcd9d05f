"""The experiments: what one provides (:class:`Experiment`) and the one registry the CLI, ``run all`` and the
report read (:data:`EXPERIMENTS`). Adding an experiment = a package under ``experiments/`` whose ``__init__``
satisfies :class:`Experiment`, one line here, and one line in pyproject.toml's ``packages``.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

#: CLI name -> package, in the order ``run all`` runs them (cheapest first).
EXPERIMENTS: dict[str, str] = {
    "same-token": "bertscope.experiments.same_token",
    "heads": "bertscope.experiments.heads",
    "positions": "bertscope.experiments.positions",
    "structure": "bertscope.experiments.structure",
}


@runtime_checkable
class Experiment(Protocol):
    """What an experiment package exposes in its ``__init__``.

    ``NAME``: CLI name; ``DIRNAME``: output folder under ``OUT``; ``SUMMARY_TABLES``: file names the report
    shows; ``Settings``: a frozen dataclass of the experiment's defaults (part of the step-cache key);
    ``run(ctx, settings=None)``: computes everything, writes side tables with ``ctx.write_table`` and returns
    the main long table; ``plot(out_dir)``: redraws the figures from the saved tables only.
    """

    NAME: str
    DIRNAME: str
    SUMMARY_TABLES: Sequence[str]
    Settings: type

    def run(self, ctx: Any, settings: Any = None) -> Any:  # pragma: no cover - protocol
        """Compute the experiment; returns the main long table (a pandas DataFrame)."""
        ...

    def plot(self, out_dir: Path) -> list[Path]:  # pragma: no cover - protocol
        """Draw the figures from the tables in ``out_dir``; returns the written paths."""
        ...


def load_experiment(name: str) -> Experiment:
    """Import the experiment registered as ``name``; unknown names raise `UsageError`."""
    from bertscope.experiments.options import UsageError

    if name not in EXPERIMENTS:
        raise UsageError(f"unknown experiment {name!r}; choose one of {', '.join([*EXPERIMENTS, 'all'])}")
    module = importlib.import_module(EXPERIMENTS[name])
    check_experiment(module)
    return module  # type: ignore[return-value]


def check_experiment(module: Any) -> None:
    """Raise ``TypeError`` naming what an experiment package lacks (see :class:`Experiment`)."""
    missing = [a for a in ("NAME", "DIRNAME", "SUMMARY_TABLES", "Settings", "run", "plot") if not hasattr(module, a)]
    if missing:
        raise TypeError(f"experiment {getattr(module, '__name__', module)} lacks {', '.join(missing)}")


def code_sha256(module: Any) -> str | None:
    """sha256 over the experiment package's source files (every ``*.py`` in its folder, by name), so a cached
    step or a skipped rerun can tell the code changed; ``None`` for modules without a file."""
    import hashlib

    file = getattr(module, "__file__", None)
    if not file:
        return None
    path = Path(file)
    files = sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(path.parent).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()
