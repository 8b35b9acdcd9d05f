"""Named hook points, activation caches and head-level interventions."""

from bertscope.hooks.cache import ActivationCache, act_name
from bertscope.hooks.hook_points import HookedModule, HookPoint
from bertscope.hooks.interventions import ablate_heads, mean_z, patch_activation, patch_heads
from bertscope.hooks.mixing import contributions, mixing_ratio, token_decomposition

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
