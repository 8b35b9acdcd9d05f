"""Experiment `minimal-pairs` (see :mod:`bertscope.experiments.minimal_pairs.experiment` for what it measures and
writes).

Files by role: ``experiment`` (Settings, PAIRS, check, run: the one place that sees the run context), ``data``
(the pairs: a file or the builtin set; their pseudo-log-likelihoods by every method and stream), ``measures``
(wins, accuracy with intervals, the length control, the first preferring layer), ``plots``, ``findings``.
"""

from bertscope.experiments.minimal_pairs.experiment import (
    DIRNAME,
    NAME,
    PAIRS,
    SUMMARY_TABLES,
    Settings,
    check,
    run,
)
from bertscope.experiments.minimal_pairs.findings import CAPTIONS, findings
from bertscope.experiments.minimal_pairs.plots import plot

__all__ = ["CAPTIONS", "DIRNAME", "NAME", "PAIRS", "SUMMARY_TABLES", "Settings", "check", "findings", "plot", "run"]
