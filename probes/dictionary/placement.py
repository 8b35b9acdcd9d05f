"""Placing dictionaries on a model: site widths, a transcoder's sites, the folder a site's dictionary lives in,
finding the dictionaries under a folder, and loading one checked against a model (site, widths, the weights it
was trained on). Every reader of a saved dictionary (``sae eval``, ``explore --dictionary``, ``run features
--dictionaries``) goes through :func:`load_for_model`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from bertscope.hooks.sites import is_attention_site, split_block

from .models import Dictionary
from .saelens_format import DictionaryFormatError, is_dictionary, load_dictionary

__all__ = ["find_dictionaries", "load_for_model", "model_sha256", "site_folder", "site_width", "transcoder_sites"]

#: the sites of ``[batch, pos, d_mlp]`` rows (the others a dictionary reads are ``d_model`` wide)
MLP_SUFFIXES = ("mlp.hook_pre", "mlp.hook_post")


def site_width(model: Any, site: str) -> int:
    """The width of a token site's rows (``d_model`` or ``d_mlp``); ``KeyError`` (one line) for a site the model
    lacks or one that is not ``[batch, pos, d]`` (attention patterns, scores, per-head vectors)."""
    if site not in model.hook_dict:
        raise KeyError(f"the model has no site {site!r}; `bertscope info` lists every hook name")
    if site.endswith(MLP_SUFFIXES):
        return int(model.config.d_mlp)
    if is_attention_site(site) or site.endswith("hook_scale") or ".attn.hook_" in site:
        raise KeyError(f"site {site!r} is not a [batch, pos, d] site; dictionaries read residual, attention-output "
                       "or MLP sites")
    return int(model.config.d_model)


def transcoder_sites(model: Any, site: str, site_out: str | None = None) -> tuple[str, str]:
    """A transcoder's (read, predicted) sites: ``site`` may name a block (``blocks.3``), read at its MLP input
    (post-LN BERT: ``blocks.3.hook_resid_mid``; pre-LN: ``blocks.3.ln2.hook_normalized``, the MLP input up to
    LayerNorm's affine map, which the encoder absorbs); ``site_out`` defaults to the same block's
    ``hook_mlp_out``. ``KeyError`` (one line) when ``site`` names no block."""
    block = split_block(site)  # a hook of block L, or block L itself
    if block is None:
        raise KeyError(f"a transcoder reads a block's MLP input: give --site blocks.L (or a hook of block L), "
                       f"not {site!r}")
    layer, suffix = block
    if suffix is None:
        post_ln = getattr(model.config, "norm_placement", "post") == "post"
        site = f"blocks.{layer}.hook_resid_mid" if post_ln else f"blocks.{layer}.ln2.hook_normalized"
    return site, site_out or f"blocks.{layer}.hook_mlp_out"


def site_folder(site: str) -> str:
    """The sub-folder a site's dictionary lives in (``bertscope sae train``'s layout: the hook name)."""
    return site.replace("/", "_")


def find_dictionaries(folder: str | os.PathLike[str]) -> dict[str, Path]:
    """Dictionaries under ``folder``: the folder itself, or every sub-folder (and ``controls/*``) holding one;
    name -> path. Raises :class:`DictionaryFormatError` when there is none."""
    folder = Path(folder)
    if is_dictionary(folder):
        return {folder.name: folder}
    found = {p.name: p for p in sorted(folder.glob("*")) if p.is_dir() and is_dictionary(p)}
    found.update({f"controls/{p.name}": p for p in sorted(folder.glob("controls/*")) if is_dictionary(p)})
    if not found:
        raise DictionaryFormatError(f"{folder} is not a dictionary (no cfg.json + sae_weights.safetensors in it "
                                    "or its sub-folders); train one with `bertscope sae train`")
    return found


def model_sha256(model: Any) -> str | None:
    """The model's weights sha256 (what a trained dictionary records in ``metadata.weights_sha256``)."""
    return getattr(model, "weights_sha256", None)


def load_for_model(dictionary: Any, model: Any) -> Dictionary:
    """The dictionary (a folder, or a loaded :class:`Dictionary`) on ``model``'s device, checked against the model:
    it must name a site the model has, its input (and a transcoder's output) width must be the site's width on this
    model, and a dictionary that records the weights it was trained on (``metadata.weights_sha256``) must have been
    trained on this model's. ``ValueError`` (one line) otherwise; a folder that holds several dictionaries (a ``sae
    train --out`` folder) is named with the sub-folders it holds."""
    device = next(model.parameters()).device
    if isinstance(dictionary, (str, os.PathLike)):
        folder = Path(dictionary)
        if not is_dictionary(folder) and folder.is_dir():
            inside = [name for name in _safe_find(folder) if not name.startswith("controls/")]
            if inside:
                raise ValueError(f"{folder} holds several dictionaries; give one of its sub-folders: "
                                 + ", ".join(str(folder / n) for n in inside))
        try:
            dictionary = load_dictionary(folder, device=device, dtype=torch.float32)
        except DictionaryFormatError as e:
            raise ValueError(str(e)) from None
        where = f"dictionary {folder}"
    else:
        dictionary = dictionary.to(device=device, dtype=torch.float32).eval()
        where = "the dictionary"
    cfg = dictionary.config
    if not cfg.site:
        raise ValueError(f"{where} names no site (cfg.json metadata.hook_name); it cannot be placed on the model")
    for site, width in ((cfg.site, cfg.d_in), (cfg.site_out if cfg.kind != "sae" else None, cfg.width_out)):
        if site is None:
            continue
        if site not in model.hook_dict:
            raise ValueError(f"{where} reads site {site}, which this model lacks (`bertscope info` lists its "
                             "hook names)")
        try:
            have = site_width(model, site)
        except KeyError as e:
            raise ValueError(str(e.args[0] if e.args else e)) from None
        if have != width:
            raise ValueError(f"{where} was made for a model whose {site} is {width} wide; this model's is {have} "
                             "(a dictionary of another model)")
    sha, mine = cfg.metadata.get("weights_sha256"), model_sha256(model)
    if sha and mine and sha != mine:
        raise ValueError(f"{where} was trained on another model (weights sha256 {str(sha)[:12]}…, this model's is "
                         f"{mine[:12]}…)")
    return dictionary


def _safe_find(folder: Path) -> list[str]:
    try:
        return list(find_dictionaries(folder))
    except DictionaryFormatError:
        return []
