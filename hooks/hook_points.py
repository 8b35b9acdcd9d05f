"""Hook points: identity modules that give every interesting tensor a stable name.

Every activation worth studying passes through a ``HookPoint``. Because a hook point is an ordinary
``nn.Module``, ``register_forward_hook`` works on it directly; ``HookedModule`` adds the named API on top:
``hook_names()``, ``hooks(...)`` (a context manager that always removes what it added),
``run_with_hooks(...)`` and ``run_with_cache(...)``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from bertscope.hooks.cache import ActivationCache
from torch import nn

HookFn = Callable[[torch.Tensor, "HookPoint"], torch.Tensor | None]
NamesFilter = str | Sequence[str] | Callable[[str], bool] | None


class HookPoint(nn.Module):
    """Identity module at a named site. ``hook.name`` is its full name in the model.

    A forward hook ``fn(tensor, hook)`` may return ``None`` (observe) or a tensor of the same shape, which
    replaces the activation downstream.
    """

    def __init__(self) -> None:
        super().__init__()
        self.name: str = ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @property
    def is_hooked(self) -> bool:
        """True when any forward (pre-)hook is registered: the model uses this to pay only for what is watched."""
        return bool(self._forward_hooks or self._forward_pre_hooks)

    def add_hook(self, fn: HookFn) -> torch.utils.hooks.RemovableHandle:
        def _hook(module: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor | None:
            result = fn(output, self)
            if result is not None and result.shape != output.shape:
                raise ValueError(
                    f"hook on {self.name} returned shape {tuple(result.shape)}, expected {tuple(output.shape)}"
                )
            return result

        return self.register_forward_hook(_hook)

    def extra_repr(self) -> str:
        return self.name


class HookedModule(nn.Module):
    """Mixin for a model whose submodules include ``HookPoint``s.

    Call ``self.setup_hooks()`` at the end of ``__init__`` to name every hook point after its module path.
    Subclasses implement ``forward(input_ids, attention_mask=None, token_type_ids=None, stop_at_layer=None)``.
    """

    def setup_hooks(self) -> None:
        self.hook_dict: dict[str, HookPoint] = {}
        for name, module in self.named_modules():
            if isinstance(module, HookPoint):
                module.name = name
                self.hook_dict[name] = module

    def hook_names(self) -> list[str]:
        """Every hook-point name, in forward order."""
        return list(self.hook_dict)

    def select_hooks(self, names_filter: NamesFilter) -> list[str]:
        """Resolve a list of names, a glob (``"blocks.*.attn.hook_pattern"``) or a predicate to hook names.

        Unknown exact names and globs that match nothing raise ``KeyError``: a typo must not give an empty cache.
        """
        names = self.hook_names()
        if names_filter is None:
            return names
        if callable(names_filter):
            return [n for n in names if names_filter(n)]
        patterns = [names_filter] if isinstance(names_filter, str) else list(names_filter)
        chosen: set[str] = set()
        for pattern in patterns:
            if not isinstance(pattern, str):
                raise TypeError(f"names_filter entries must be strings, got {type(pattern).__name__}")
            matched = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
            if not matched:
                close = fnmatch.filter(names, "*" + pattern.split(".")[-1].split("*")[-1] + "*")[:5]
                hint = f" Did you mean one of {close}?" if close else " See model.hook_names()."
                raise KeyError(f"no hook point matches {pattern!r}.{hint}")
            chosen.update(matched)
        return [n for n in names if n in chosen]

    @contextmanager
    def hooks(self, fwd_hooks: Iterable[tuple[NamesFilter, HookFn]] = ()) -> Iterator[HookedModule]:
        """Temporarily add forward hooks; they are removed when the block exits, also on exceptions.

        ``fwd_hooks`` is a list of ``(name, glob, list of names or predicate, fn)``; ``fn(tensor, hook)``
        returns ``None`` or a replacement tensor.
        """
        handles = []
        try:
            for names_filter, fn in fwd_hooks:
                for name in self.select_hooks(names_filter):
                    handles.append(self.hook_dict[name].add_hook(fn))
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def run_with_hooks(
        self, *args: Any, fwd_hooks: Iterable[tuple[NamesFilter, HookFn]] = (), **kwargs: Any
    ) -> torch.Tensor:
        """One forward pass with ``fwd_hooks`` in place (see ``hooks``)."""
        with self.hooks(fwd_hooks):
            return self(*args, **kwargs)

    def run_with_cache(
        self,
        *args: Any,
        names_filter: NamesFilter = None,
        cache_device: str | torch.device | None = None,
        fwd_hooks: Iterable[tuple[NamesFilter, HookFn]] = (),
        **kwargs: Any,
    ) -> tuple[torch.Tensor, ActivationCache]:
        """Forward pass that records the activations at the selected hook points.

        Cached tensors are detached; with ``cache_device`` each is moved there as soon as it is produced, so a
        GPU run can cache more than GPU memory holds. Extra ``fwd_hooks`` run before caching (the cache sees
        their replacements). Other arguments go to ``forward`` (e.g. ``stop_at_layer``).
        """
        store: dict[str, torch.Tensor] = {}

        def save(tensor: torch.Tensor, hook: HookPoint) -> None:
            t = tensor.detach()
            store[hook.name] = t.to(cache_device) if cache_device is not None else t

        names = self.select_hooks(names_filter)
        with self.hooks(list(fwd_hooks) + [(names, save)] if names else list(fwd_hooks)):
            out = self(*args, **kwargs)
        ordered = {n: store[n] for n in self.hook_names() if n in store}
        return out, ActivationCache(ordered)
