"""Linear probes with the controls that make their numbers mean something.

- `LinearProbe`: scikit-learn-style L2 logistic / ridge probe, scikit-learn or torch (CPU/GPU) backend.
- `evaluate`: grouped K-fold scores with nested alpha selection, group-bootstrap intervals, majority and
  chance baselines, and optional control-task / selectivity rows, as a long pandas table; `fold_rng` and
  `repeat_seed` say which folds and seeds a (repeated) run used; `evaluate_split`: the same scores for a probe
  trained on one split and scored on another (e.g. another corpus).
- `control_labels`, `selectivity`: Hewitt & Liang (2019) control tasks.
- `group_bootstrap`, `ratio_of_sums`, `mean_of_groups`: the group bootstrap with percentile intervals
  (`probes/bootstrap.py`), used by every experiment.
- `mdl_probe`: Voita & Titov (2020) online codelength and compression.
- `StructuralProbe`: Hewitt & Manning (2019) distance / depth probes (metrics in `probes.structural`).
- `LeaceFitter`, `LeaceEraser`, `INLP`, `MeanProjection`, `RandomSubspaceEraser` (`probes/erasure.py`): linear
  concept erasure on arrays and as hook interventions (`eraser.hook(model, site)`).
- `thread_limit`: cap torch, BLAS and OpenMP threads inside a block (every probe fit runs under one).
- `check_groups`: validate a group label per row (what grouped folds and the group bootstrap take).
"""

from ._checks import check_groups, thread_limit
from .bootstrap import Interval, group_bootstrap, mean_of_groups, percentile_interval, ratio_of_sums, resample_counts
from .controls import control_labels, selectivity
from .erasure import INLP, LeaceEraser, LeaceFitter, MeanProjection, RandomSubspaceEraser
from .estimator import LinearProbe
from .evaluate import (
    DEFAULT_ALPHAS,
    CrossValPredictions,
    evaluate,
    evaluate_split,
    fold_rng,
    grouped_cross_val_predict,
    grouped_folds,
    repeat_seed,
    strata_of,
)
from .mdl import mdl_probe
from .structural import StructuralProbe

__all__ = [
    "DEFAULT_ALPHAS",
    "CrossValPredictions",
    "INLP",
    "Interval",
    "LeaceEraser",
    "LeaceFitter",
    "MeanProjection",
    "RandomSubspaceEraser",
    "LinearProbe",
    "control_labels",
    "evaluate",
    "evaluate_split",
    "fold_rng",
    "grouped_cross_val_predict",
    "group_bootstrap",
    "grouped_folds",
    "mdl_probe",
    "mean_of_groups",
    "percentile_interval",
    "ratio_of_sums",
    "repeat_seed",
    "resample_counts",
    "selectivity",
    "strata_of",
    "StructuralProbe",
    "check_groups",
    "thread_limit",
]
