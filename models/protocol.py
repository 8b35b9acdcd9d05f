"""The block interface the analyses read from a model, written down: what context mixing
(``bertscope.hooks.mixing``), circuits (``bertscope.hooks.circuits``) and the interventions call on an encoder
besides its hook points. Every family ``models.load`` builds satisfies it (``tests/models/test_model_protocol.py``
checks all eight); a new family learns it here instead of from failing tests.

Shapes: ``b`` batch, ``p`` positions, ``h`` heads, ``m`` ``d_model``, ``d`` ``d_head``.

- ``model.config``: ``n_layers``, ``n_heads``, ``d_head``, ``d_model``, ``norm_placement`` (``"post"``: LN after
  each residual sum, the LayerNorms ``ln1``/``ln2`` follow the sublayers; ``"pre"``: they feed them, and
  ``model.ln_final`` closes the stack), ``pad_token_id``.
- ``model.blocks[L]``: ``attn``, ``ln1``, ``ln2``, ``mlp``. ``attn(x, ctx)`` runs the attention sublayer on
  ``x [b, p, m]`` with ``ctx = model.context(x, attention_mask)`` (whatever per-run state the family needs: key
  mask, relative positions, rotary tables) and returns its write ``[b, p, m]``; its weights ``W_Q``, ``W_K``,
  ``W_V`` ``[h, m, d]``, ``W_O`` ``[h, d, m]`` and biases ``b_Q``, ``b_K``, ``b_V`` ``[h, d]``, ``b_O`` ``[m]``.
  ``mlp(x)`` ``[b, p, m] -> [b, p, m]``. ``ln1``/``ln2``/``ln_final`` are called on ``[..., m]``; in a post-LN
  model ``ln1``/``ln2`` also show ``weight`` ``[m]``, ``bias`` ``[m]`` or None and ``eps`` (the decompositions
  take them apart).
- ``model.forward_from(layer, resid_pre, attention_mask)`` finishes a pass from ``blocks.{layer}.hook_resid_pre``.

``missing_members(model)`` lists what a model lacks, each named by its path (``"blocks[0].attn.W_O"``,
``"blocks[0].attn(x, ctx)"``); ``check_model(model)`` raises ``TypeError`` naming them.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, Protocol, get_type_hints, runtime_checkable

import torch


@runtime_checkable
class NormLike(Protocol):
    """A block's normalisation before a sublayer (pre-LN; ModernBERT's first block has none: an identity), called
    on ``x [..., m]``."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The normalised ``x`` ``[..., m]``."""


@runtime_checkable
class AffineNormLike(NormLike, Protocol):
    """A LayerNorm after a residual sum (post-LN), which the decompositions take apart and circuits freeze:
    ``weight`` ``[m]``, ``bias`` ``[m]`` or None, ``eps``; called on ``x [..., m]``."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    eps: float


@runtime_checkable
class AttentionLike(Protocol):
    """A block's attention sublayer: per-head weights ``W_Q``, ``W_K``, ``W_V`` ``[h, m, d]``, ``W_O`` ``[h, d, m]``,
    biases ``b_Q``, ``b_K``, ``b_V`` ``[h, d]``, ``b_O`` ``[m]``; ``attn(x, ctx)`` ``[b, p, m] -> [b, p, m]`` with
    hook points ``hook_q``/``hook_k``/``hook_v`` ``[b, p, h, d]`` and ``hook_result`` ``[b, p, h, m]`` on the way."""

    W_Q: torch.Tensor
    W_K: torch.Tensor
    W_V: torch.Tensor
    W_O: torch.Tensor
    b_Q: torch.Tensor
    b_K: torch.Tensor
    b_V: torch.Tensor
    b_O: torch.Tensor

    def __call__(self, x: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The sublayer's write ``[b, p, m]`` for input ``x [b, p, m]`` and the run's ``ctx``
        (``model.context``)."""


@runtime_checkable
class MLPLike(Protocol):
    """A block's MLP sublayer: ``mlp(x)`` ``[b, p, m] -> [b, p, m]``."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The sublayer's write ``[b, p, m]``."""


@runtime_checkable
class BlockLike(Protocol):
    """One transformer block as the analyses take it apart: ``attn``, ``ln1``, ``ln2``, ``mlp`` (the LayerNorms
    after or before the sublayers, by ``config.norm_placement``; after them, in a post-LN model, each is an
    :class:`AffineNormLike`)."""

    attn: AttentionLike
    ln1: NormLike
    ln2: NormLike
    mlp: MLPLike


@runtime_checkable
class ConfigLike(Protocol):
    """The configuration fields the analyses read."""

    n_layers: int
    n_heads: int
    d_head: int
    d_model: int
    norm_placement: str  # "post" or "pre"
    pad_token_id: int | None


