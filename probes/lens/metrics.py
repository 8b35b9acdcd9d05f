"""Per-stream readout quality of a lens at masked positions, with sentence-bootstrap intervals.

For every stream: ``kl_to_final`` (``KL(p_final || p_lens)``, nats per masked position), ``top1_agreement`` (the lens'
top token is the model's) and ``masked_accuracy`` (the lens' top token is the token that was masked). Intervals are
percentile intervals of the group bootstrap over sentences (``probes.bootstrap.ratio_of_sums``: each statistic is
a sum over positions divided by the number of positions, sentences resampled).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from ..bootstrap import ratio_of_sums
from .logit import logit_lens
from .masking import MaskedStreams
from .tuned import TunedLens, kl_to_final

MEASURES = ("kl_to_final", "top1_agreement", "masked_accuracy")


@torch.no_grad()
def per_position(model: Any, data: MaskedStreams, lens: TunedLens | None = None, *, batch_size: int = 512,
                 bias: bool = True) -> np.ndarray:
    """``[measure, stream, n]``: the three measures at every masked position of every stream (logit lens when
    ``lens`` is None, else the tuned lens)."""
    n_streams = data.hidden.shape[0]
    out = np.zeros((len(MEASURES), n_streams, len(data)))
    target = data.target.to(model.device)
    for start in range(0, len(data), batch_size):
        sl = slice(start, start + batch_size)
        hidden = data.hidden[:, sl].to(model.device)
        final = logit_lens(model, hidden[-1], bias=bias).double()
        for s in range(n_streams):
            logits = (logit_lens(model, hidden[s], bias=bias) if lens is None
                      else lens.logits(model, hidden[s], s, bias=bias)).double()  # fmt: skip
            top = logits.argmax(-1)
            out[0, s, sl] = kl_to_final(final, logits).cpu().numpy()
            out[1, s, sl] = (top == final.argmax(-1)).cpu().numpy()
            out[2, s, sl] = (top == target[sl]).cpu().numpy()
    return out


def lens_metrics(model: Any, data: MaskedStreams, lens: TunedLens | None = None, *, n_boot: int = 1000,
                 level: float = 0.95, seed: int = 0, bias: bool = True) -> pd.DataFrame:
    """Long table, one row per (stream, measure): ``lens`` ("logit" or "tuned"), ``stream``, ``measure``, ``value``,
    ``low``, ``high`` (the ``level`` interval over ``n_boot`` sentence resamples), ``n_positions``, ``n_sentences``.
    Evaluate on held-out sentences: ``masked_streams`` of sentences the tuned lens was not fitted on."""
    values = per_position(model, data, lens, bias=bias)  # [measure, stream, n]
    sentences, group = np.unique(data.sentence.numpy(), return_inverse=True)
    n_groups = len(sentences)
    sums = np.zeros((n_groups, *values.shape[:2]))
    np.add.at(sums, group, np.moveaxis(values, -1, 0))
    counts = np.bincount(group, minlength=n_groups).astype(np.float64)[:, None, None]
    est = ratio_of_sums(sums, counts, n_boot=n_boot, level=level, seed=seed)
    rows = [
        {"lens": "logit" if lens is None else "tuned", "stream": s, "measure": m, "value": est.value[i, s],
         "low": est.low[i, s], "high": est.high[i, s], "n_positions": len(data), "n_sentences": n_groups}
        for s in range(values.shape[1]) for i, m in enumerate(MEASURES)
    ]  # fmt: skip
    return pd.DataFrame(rows)
