"""Dictionaries on disk in SAELens's format: ``cfg.json`` + ``sae_weights.safetensors``.

``save_dictionary`` writes what ``sae_lens.SAE.load_from_disk`` reads (SAELens 6.x architecture names and
weight keys); ``load_dictionary`` reads those folders, whoever wrote them. bertscope's own description (its
architecture name, site, token classes, training record) rides in ``cfg.json``'s ``metadata`` (SAELens keeps
unknown metadata keys).

Each architecture's file in ``architectures/`` holds its mapping: ``saelens`` (kind -> SAELens architecture
name), ``saelens_fields`` (extra ``cfg.json`` fields, e.g. TopK's ``k``), ``saelens_in`` (a SAELens file's weights
converted on reading) and its ``threshold`` (saved as ``threshold [d_sae]``). Weights: ``W_enc [d_in, d_sae]``,
``b_enc``, ``W_dec [d_sae, d_out]``, ``b_dec [d_out]``, ``threshold [d_sae]`` where the architecture has one,
``W_skip [d_out, d_in]`` (skip transcoders, SAELens's orientation). ``docs/dictionaries.md`` has the table.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from . import architectures
from .models import Dictionary, DictionaryConfig

CFG_FILENAME = "cfg.json"
WEIGHTS_FILENAME = "sae_weights.safetensors"


class DictionaryFormatError(ValueError):
    """A folder that does not hold a dictionary bertscope can read (one line, for the CLI's exit 2)."""


def saelens_architecture(config: DictionaryConfig) -> str:
    """SAELens's architecture name for a bertscope config (the architecture's ``saelens`` mapping; raises
    ``DictionaryFormatError`` for a kind SAELens has no name for)."""
    spec = architectures.get(config.arch)
    try:
        return spec.saelens[config.kind]
    except KeyError:
        raise DictionaryFormatError(f"SAELens's format has no {config.arch} {config.kind.replace('_', ' ')}; "
                                    f"a {config.arch} is one of: {', '.join(spec.kinds)}") from None


def save_dictionary(dictionary: Dictionary, folder: str | os.PathLike[str]) -> Path:
    """Write ``dictionary`` to ``folder`` (created) as ``cfg.json`` + ``sae_weights.safetensors``, each file
    written whole or not at all (temporary file, then rename); returns the folder."""
    cfg = dictionary.config
    arch = saelens_architecture(cfg)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    d = dictionary
    state = {"W_enc": d.W_enc, "b_enc": d.b_enc, "W_dec": d.W_dec, "b_dec": d.b_dec}
    if d.threshold is not None:
        state["threshold"] = d.threshold
    if d.W_skip is not None:
        state["W_skip"] = d.W_skip.T
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
    meta = {"hook_name": cfg.site, "model_name": cfg.metadata.get("model"), "hook_head_index": None,
            "prepend_bos": False, "context_size": cfg.metadata.get("max_length"),
            "bertscope": {"arch": cfg.arch, "kind": cfg.kind, "k": cfg.k, "site": cfg.site,
                          "site_out": cfg.site_out, **{k: v for k, v in cfg.metadata.items()}}}
    if cfg.kind != "sae":
        meta["hook_name_out"] = cfg.site_out
    out: dict[str, Any] = {
        "d_in": cfg.d_in, "d_sae": cfg.d_sae, "dtype": str(d.W_enc.dtype).removeprefix("torch."), "device": "cpu",
        "apply_b_dec_to_input": cfg.kind == "sae", "normalize_activations": "none", "reshape_activations": "none",
        "metadata": meta, "architecture": arch,
    }
    if dictionary.spec.saelens_fields is not None:
        out.update(dictionary.spec.saelens_fields(cfg))
    if cfg.kind != "sae":
        out["d_out"] = cfg.width_out
    _atomic(folder / WEIGHTS_FILENAME, lambda p: save_file(state, str(p)))
    _atomic(folder / CFG_FILENAME, lambda p: p.write_text(json.dumps(out, indent=2, default=str)))
    return folder


def load_dictionary(folder: str | os.PathLike[str], *, device: str | torch.device = "cpu",
                    dtype: torch.dtype | None = None) -> Dictionary:
    """Read a dictionary from ``folder`` (written by bertscope or by SAELens's ``save_model`` /
    ``save_inference_model``). SAELens files are converted exactly: ``apply_b_dec_to_input=False`` is folded
    into ``b_enc`` (``b_enc + b_dec @ W_enc``), a TopK's ``rescale_acts_by_decoder_norm`` into unit-norm decoder
    rows (SAELens's ``_fold_norm_topk``). Raises :class:`DictionaryFormatError` when the folder holds no
    dictionary or one bertscope cannot represent."""
    folder = Path(folder)
    cfg_path, weights_path = folder / CFG_FILENAME, folder / WEIGHTS_FILENAME
    if not cfg_path.is_file() or not weights_path.is_file():
        raise DictionaryFormatError(f"{folder} is not a dictionary: it needs {CFG_FILENAME} and {WEIGHTS_FILENAME}")
    try:
        cfg = json.loads(cfg_path.read_text())
        state = load_file(str(weights_path))
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise DictionaryFormatError(f"{folder} is not a readable dictionary: {exc}") from None
    config, state = _from_saelens(cfg, state, folder)
    d = Dictionary(config, device=device, dtype=dtype or state["W_enc"].dtype)
    with torch.no_grad():
        for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
            getattr(d, name).copy_(state[name])
        if d.W_skip is not None:
            d.W_skip.copy_(state["W_skip"].T)
        if d.spec.load_threshold is not None:
            if "threshold" not in state:
                raise DictionaryFormatError(f"{folder}: {WEIGHTS_FILENAME} lacks the {config.arch} threshold")
            d.spec.load_threshold(d, state["threshold"])
    return d.eval()


def _from_saelens(cfg: dict[str, Any], state: dict[str, torch.Tensor],
                  folder: Path) -> tuple[DictionaryConfig, dict[str, torch.Tensor]]:
    arch = cfg.get("architecture", "standard")
    meta = dict(cfg.get("metadata") or {})
    ours = dict(meta.pop("bertscope", None) or {})
    found = architectures.from_saelens(arch, ours.get("arch"))
    if found is None:
        raise DictionaryFormatError(f"{folder}: SAELens architecture {arch!r} is not one bertscope reads "
                                    f"({', '.join(architectures.table.saelens_names())})")
    if cfg.get("normalize_activations", "none") != "none":
        raise DictionaryFormatError(f"{folder}: normalize_activations={cfg['normalize_activations']!r} needs a "
                                    "scaling step outside the weights; fold it in with SAELens first")
    missing = [k for k in ("W_enc", "b_enc", "W_dec", "b_dec") if k not in state]
    if missing:
        raise DictionaryFormatError(f"{folder}: {WEIGHTS_FILENAME} lacks {missing}")
    kind, bs_arch = found
    spec = architectures.get(bs_arch)
    state = {k: v.float() if v.dtype not in (torch.float32, torch.float64) else v for k, v in state.items()}
    if kind == "sae" and not cfg.get("apply_b_dec_to_input", True):
        state["b_enc"] = state["b_enc"] + state["b_dec"] @ state["W_enc"]
    if spec.saelens_in is not None:
        state = spec.saelens_in(cfg, state)
    k = ours.get("k", cfg.get("k"))
    if spec.uses_k and k is None:
        raise DictionaryFormatError(f"{folder}: a {bs_arch} dictionary without its k")
    site = ours.get("site", meta.get("hook_name"))
    site_out = ours.get("site_out", meta.get("hook_name_out")) if kind != "sae" else None
    extra = {key: v for key, v in ours.items() if key not in ("arch", "kind", "k", "site", "site_out")}
    if not ours:
        extra = {"saelens_metadata": meta}
    config = DictionaryConfig(d_in=int(cfg["d_in"]), d_sae=int(cfg["d_sae"]), arch=bs_arch,
                              k=int(k) if spec.uses_k else None, kind=kind,
                              d_out=int(cfg["d_out"]) if kind != "sae" else None, site=site,
                              site_out=site_out, metadata=extra)
    if not math.isfinite(float(state["W_enc"].sum())):
        raise DictionaryFormatError(f"{folder}: the weights hold NaN or infinity")
    return config, state


def _atomic(path: Path, write: Any) -> None:
    """``write(tmp)`` then rename onto ``path``: the file is whole or absent. Its mode is an ordinary new file's
    (``0666`` less the umask; safetensors alone writes ``0600``)."""
    tmp = path.with_name(path.name + ".partial")
    write(tmp)
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def is_dictionary(folder: str | os.PathLike[str]) -> bool:
    """True when ``folder`` holds ``cfg.json`` and ``sae_weights.safetensors``."""
    folder = Path(folder)
    return (folder / CFG_FILENAME).is_file() and (folder / WEIGHTS_FILENAME).is_file()
