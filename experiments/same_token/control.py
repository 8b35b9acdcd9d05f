"""Repeated-random's non-repeating control, and the copy-specific mass it yields.

``repeated-random`` holds m random single-piece words followed by the same m again, so every copy sits m
positions away. Its offset-matched null is undefined (every content pair at offset m is a copy) and the
uniform fallback cannot tell a head that copies from one that simply attends m tokens back. The control
``random-control`` holds 2m *distinct* words from the same pool (same length, same token distribution, no
repeats); reading its position i + m as the would-be copy of i (:func:`shadow_ids`), its ``duplicate`` mass
is what a head puts at the copy offset without copies. ``duplicate_copy_specific`` = repeated-random's
duplicate mass minus the control's, per head.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pandas as pd
import torch
from bertscope.experiments.same_token.measures import Tallies, boot_weights, metric_value
from bertscope.probes.bootstrap import percentile_interval

RANDOM_CORPUS = "repeated-random"
CONTROL_CORPUS = "random-control"  # repeated-random's non-repeating control


def control_corpus(tokenizer: Any, n_sentences: int, *, m: int, seed: int = 0) -> Any:
    """The non-repeating control of ``repeated-random``: ``n_sentences`` sequences of 2m distinct words drawn
    from the same single-piece vocabulary pool (same length, same token distribution, no repeats)."""
    from bertscope.experiments.corpus import Corpus, Sentence, single_piece_words

    pool = single_piece_words(tokenizer)
    if len(pool) < 2 * m:
        raise ValueError(f"the tokenizer has {len(pool)} single-piece words; the control needs 2m = {2 * m}")
    rng = random.Random(f"bertscope-random-control/{seed}/{m}")
    sentences = []
    for i in range(n_sentences):
        words = tuple(rng.sample(pool, 2 * m))
        sentences.append(Sentence(id=f"{CONTROL_CORPUS}/{seed}/{i}", words=words, text=" ".join(words)))
    meta = {"m": m, "seed": seed, "n_sentences": n_sentences, "pool_size": len(pool)}
    return Corpus(name=CONTROL_CORPUS, source=f"random without repeats (2m={2 * m}, seed={seed})",
                  sentences=sentences, meta=meta)


def shadow_ids(ids: torch.Tensor, mask: torch.Tensor, m: int | None) -> torch.Tensor:
    """ids [batch, pos] with positions m+1..2m relabelled as copies of 1..m (the control's would-be copies);
    unchanged when ``m`` is None."""
    if m is None:
        return ids
    if not bool((mask.sum(-1) == 2 * m + 2).all()):
        raise ValueError(f"the control's sequences must hold 2m + 2 = {2 * m + 2} tokens with [CLS] and [SEP]")
    out = ids.clone()
    out[:, m + 1 : 2 * m + 1] = ids[:, 1 : m + 1]
    return out


def copy_specific(
    repeated: dict[str, np.ndarray],
    control: dict[str, np.ndarray],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> pd.DataFrame:
    """Per head and weighting: duplicate mass on repeated-random minus the mass the same head puts at the copy
    offset (+-m) on the non-repeating control, with a percentile group-bootstrap interval (the sentences of
    each corpus resampled independently). ``repeated``, ``control``: :func:`.collect.collect`'s arrays.

    Rows like the results table: corpus repeated-random, metric ``duplicate_copy_specific``, ``null`` = the
    control's mass (null_kind ``control``), ratio = repeated / control.
    """
    n_heads = int(repeated["n_heads"])
    weightings = list(dict.fromkeys(k.split("|")[1] for k in repeated if k.startswith("head|")))
    frames = []
    for weighting in weightings:
        draws, sizes = [], []
        for k, arrays in enumerate((repeated, control)):
            t = Tallies.from_arrays(arrays, f"head|{weighting}|")
            draws.append(metric_value(t, "duplicate", boot_weights(t.n_sentences, n_boot=n_boot, seed=seed + k)))
            sizes.append(t.n_sentences)
        rep, ctrl = draws
        diff, ratio = rep - ctrl, rep / ctrl
        low, high = percentile_interval(diff[1:].numpy(), level)
        r_low, r_high = percentile_interval(ratio[1:].numpy(), level)
        heads = np.arange(diff.shape[1])
        frames.append(pd.DataFrame({
            "corpus": RANDOM_CORPUS, "source": "head",
            "site": [f"blocks.{h // n_heads}.attn.hook_pattern" for h in heads],
            "layer": heads // n_heads, "head": heads % n_heads, "weighting": weighting,
            "metric": "duplicate_copy_specific", "value": diff[0].numpy(), "ci_low": low, "ci_high": high,
            "null": ctrl[0].numpy(), "null_kind": "control", "ratio": ratio[0].numpy(),
            "ratio_ci_low": r_low, "ratio_ci_high": r_high, "n_sentences": sizes[0],
        }))  # fmt: skip
    return pd.concat(frames, ignore_index=True)
