"""Experiment `similarity` (see :mod:`bertscope.experiments.similarity.experiment` for what it measures and
writes).

Files by role: ``experiment`` (Settings, PAIRS, run: the one place that sees the run context), ``data`` (the
builtin pairs, the embeddings, ablations, attributions, removals and negation edits: every forward pass),
``measures`` (correlations, the heads, faithfulness and claims tables, with bootstrap intervals), ``plots``,
``findings``.
"""

from bertscope.experiments.similarity.experiment import (
    DIRNAME,
    NAME,
    PAIRS,
    SUMMARY_TABLES,
    Settings,
    check,
    check_settings,
    run,
)
from bertscope.experiments.similarity.findings import CAPTIONS, findings
from bertscope.experiments.similarity.plots import plot

__all__ = ["CAPTIONS", "DIRNAME", "NAME", "PAIRS", "SUMMARY_TABLES", "Settings", "check", "check_settings",
           "findings", "plot", "run"]
