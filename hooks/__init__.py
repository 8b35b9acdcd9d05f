"""Named hook points, activation caches and the site vocabulary (``hook_points``, ``cache``, ``sites``: what
``bertscope.models`` builds its encoders from), and the analyses on hooked tensors: interventions and ablation
(``interventions``, ``ablation``), context mixing (``bertscope.hooks.mixing``) and circuits
(``bertscope.hooks.circuits``).

Every public name here is imported on first use (PEP 562), so importing the hook points (as ``bertscope.models``
does) runs no analysis: ``import bertscope.models`` loads ``hook_points``, ``cache`` and ``sites`` only, and the
analyses may import ``bertscope.models`` at their top level. ``from bertscope.hooks import contributions`` (or
``bertscope.hooks.mixing``, ``bertscope.hooks.circuits``) works as before; it imports that analysis then.

>>> from bertscope.hooks import ActivationCache, HookPoint, ablate_heads, contributions
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bertscope.hooks.lazy import lazy_names

if TYPE_CHECKING:
    from bertscope.hooks.cache import ActivationCache, act_name
    from bertscope.hooks.hook_points import HookedModule, HookPoint
    from bertscope.hooks.interventions import ablate_heads, mean_z, patch_activation, patch_heads
    from bertscope.hooks.mixing import contributions, mixing_ratio, token_decomposition

# name -> the module that defines it (imported when the name is first asked for).
_LAZY = {
    **dict.fromkeys(("ActivationCache", "act_name"), "bertscope.hooks.cache"),
    **dict.fromkeys(("HookedModule", "HookPoint"), "bertscope.hooks.hook_points"),
    **dict.fromkeys(("ablate_heads", "mean_z", "patch_activation", "patch_heads"), "bertscope.hooks.interventions"),
    **dict.fromkeys(("contributions", "mixing_ratio", "token_decomposition"), "bertscope.hooks.mixing"),
}  # fmt: skip

# Submodules reachable as attributes (``bertscope.hooks.mixing`` after ``import bertscope.hooks``), imported on
# first use. ``mixing_graph``, ``mixing_inputs`` and ``mixing_kernels`` are the old paths of
# ``bertscope.hooks.mixing.graph``, ``.inputs`` and ``.kernels`` (alias modules: the same module objects).
_SUBMODULES = ("ablation", "cache", "circuits", "hook_points", "interventions", "jsonl", "mixing", "sites",
               "mixing_graph", "mixing_inputs", "mixing_kernels")  # fmt: skip


__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY, _SUBMODULES)


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
