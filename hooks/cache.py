"""`ActivationCache`: the mapping of hook name to tensor that ``run_with_cache`` returns."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence

import torch

_LAYER = re.compile(r"^blocks\.(\d+)\.(.+)$")


class ActivationCache(Mapping[str, torch.Tensor]):
    """Read-only mapping ``name -> tensor`` with helpers for the common views.

    >>> cache["blocks.3.attn.hook_pattern"]          # [batch, head, query, key]
    >>> cache.stack("attn.hook_pattern")              # [layer, batch, head, query, key]
    >>> cache.heads("blocks.3.attn.hook_z", [0, 5])   # [batch, pos, 2, d_head]
    """

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self._tensors = dict(tensors)

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(
                f"{name!r} is not in this cache; it holds {len(self._tensors)} names "
                f"(e.g. {list(self._tensors)[:3]}). Check names_filter."
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} tensors: {list(self._tensors)[:4]}{'...' if len(self) > 4 else ''})"

    def layers(self, suffix: str) -> list[int]:
        """Layer indices present for a per-block name suffix such as ``"attn.hook_pattern"``."""
        found = []
        for name in self._tensors:
            m = _LAYER.match(name)
            if m and m.group(2) == suffix:
                found.append(int(m.group(1)))
        return sorted(found)

    def stack(self, suffix: str) -> torch.Tensor:
        """Stack ``blocks.{L}.<suffix>`` over the layers present: ``[layer, ...]``."""
        layers = self.layers(suffix)
        if not layers:
            raise KeyError(f"no cached name ends in blocks.*.{suffix}")
        return torch.stack([self._tensors[f"blocks.{L}.{suffix}"] for L in layers])

    def heads(self, name: str, heads: int | Sequence[int]) -> torch.Tensor:
        """Select heads of a per-head tensor: ``[batch, pos, head, ...]`` (q/k/v/z/result) or
        ``[batch, head, query, key]`` (scores/pattern)."""
        t = self[name]
        idx = [heads] if isinstance(heads, int) else list(heads)
        dim = 1 if name.endswith(("hook_scores", "hook_pattern")) else 2
        return t.index_select(dim, torch.tensor(idx, device=t.device))

    def to(self, device: str | torch.device) -> ActivationCache:
        """A cache with every tensor on ``device``."""
        return ActivationCache({k: v.to(device) for k, v in self._tensors.items()})

    def nbytes(self) -> int:
        """Total bytes held."""
        return sum(t.numel() * t.element_size() for t in self._tensors.values())
