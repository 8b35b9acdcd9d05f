"""Experiment `same_token` (see :mod:`bertscope.experiments.same_token.experiment` for what it measures and writes).

The package exposes what :class:`bertscope.experiments.registry.Experiment` asks for; files by role: ``experiment``
(Settings, run: the one place that sees the run context), ``data`` (the model pass and the long table; old name
``collect``), ``measures`` (tallies and summaries of the per-query metrics), ``balance`` (type-balanced duplicate
mass), ``control`` (repeated-random's non-repeating control, copy-specific mass), ``held_out`` (top heads chosen
held-out), ``weights`` (the context-free W_QK view), ``examples`` (example maps), ``plots`` (figures from the
tables), ``findings`` (the report's sentences and captions, from the tables).
"""

from bertscope.experiments.same_token.experiment import DIRNAME, NAME, SUMMARY_TABLES, Settings, check, run
from bertscope.experiments.same_token.experiment import activation_sites as activation_sites
from bertscope.experiments.same_token.findings import CAPTIONS, findings
from bertscope.experiments.same_token.plots import plot

__all__ = ["CAPTIONS", "DIRNAME", "NAME", "SUMMARY_TABLES", "Settings", "check", "findings", "plot", "run"]
