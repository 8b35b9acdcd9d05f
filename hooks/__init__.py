"""Named hook points, activation caches, site selection, ablation and patching; context mixing (built purely on
hooked tensors) in the subpackage ``bertscope.hooks.mixing``."""

import sys as _sys

from bertscope.hooks.cache import ActivationCache, act_name
from bertscope.hooks.hook_points import HookedModule, HookPoint
from bertscope.hooks.interventions import ablate_heads, mean_z, patch_activation, patch_heads
from bertscope.hooks.mixing import contributions, mixing_ratio, token_decomposition
from bertscope.hooks.mixing import graph as mixing_graph
from bertscope.hooks.mixing import inputs as mixing_inputs
from bertscope.hooks.mixing import kernels as mixing_kernels

# The modules hooks/mixing_graph.py, mixing_inputs.py and mixing_kernels.py became bertscope.hooks.mixing.graph,
# .inputs and .kernels; their old names stay importable (aliases, for code written before the move).
for _new in (mixing_graph, mixing_inputs, mixing_kernels):
    _sys.modules[f"{__name__}.mixing_{_new.__name__.rpartition('.')[2]}"] = _new

__all__ = [
    "ActivationCache",
    "HookPoint",
    "HookedModule",
    "ablate_heads",
    "act_name",
    "contributions",
    "mean_z",
    "mixing_ratio",
    "patch_activation",
    "patch_heads",
    "token_decomposition",
]
