"""Experiment `positions` (see :mod:`bertscope.experiments.positions.experiment` for what it measures and writes).

The package exposes what :class:`bertscope.experiments.registry.Experiment` asks for; files by role: ``experiment``
(Settings, run: the one place that sees the run context), ``steps`` and ``steps_more`` (the probe steps of one run;
old names ``design``, ``design_more``), ``data`` (windows, sentences, activations), ``windows`` (the sequence sets
of a run and their capture), ``measures`` (probe-free measures, pairs), ``plots`` (figures from the tables).
"""

from bertscope.experiments.positions.experiment import DIRNAME, NAME, SUMMARY_TABLES, Settings, check, run
from bertscope.experiments.positions.experiment import activation_sites as activation_sites
from bertscope.experiments.positions.experiment import capture_inputs as capture_inputs
from bertscope.experiments.positions.experiment import check_capture as check_capture
from bertscope.experiments.positions.findings import CAPTIONS, findings
from bertscope.experiments.positions.plots import plot

__all__ = ["CAPTIONS", "DIRNAME", "NAME", "SUMMARY_TABLES", "Settings", "check", "findings", "plot", "run"]
