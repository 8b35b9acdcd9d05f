"""The rule-based checkpoint converter every family without its own converter uses, and ``CheckpointError``.

Below ``families`` (which names this converter as the default) and ``loading`` (which fills an ``Encoder`` with
the result); it imports nothing else of ``models``.
"""

from __future__ import annotations

import re
from typing import Any

import torch

_QKV = re.compile(r"^(blocks\.\d+\.attn)\.(\w+)\.(weight|bias)$")
_GROUP = re.compile(r"^groups\.(\d+)\.(.+)$")


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model: missing, unexpected or mis-shaped tensors."""


def convert_by_rules(
    family: Any, state: dict[str, torch.Tensor], config: Any
) -> tuple[dict[str, torch.Tensor], bool, bool]:
    """Map a Hugging Face state dict to this package's names by ``family``'s rules (a ``families.Family``; see
    ``models.families``), fuse Q/K/V, and give each layer its group's weights where layers share them
    (``config``: the ``EncoderConfig``). Returns (state, has_pooler, has_mlm)."""
    state = {_rename_legacy(k): v for k, v in state.items()}
    prefix = _encoder_prefix(state, family.marker)
    mapped: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}  # our name -> checkpoint key, for error messages
    unknown = []
    for key, tensor in state.items():
        matched, target = family.map_encoder_key(key[len(prefix) :]) if key.startswith(prefix) else (False, None)
        if not matched:
            matched, target = family.map_head_key(key)
        if not matched:
            unknown.append(key)
        elif target is not None:
            mapped[target] = tensor
            origin[target] = key
    mapped, origin = _expand_groups(mapped, origin, config)
    out: dict[str, torch.Tensor] = {}
    qkv: dict[tuple[str, str], dict[str, tuple[str, torch.Tensor]]] = {}
    for name, tensor in mapped.items():
        m = _QKV.match(name)
        if m and m.group(2) in family.qkv_names:
            qkv.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = (origin[name], tensor)
        else:
            out[name] = tensor
    for (attn, kind), parts in qkv.items():
        absent = [p for p in family.qkv_names if p not in parts]
        if absent:
            some, (key, _) = next(iter(parts.items()))
            unknown.extend(f"(missing) {key.replace(f'.{some}.', f'.{p}.')}" for p in absent)
            continue
        out[f"{attn}.qkv.{kind}"] = torch.cat([parts[p][1] for p in family.qkv_names])
    if unknown:
        raise CheckpointError(f"tensors this loader does not know how to place: {sorted(unknown)}")
    has_pooler = "pooler.dense.weight" in out
    has_mlm = any(k.startswith("mlm_head.") for k in out)
    return out, has_pooler, has_mlm


def _expand_groups(
    mapped: dict[str, torch.Tensor], origin: dict[str, str], config: Any
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``groups.G.x`` (weights shared by a layer group) -> ``blocks.L.x`` for every layer L of group G."""
    out, where = {}, {}
    for name, tensor in mapped.items():
        m = _GROUP.match(name)
        if m is None:
            out[name], where[name] = tensor, origin[name]
            continue
        group = int(m.group(1))
        layers = [L for L in range(config.n_layers) if config.layer_group(L) == group]
        if not layers:  # a group no layer uses: keep the name so that the shape check reports it
            out[name], where[name] = tensor, origin[name]
        for layer in layers:
            out[f"blocks.{layer}.{m.group(2)}"], where[f"blocks.{layer}.{m.group(2)}"] = tensor, origin[name]
    return out, where


# ====================================================================== helpers
def _rename_legacy(key: str) -> str:
    """Old TF-converted checkpoints name LayerNorm parameters gamma/beta."""
    if ".LayerNorm." in key:
        key = key.replace(".LayerNorm.gamma", ".LayerNorm.weight").replace(".LayerNorm.beta", ".LayerNorm.bias")
    return key


def _encoder_prefix(state: dict[str, torch.Tensor], marker: str) -> str:
    hits = [k[: -len(marker)] for k in state if k.endswith(marker)]
    if len(hits) != 1:
        raise CheckpointError(
            "cannot find the encoder in this checkpoint: expected exactly one "
            f"'*{marker}' tensor, found {len(hits)}"
        )
    return hits[0]
