"""A batch of text pairs as the pairwise methods see it, and the passes they share.

``Pair`` holds both sides tokenised (each side padded on its own), the score kind and the pooling. The reference
input of a side is the one of Moeller et al.'s code (``lucasmllr/xsbert``, ``ReferenceTransformer.forward``): the
same length as the text, its special tokens ([CLS]/[SEP], ``<s>``/``</s>``) kept and every other token replaced
by the padding token, attended to like a real token (attention mask all ones over the text's length).

Shapes: ``b`` pairs, ``p`` position, ``m`` d_model, ``e`` the embedding's dimension.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from bertscope.hooks.similarity.pooling import normalise, pool

REFERENCE = ("xsbert reference: special tokens kept, every other token replaced by the padding token, attended "
             "over the text's length")  # fmt: skip


@dataclass
class Side:
    """One side of a batch of pairs: ``ids``, ``mask``, ``types`` ``[b, p]`` (``types`` may be None) and the word
    pieces of each text (``tokens``, real positions only)."""

    ids: torch.Tensor
    mask: torch.Tensor
    types: torch.Tensor | None
    tokens: list[list[str]]

    @property
    def lengths(self) -> list[int]:
        """Real tokens per row."""
        return [int(n) for n in self.mask.sum(-1)]


@dataclass
class Pair:
    """A batch of pairs: sides ``a`` and ``b``, ``kind`` (``"cosine"``/``"dot"``) and ``pooling``."""

    a: Side
    b: Side
    kind: str
    pooling: str


def side(model: Any, texts: list[str]) -> Side:
    """Tokenise ``texts`` as one side (``model.tokenize``; refuses texts longer than the model takes)."""
    enc = model.tokenize(texts)
    types = enc.get("token_type_ids")
    return Side(enc["input_ids"], enc["attention_mask"], types,
                [model.to_str_tokens(t) for t in texts])  # fmt: skip


def reference_ids(model: Any, s: Side) -> torch.Tensor:
    """``[b, p]``: the xsbert reference of each row (see the module docstring); padding stays padding."""
    specials = {v for k, v in model.special_token_ids.items() if k in ("cls", "sep", "bos", "eos")}
    pad = model.special_token_ids.get("pad", model.config.pad_token_id)
    keep = torch.zeros_like(s.ids, dtype=torch.bool)
    for t in specials:
        keep |= s.ids == t
    return torch.where(keep | (s.mask == 0), s.ids, torch.full_like(s.ids, pad))


@torch.no_grad()
def representation(model: Any, ids: torch.Tensor, s: Side, layer: int) -> torch.Tensor:
    """``blocks.{layer}.hook_resid_pre`` ``[b, p, m]`` of ``ids`` (with ``s``'s mask and types)."""
    name = f"blocks.{layer}.hook_resid_pre"
    _, cache = model.run_with_cache(ids, s.mask, s.types, names_filter=[name], stop_at_layer=layer)
    return cache[name]


def embedding_from(model: Any, x: torch.Tensor, mask: torch.Tensor, layer: int, pooling: str, kind: str,
                   *, detach_norm: bool = False) -> torch.Tensor:
    """The vector whose dot product is the score (``[b, e]``) from ``blocks.{layer}.hook_resid_pre`` ``x``: the
    rest of the model, the pooling, and for cosine the division by the norm (held constant with
    ``detach_norm``, as LRP treats the normalisation)."""
    hidden = model.forward_from(layer, x, mask)
    e = pool(hidden, mask, pooling)
    if kind == "cosine" and detach_norm:
        return e / e.norm(dim=-1, keepdim=True).detach().clamp_min(1e-12)
    return normalise(e, kind)


@torch.no_grad()
def embeddings(model: Any, ids: torch.Tensor, s: Side, pooling: str, kind: str,
               mask: torch.Tensor | None = None) -> torch.Tensor:
    """``[b, e]`` score vectors of ``ids`` (``mask`` overrides the side's attention mask)."""
    m = s.mask if mask is None else mask
    hidden = model(ids, m, s.types)
    return normalise(pool(hidden, m, pooling), kind)
