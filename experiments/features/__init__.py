"""Experiment `features`: one sparse dictionary per site, its latents labelled against known variables with
neurons, PCA, the re-initialised model's dictionary and shuffled labels as controls, k-sparse probing, and a
feature browser (see :mod:`bertscope.experiments.features.experiment`).

Files by role: ``experiment`` (Settings, run), ``labels`` (known variables as binary concepts), ``measures``
(labelling and k-sparse probing on arrays, intervals), ``data`` (sites, activations, dictionaries, per-unit tables;
old name ``steps``), ``steps`` (the whole computation on plain values, the run's one stage; old name ``compute``, an
alias; it re-exports ``data``'s names under their old module), ``browser`` (the HTML page), ``plots`` (figures and
the page from the tables), ``findings`` (sentences from the tables).
"""

from bertscope.experiments.features.experiment import (
    DIRNAME,
    NAME,
    SUMMARY_TABLES,
    Settings,
    check,
    check_settings,
    run,
)
from bertscope.experiments.features.findings import CAPTIONS, findings
from bertscope.experiments.features.plots import plot

__all__ = ["CAPTIONS", "DIRNAME", "NAME", "SUMMARY_TABLES", "Settings", "check", "check_settings", "findings", "plot",
           "run"]
