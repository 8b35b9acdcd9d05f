"""Experiment `erasure`: amnesic probing with LEACE, INLP and mean projection at one layer, measured downstream
(see :mod:`bertscope.experiments.erasure.experiment`).

Files by role: ``experiment`` (Settings, run), ``data`` (which sentences train and evaluate, sites), ``steps``
(clean probes, hooked runs, tables), ``measures`` (labels, collection, probe and tree scores with intervals),
``plots`` (figures from the tables), ``findings`` (sentences from the tables).
"""

from bertscope.experiments.erasure.experiment import (
    DIRNAME,
    NAME,
    SUMMARY_TABLES,
    Settings,
    check,
    check_settings,
    run,
)
from bertscope.experiments.erasure.experiment import activation_sites as activation_sites
from bertscope.experiments.erasure.findings import CAPTIONS, findings
from bertscope.experiments.erasure.plots import plot

__all__ = ["CAPTIONS", "DIRNAME", "NAME", "SUMMARY_TABLES", "Settings", "check", "check_settings", "findings", "plot",
           "run"]
