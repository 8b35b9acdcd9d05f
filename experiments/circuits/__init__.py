"""Experiment `circuits` (see :mod:`bertscope.experiments.circuits.experiment` for what it measures and writes).

Files by role: ``experiment`` (Settings, run: the one place that sees the run context), ``data`` (the TFC1 pairs
from the corpus, the injected positions), ``measures`` (the analysis of any task as tables, shared with
``bertscope circuits``), ``plots``, ``findings``.
"""

from bertscope.experiments.circuits.experiment import (
    DIRNAME,
    NAME,
    NO_ACTIVATIONS,
    SUMMARY_TABLES,
    Settings,
    check,
    run,
)
from bertscope.experiments.circuits.findings import CAPTIONS, findings
from bertscope.experiments.circuits.plots import plot

__all__ = ["CAPTIONS", "DIRNAME", "NAME", "NO_ACTIVATIONS", "SUMMARY_TABLES", "Settings", "check", "findings", "plot",
           "run"]
