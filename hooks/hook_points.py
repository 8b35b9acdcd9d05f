"""Hook points: identity modules that give every interesting tensor a stable name.

Every activation worth studying passes through a ``HookPoint``. Because a hook point is an ordinary
``nn.Module``, ``register_forward_hook`` works on it directly; ``HookedModule`` adds the named API on top:
``hook_names()``, ``hooks(...)`` (a context manager that always removes what it added),
``run_with_hooks(...)`` and ``run_with_cache(...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from bertscope.hooks.cache import ActivationCache
from bertscope.hooks.sites import match_sites
from torch import nn

HookFn = Callable[[torch.Tensor, "HookPoint"], torch.Tensor | None]
NamesFilter = str | Sequence[str] | Callable[[str], bool] | None


class HookPoint(nn.Module):
    """Identity module at a named site. ``hook.name`` is its full name in the model.

    A forward hook ``fn(tensor, hook)`` may return ``None`` (observe) or a tensor of the same shape, which
    replaces the activation downstream. One exception, opt-in: a hook made by ``fork_batch`` turns a batch of
    one into ``copies`` (same shape otherwise), so that several interventions share the run up to that site.
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
            if result is not None and result.shape != output.shape and not _is_fork(fn, output, result):
                raise ValueError(
                    f"hook on {self.name} returned shape {tuple(result.shape)}, expected {tuple(output.shape)}"
                )
            return result

        return self.register_forward_hook(_hook)

    def extra_repr(self) -> str:
        return self.name


def fork_batch(copies: int) -> HookFn:
    """A hook that expands a batch of one ``[1, ...]`` into ``copies`` views ``[copies, ...]`` of it (the only
    shape change a hook may make): put it before the hooks that then treat the copies differently, e.g. head
    gates whose copies all start from one clean residual stream (the blocks before the site run once)."""

    def fork(x: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        if x.shape[0] != 1:
            raise ValueError(f"fork_batch expects a batch of one at {hook.name}, got {tuple(x.shape)}")
        return x.expand(copies, *x.shape[1:])

    fork.forks_batch = True  # type: ignore[attr-defined]
    return fork


def _is_fork(fn: HookFn, output: torch.Tensor, result: torch.Tensor) -> bool:
    """True for a ``fork_batch`` result: a batch of one made ``copies``, every other dimension unchanged."""
    return getattr(fn, "forks_batch", False) and output.shape[0] == 1 and result.shape[1:] == output.shape[1:]


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
        return match_sites(names_filter, names)

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
        incl_bwd: bool = False,
        loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, ActivationCache]:
        """Forward pass that records the activations at the selected hook points.

        Cached tensors are detached; with ``cache_device`` each is moved there as soon as it is produced, so a
        GPU run can cache more than GPU memory holds. Extra ``fwd_hooks`` run before caching (the cache sees
        their replacements). Other arguments go to ``forward`` (token ids, text, ``stop_at_layer``, ...).

        ``incl_bwd=True`` also stores, under ``<name>_grad``, the gradient of ``loss_fn(output)`` (a scalar;
        without ``loss_fn`` the output itself must be one) with respect to each cached activation, computed
        with ``torch.autograd.grad`` (parameters' ``.grad`` are left alone). An activation the loss does not
        depend on gets a zero gradient. Needs gradients enabled (not inside ``torch.no_grad()``). To make
        ``attn.hook_result`` and LayerNorm internals part of the graph, their unfused computation is used in
        this mode (outputs differ from the fused kernels by float rounding only).
        """
        if incl_bwd and not torch.is_grad_enabled():
            raise RuntimeError("incl_bwd=True needs gradients: call run_with_cache outside torch.no_grad()")
        store: dict[str, torch.Tensor] = {}
        live: dict[str, torch.Tensor] = {}

        def save(tensor: torch.Tensor, hook: HookPoint) -> torch.Tensor | None:
            t = tensor.detach()
            store[hook.name] = t.to(cache_device) if cache_device is not None else t
            if not incl_bwd:
                return None
            # A new graph node downstream code uses, so its gradient is the activation's gradient.
            node = tensor.view_as(tensor) if tensor.requires_grad else tensor.detach().requires_grad_()
            live[hook.name] = node
            return node

        names = self.select_hooks(names_filter)
        with self.hooks(list(fwd_hooks) + [(names, save)] if names else list(fwd_hooks)):
            out = self(*args, **kwargs)
        ordered = {n: store[n] for n in self.hook_names() if n in store}
        if incl_bwd:
            loss = out if loss_fn is None else loss_fn(out)
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
                raise ValueError(
                    f"incl_bwd needs a scalar to differentiate, got {shape}: pass loss_fn, e.g. "
                    "loss_fn=lambda out: out[:, 0].norm()"
                )
            order = [n for n in self.hook_names() if n in live]
            grads = torch.autograd.grad(loss, [live[n] for n in order], allow_unused=True)
            for name, grad in zip(order, grads, strict=True):
                g = torch.zeros_like(live[name]) if grad is None else grad.detach()
                ordered[f"{name}_grad"] = g.to(cache_device) if cache_device is not None else g
            out = out.detach()
        return out, ActivationCache(ordered, model=self)
