"""What each latent fires on: its top activating rows and samples across its range of activations (the
quantile samples of SAELens's and Neuronpedia's dashboards), as one long table.

:func:`latent_samples` encodes rows in chunks, keeps every non-zero activation as a sparse triple (row, latent,
value) and picks, per latent, the ``n_top`` rows where it is largest (ties: the earlier row first) and up to
``per_bin`` rows drawn at random (seeded) from each of ``n_bins`` equal-width intervals of ``(0, max]``. The
caller's per-row metadata (sentence, position, token, ...) is joined on, so the experiments layer can add text.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd
import torch

from .models import Dictionary

#: columns of :func:`latent_samples`' table, before the caller's metadata
COLUMNS = ("latent", "kind", "rank", "bin", "bin_low", "bin_high", "value", "frequency", "max_value", "row")


@torch.no_grad()
def latent_samples(dictionary: Dictionary, rows: Iterable[tuple[torch.Tensor, pd.DataFrame]], *, n_top: int = 8,
                   n_bins: int = 4, per_bin: int = 4, seed: int = 0, chunk: int = 4096) -> pd.DataFrame:
    """Top activating rows and quantile samples of every latent that fires.

    ``rows``: pairs ``(x [n, d_in], meta)`` with ``meta`` a DataFrame of ``n`` rows (one per row of ``x``, in
    order). Returns one row per sample: ``latent``; ``kind`` (``"top"`` or ``"quantile"``); ``rank`` (0 = largest
    among the latent's top rows; within a bin, the draw's order); ``bin`` (-1 for top rows) and its interval
    ``bin_low``-``bin_high`` (fractions of ``max_value``); ``value``; ``frequency`` (fraction of all rows where the
    latent fires) and ``max_value``; ``row`` (index over all rows given) and ``meta``'s columns. Latents that never
    fire have no rows.
    """
    if n_top < 0 or n_bins < 0 or per_bin < 0:
        raise ValueError("n_top, n_bins and per_bin must be >= 0")
    device, dtype = dictionary.W_enc.device, dictionary.W_enc.dtype
    rs, ls, vs, metas = [], [], [], []
    n = 0
    for x, meta in rows:
        if len(meta) != len(x):
            raise ValueError(f"meta has {len(meta)} rows for {len(x)} activation rows")
        for i in range(0, len(x), chunk):
            f = dictionary.encode(x[i:i + chunk].to(device=device, dtype=dtype)).float().cpu()
            r, lat = torch.nonzero(f > 0, as_tuple=True)
            rs.append((r + n + i).numpy())
            ls.append(lat.numpy())
            vs.append(f[r, lat].numpy())
        metas.append(meta.reset_index(drop=True))
        n += len(x)
    if not rs:
        return pd.DataFrame(columns=list(COLUMNS))
    fired = pd.DataFrame({"latent": np.concatenate(ls), "row": np.concatenate(rs), "value": np.concatenate(vs)})
    stats = fired.groupby("latent")["value"].agg(frequency="size", max_value="max")
    stats["frequency"] = stats["frequency"] / max(n, 1)
    fired = fired.join(stats, on="latent")
    top = fired.sort_values(["latent", "value", "row"], ascending=[True, False, True], kind="stable")
    top = top.groupby("latent", sort=False).head(n_top).copy()
    top["kind"], top["bin"] = "top", -1
    top["rank"] = top.groupby("latent").cumcount()
    top["bin_low"], top["bin_high"] = np.nan, np.nan
    parts = [top]
    if n_bins and per_bin:
        q = fired.copy()
        q["bin"] = np.minimum((q["value"] / q["max_value"] * n_bins).astype(np.int64), n_bins - 1)
        q["key"] = np.random.default_rng(seed).random(len(q))
        q = q.sort_values(["latent", "bin", "key"], kind="stable").groupby(["latent", "bin"], sort=False).head(per_bin)
        q = q.drop(columns="key")
        q["kind"] = "quantile"
        q["rank"] = q.groupby(["latent", "bin"]).cumcount()
        q["bin_low"], q["bin_high"] = q["bin"] / n_bins, (q["bin"] + 1) / n_bins
        parts.append(q)
    out = pd.concat(parts, ignore_index=True)[list(COLUMNS)]
    out = out.assign(_quantile=out["kind"].ne("top")).sort_values(
        ["latent", "_quantile", "bin", "rank"], kind="stable", ignore_index=True).drop(columns="_quantile")
    meta = pd.concat(metas, ignore_index=True)
    return pd.concat([out, meta.iloc[out["row"].to_numpy()].reset_index(drop=True)], axis=1)
