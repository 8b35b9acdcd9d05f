"""Experiment `structure`: structural probes (Hewitt & Manning 2019) per layer and sublayer, with controls (see
:mod:`bertscope.experiments.structure.experiment`).

Files by role: ``experiment`` (Settings, run), ``data`` (sites, split, word vectors), ``steps``
(the training passes; old name ``passes``), ``measures`` (metrics with
intervals, baselines), ``plots`` (figures from the tables), ``findings`` (sentences from the tables).
"""

from bertscope.experiments.structure.experiment import DIRNAME, NAME, SUMMARY_TABLES, Settings, check, run
from bertscope.experiments.structure.experiment import activation_sites as activation_sites
from bertscope.experiments.structure.findings import CAPTIONS, findings
from bertscope.experiments.structure.plots import plot

__all__ = ["CAPTIONS", "DIRNAME", "NAME", "SUMMARY_TABLES", "Settings", "check", "findings", "plot", "run"]
