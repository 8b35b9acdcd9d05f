"""Experiment `same_token` (see :mod:`bertscope.experiments.same_token.experiment` for what it measures and writes).

The package exposes what :class:`bertscope.experiments.registry.Experiment` asks for; files by role:
``experiment`` (Settings, run: the one place that sees the run context), ``measures`` (tallies and
summaries of the per-query metrics), ``weights`` (the context-free W_QK view), ``plots`` (figures from the tables).
"""

from bertscope.experiments.same_token.experiment import DIRNAME, NAME, SUMMARY_TABLES, Settings, plot, run

__all__ = ["DIRNAME", "NAME", "SUMMARY_TABLES", "Settings", "plot", "run"]