@runtime_checkable
class AnalysableEncoder(Protocol):
    """An encoder the analyses (context mixing, circuits, interventions) run on: its ``config``, ``blocks``,
    ``ln_final`` (None in post-LN models), ``context`` and ``forward_from`` (see the module docstring)."""

    config: ConfigLike
    blocks: Sequence[BlockLike]
    ln_final: NormLike | None

    def context(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> Any:
        """What every block of one run needs besides its input ``x [b, p, m]`` (the ``ctx`` of ``attn``)."""

    def forward_from(self, layer: int, resid_pre: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Any:
        """Finish a forward pass from ``blocks.{layer}.hook_resid_pre`` ``[b, p, m]``."""


def _methods(proto: type) -> dict[str, inspect.Signature]:
    """The methods ``proto`` declares (``__call__`` included), with their signatures less ``self``."""
    out = {}
    for klass in reversed([k for k in proto.__mro__ if getattr(k, "_is_protocol", False) and k is not Protocol]):
        for name, fn in vars(klass).items():
            if callable(fn) and (not name.startswith("_") or name == "__call__"):
                sig = inspect.signature(fn)
                out[name] = sig.replace(parameters=list(sig.parameters.values())[1:])
    return out


def _protocol_of(hint: Any) -> tuple[type | None, bool, bool]:
    """``(protocol, is a sequence of it, may be None)`` for an annotation of one of the protocols above."""
    args = getattr(hint, "__args__", ()) or ()
    optional = type(None) in args
    if getattr(hint, "__origin__", None) is Sequence:
        inner = args[0] if args else None
        return (inner if getattr(inner, "_is_protocol", False) else None), True, False
    for cand in (hint, *args):
        if getattr(cand, "_is_protocol", False):
            return cand, False, optional
    return None, False, optional


def _takes(fn: Any, sig: inspect.Signature) -> bool:
    """Whether ``fn`` accepts the required positional arguments of the protocol's signature ``sig``."""
    required = [p for p in sig.parameters.values() if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
                                                                                           p.POSITIONAL_OR_KEYWORD)]
    if isinstance(fn, torch.nn.Module):  # its __call__ takes anything and hands it to forward
        fn = fn.forward
    try:
        inspect.signature(fn).bind(*[None] * len(required))
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): trust it
        return True
    return True


def missing_members(obj: Any, proto: type = AnalysableEncoder, path: str = "model") -> list[str]:
    """What ``obj`` lacks of protocol ``proto``, each named by its path from ``path`` (``"model.blocks[0].attn.W_O"``,
    ``"model.blocks[1].attn(x, ctx)"``: not callable with those arguments). Members typed with another protocol
    are checked inside (every element of a sequence); an empty list means ``obj`` conforms."""
    missing = []
    hints = get_type_hints(proto)
    if proto is AnalysableEncoder and getattr(getattr(obj, "config", None), "norm_placement", None) == "post":
        for i, block in enumerate(getattr(obj, "blocks", ())):
            for ln in ("ln1", "ln2"):
                if hasattr(block, ln):
                    missing += missing_members(getattr(block, ln), AffineNormLike, f"{path}.blocks[{i}].{ln}")
    for name, hint in hints.items():
        where = f"{path}.{name}"
        if not hasattr(obj, name):
            missing.append(where)
            continue
        inner, many, optional = _protocol_of(hint)
        value = getattr(obj, name)
        if inner is None or (optional and value is None):
            continue
        if many:
            if not isinstance(value, Sequence) and not hasattr(value, "__getitem__"):
                missing.append(f"{where} (a sequence)")
                continue
            for i, item in enumerate(value):
                missing += missing_members(item, inner, f"{where}[{i}]")
        else:
            missing += missing_members(value, inner, where)
    for name, sig in _methods(proto).items():
        args = ", ".join(sig.parameters)
        if name == "__call__":
            if not callable(obj) or not _takes(obj, sig):
                missing.append(f"{path}({args})")
        elif not callable(getattr(obj, name, None)) or not _takes(getattr(obj, name), sig):
            missing.append(f"{path}.{name}({args})")
    return missing


def check_model(model: Any) -> None:
    """Raise ``TypeError`` naming every member of :class:`AnalysableEncoder` that ``model`` lacks."""
    missing = missing_members(model)
    if missing:
        raise TypeError(f"{type(model).__name__} lacks what the analyses read: {', '.join(missing)}")


__all__ = [
    "AffineNormLike",
    "AnalysableEncoder",
    "AttentionLike",
    "BlockLike",
    "ConfigLike",
    "MLPLike",
    "NormLike",
    "check_model",
    "missing_members",
]
