"""Experiment `heads` (see :mod:`bertscope.experiments.heads.experiment` for what it measures and writes).

The package exposes what :class:`bertscope.experiments.registry.Experiment` asks for; files by role: ``experiment``
(Settings, run: the one place that sees the run context), ``data`` (the model passes on plain arguments; old name
``passes``), ``measures`` (the long tables from the passes' arrays), ``statistics`` (per-sentence attention
statistics), ``syntax`` (head-by-relation accuracy), ``importance`` (ablation, gradients, pruning), ``similarity``
(head distances, MDS), ``roles`` (rule-based head roles), ``plots`` (figures from the tables), ``findings`` (the
report's sentences and figure captions, from the saved tables).
"""

from bertscope.experiments.heads.experiment import DIRNAME, NAME, SUMMARY_TABLES, Settings, run
from bertscope.experiments.heads.experiment import activation_sites as activation_sites
from bertscope.experiments.heads.experiment import check as check
from bertscope.experiments.heads.findings import CAPTIONS, findings
from bertscope.experiments.heads.plots import plot

__all__ = ["CAPTIONS", "DIRNAME", "NAME", "SUMMARY_TABLES", "Settings", "findings", "plot", "run"]
