"""Experiment `heads` (see :mod:`bertscope.experiments.heads.experiment` for what it measures and writes).

The package exposes what :class:`bertscope.experiments.registry.Experiment` asks for; files by role:
``experiment`` (Settings, run: the one place that sees the run context), ``passes`` (the model passes on
plain arguments), ``statistics`` (per-sentence
attention statistics), ``syntax`` (head-by-relation accuracy), ``importance`` (ablation, gradients, pruning),
``similarity`` (head distances, MDS), ``roles`` (rule-based head roles), ``plots`` (figures from the tables).
"""

from bertscope.experiments.heads.experiment import DIRNAME, NAME, SUMMARY_TABLES, Settings, plot, run

__all__ = ["DIRNAME", "NAME", "SUMMARY_TABLES", "Settings", "plot", "run"]
