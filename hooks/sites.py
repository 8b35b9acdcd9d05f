"""The site vocabulary: how hook names are built, parsed and matched, written once for every caller.

A *site* is a hook name (``docs/hooks.md``): ``embed.hook_word``, ``blocks.3.attn.hook_pattern``,
``ln_final.hook_scale``. It has three parts: its *module* (``embed``, ``blocks``, ``ln_final``, ...), its block
*layer* (only for ``blocks.{L}.…``) and its *suffix* (what follows the module, or the layer: ``attn.hook_pattern``).

>>> parse_site("blocks.3.attn.hook_pattern")
Site(name='blocks.3.attn.hook_pattern', module='blocks', layer=3, suffix='attn.hook_pattern')
>>> site_layer("blocks.3.hook_resid_mid")          # hidden_states counting: block L's sites are layer L + 1
(4, 'resid_mid')
>>> match_sites("blocks.*.hook_resid_post", ["blocks.0.hook_resid_post", "blocks.0.hook_mlp_out"])
['blocks.0.hook_resid_post']

Globs are ``fnmatch``'s (``*``, ``?``, ``[...]``), matched case-sensitively, as ``names_filter`` takes them.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: The residual-stream writes and states inside a block, in forward order: ``blocks.{L}.hook_{component}``.
BLOCK_COMPONENTS = ("attn_out", "resid_mid", "mlp_out", "resid_post")
#: The embedding sites a probe reads, with their component name: the token embedding alone and the sum
#: after the embedding LayerNorm.
EMBED_COMPONENTS = {"embed.hook_word": "word", "embed.hook_out": "embed"}

#: The attention-shaped hook suffixes: ``blocks.{L}.attn.hook_scores`` and ``.hook_pattern`` are
#: ``[batch, head, query, key]``; every other block site is token-indexed (``[batch, pos, ...]``).
ATTENTION_SUFFIXES = ("hook_scores", "hook_pattern")

_BLOCK = re.compile(r"^blocks\.(\d+)(?:\.(.+))?$")
_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class Site:
    """A parsed hook name: ``module`` (its first part), ``layer`` (the block index of ``blocks.{L}.…``, else
    None) and ``suffix`` (the rest: ``attn.hook_pattern`` for ``blocks.3.attn.hook_pattern``, ``hook_word`` for
    ``embed.hook_word``)."""

    name: str
    module: str
    layer: int | None
    suffix: str


def split_block(name: str) -> tuple[int, str | None] | None:
    """``(layer, suffix)`` of a block name: ``blocks.3.attn.hook_z`` -> ``(3, "attn.hook_z")``, a bare block
    ``blocks.3`` -> ``(3, None)``; None for any other name. The one parser of ``blocks.{L}…`` names."""
    m = _BLOCK.match(name)
    return (int(m.group(1)), m.group(2)) if m else None


def parse_site(name: str) -> Site:
    """Split a hook name into module, block layer and suffix (see `Site`). A name without a dot is a module
    with an empty suffix."""
    block = split_block(name)
    if block is not None and block[1] is not None:
        return Site(name, "blocks", block[0], block[1])
    module, _, suffix = name.partition(".")
    return Site(name, module, None, suffix)


def block_site(layer: int, suffix: str) -> str:
    """The hook name of ``suffix`` in block ``layer``: ``block_site(3, "attn.hook_pattern")``; a bare block
    component (``"resid_post"``) gets its ``hook_`` prefix."""
    if suffix in BLOCK_COMPONENTS:
        suffix = f"hook_{suffix}"
    return f"blocks.{layer}.{suffix}"


def block_layer(name: str) -> int | None:
    """The block index of a ``blocks.{L}.…`` name, else None."""
    return parse_site(name).layer


def is_attention_site(name: str) -> bool:
    """Whether hook ``name`` (``blocks.3.attn.hook_pattern``, or a bare suffix ``hook_pattern``) is attention-shaped,
    ``[batch, head, query, key]`` (`ATTENTION_SUFFIXES`), rather than token-indexed ``[batch, pos, ...]``."""
    return name.endswith(ATTENTION_SUFFIXES)


def site_layer(site: str) -> tuple[int, str]:
    """``(layer, component)`` of a residual-stream site, counted like transformers' ``hidden_states``: 0 for the
    embedding sites (``embed.hook_word`` -> ``word``, ``embed.hook_out`` -> ``embed``), ``L + 1`` for every
    ``blocks.{L}.hook_{component}`` with a component of `BLOCK_COMPONENTS` (so ``resid_post`` at layer k is
    ``hidden_states[k]``)."""
    if site in EMBED_COMPONENTS:
        return 0, EMBED_COMPONENTS[site]
    parsed = parse_site(site)
    component = parsed.suffix[len("hook_") :] if parsed.suffix.startswith("hook_") else ""
    if parsed.layer is None or component not in BLOCK_COMPONENTS:
        raise ValueError(
            f"{site!r} is not a residual-stream site; use embed.hook_word, embed.hook_out or "
            "blocks.L.hook_{attn_out,resid_mid,mlp_out,resid_post}"
        )
    return parsed.layer + 1, component


def is_glob(pattern: str) -> bool:
    """Whether ``pattern`` holds a glob character (``*``, ``?``, ``[``)."""
    return not _GLOB_CHARS.isdisjoint(pattern)


def matches(pattern: str, name: str) -> bool:
    """Whether the hook name ``name`` is ``pattern`` or matches it as a glob."""
    return fnmatch.fnmatchcase(name, pattern)


def match_sites(patterns: str | Iterable[str], names: Sequence[str]) -> list[str]:
    """The ``names`` matched by any of ``patterns`` (exact names or globs), in ``names``' order.

    Raises ``KeyError`` for a pattern that matches nothing (a typo must not give an empty selection), naming
    up to five close names.
    """
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    chosen: set[str] = set()
    known = set(names)
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise TypeError(f"site names and globs must be strings, got {type(pattern).__name__}")
        if not is_glob(pattern):  # an exact name: a set lookup (run_with_cache passes every name it caches)
            matched = [pattern] if pattern in known else []
        else:
            matched = [n for n in names if matches(pattern, n)]
        if not matched:
            close = fnmatch.filter(names, "*" + pattern.split(".")[-1].split("*")[-1] + "*")[:5]
            hint = f" Did you mean one of {close}?" if close else " See model.hook_names()."
            raise KeyError(f"no hook point matches {pattern!r}.{hint}")
        chosen.update(matched)
    return [n for n in names if n in chosen]


def forward_order(names: Iterable[str], order: dict[str, tuple[str, ...]]) -> list[str]:
    """Sort hook names in forward order. ``order`` maps a module (``"embed"``, ``"blocks"``, ``"ln_final"``)
    to its suffixes in the order its forward reaches them; modules rank in ``order``'s own order, blocks by
    layer."""
    modules = list(order)

    def rank(name: str) -> tuple[int, int, int]:
        site = parse_site(name)
        return (modules.index(site.module), site.layer or 0, order[site.module].index(site.suffix))

    return sorted(names, key=rank)


def last_block(names: Iterable[str]) -> int | None:
    """The deepest block any of ``names`` lives in (embedding sites: block 0), so a forward can stop there;
    None when a name needs the full forward (``ln_final``, a head, ...)."""
    layers = []
    for name in names:
        site = parse_site(name)
        if site.module == "embed":
            layers.append(0)
        elif site.layer is not None:
            layers.append(site.layer)
        else:
            return None
    return max(layers) if layers else None


__all__ = [
    "ATTENTION_SUFFIXES",
    "BLOCK_COMPONENTS",
    "EMBED_COMPONENTS",
    "Site",
    "block_layer",
    "block_site",
    "forward_order",
    "is_attention_site",
    "is_glob",
    "last_block",
    "match_sites",
    "matches",
    "parse_site",
    "site_layer",
    "split_block",
]
