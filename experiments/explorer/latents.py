"""Tokens coloured by a dictionary's latents: the explorer's latent view.

A *dictionary* is a sparse autoencoder or transcoder saved in SAELens's format (``bertscope sae train`` and
``bertscope run features`` write them: ``cfg.json`` + ``sae_weights.safetensors``); it reads one site of the
model (``config.site``, e.g. ``blocks.3.hook_resid_post``; a transcoder: its MLP input). For each chosen latent
and each real token of each sentence the view shows the latent's activation ``dictionary.encode(x)[latent]`` with
``x`` the token's row at that site, as the token's background (0 = none, the latent's largest value over the
page's sentences = full colour).

``load_for_model`` (an alias of ``bertscope.probes.dictionary.load_for_model``, its home) checks a folder against
a model (one-line ``ValueError``s: not a dictionary, a site the model lacks, another model's width or weights);
``latent_values`` runs the model once per chunk and returns, per sentence,
``[latent, n]`` activations over its real tokens; ``describe`` is the page's ``latents`` entry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from bertscope.probes.dictionary.placement import load_for_model

__all__ = ["describe", "load_for_model", "parse_latents", "latent_values"]


def parse_latents(latents: int | str | Sequence[int], d_sae: int) -> list[int]:
    """``3``, ``"3,17"`` or ``[3, 17]`` -> checked latent indices (each in ``0..d_sae-1``, no repeats);
    ``ValueError`` (one line) otherwise."""
    if isinstance(latents, (int, np.integer)):
        items: list[Any] = [int(latents)]
    elif isinstance(latents, str):
        items = [t.strip() for t in latents.split(",") if t.strip()]
    else:
        items = list(latents)
    out = []
    for t in items:
        try:
            i = int(t)
        except (TypeError, ValueError):
            raise ValueError(f"latent {t!r} is not an integer") from None
        if not 0 <= i < d_sae:
            raise ValueError(f"latent {i} is out of range: the dictionary has {d_sae} latents (0..{d_sae - 1})")
        out.append(i)
    if not out:
        raise ValueError("give at least one latent index")
    if len(set(out)) != len(out):
        raise ValueError(f"latents {','.join(map(str, out))} repeat a latent")
    return out


@torch.no_grad()
def latent_values(model: Any, dictionary: Any, inputs: Mapping[str, torch.Tensor], latents: Sequence[int],
                  positions: Sequence[np.ndarray], *, batch_size: int = 8) -> list[np.ndarray]:
    """Per sentence, ``[len(latents), n]`` float32 activations of ``latents`` at each real token (``positions``:
    the real positions in the padded batch ``inputs = model.tokenize(texts)``), from ``dictionary.encode`` of the
    rows at ``dictionary.config.site``."""
    site = dictionary.config.site
    idx = torch.as_tensor(list(latents), dtype=torch.long)
    device = next(model.parameters()).device
    n_texts = int(inputs["input_ids"].shape[0])
    out: list[np.ndarray] = []
    for start in range(0, n_texts, batch_size):
        chunk = {k: v[start:start + batch_size] for k, v in inputs.items()}
        _, cache = model.run_with_cache(chunk["input_ids"], chunk["attention_mask"], chunk.get("token_type_ids"),
                                        names_filter=lambda name: name == site)
        x = cache[site].to(device=device, dtype=torch.float32)  # [batch, pos, d_in]
        f = dictionary.encode(x)[..., idx.to(x.device)]  # [batch, pos, latent]
        for b in range(f.shape[0]):
            real = torch.as_tensor(positions[start + b], dtype=torch.long, device=f.device)
            out.append(f[b, real].T.float().cpu().numpy().astype(np.float32))
    return out


def describe(dictionary: Any, latents: Sequence[int], values: Sequence[np.ndarray], name: str) -> dict:
    """The page's ``latents`` entry: ``{"dictionary": name, "site", "kind", "d_sae", "ids": [...], "vmax":
    [per latent: its largest activation over the sentences, or 0]}``. ``name`` is what the page calls the
    dictionary (a folder's name, never a full local path: pages get shared)."""
    cfg = dictionary.config
    vmax = [float(max((float(v[j].max(initial=0.0)) for v in values), default=0.0)) for j in range(len(latents))]
    return {"dictionary": name, "site": cfg.site, "site_out": cfg.site_out if cfg.kind != "sae" else None,
            "kind": cfg.kind, "d_sae": int(cfg.d_sae), "ids": [int(i) for i in latents], "vmax": vmax}
