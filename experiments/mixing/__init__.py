"""Experiment `mixing` (see :mod:`bertscope.experiments.mixing.experiment` for what it measures and writes).

The package exposes what :class:`bertscope.experiments.registry.Experiment` asks for, plus ``CAPTIONS`` (figure
stem -> caption) and ``findings(out_dir)`` for the report; files by role: ``experiment`` (Settings, run: the
one place that sees the run context), ``measures`` (per-sentence statistics and the group bootstrap),
``plots`` (figures from the tables), ``findings`` (sentences from the saved table).
"""

from bertscope.experiments.mixing.experiment import DIRNAME, NAME, SUMMARY_TABLES, Settings, run
from bertscope.experiments.mixing.experiment import activation_sites as activation_sites
from bertscope.experiments.mixing.findings import CAPTIONS, findings
from bertscope.experiments.mixing.plots import plot

__all__ = ["CAPTIONS", "DIRNAME", "NAME", "SUMMARY_TABLES", "Settings", "findings", "plot", "run"]
