"""The context-free weight view of the same-token experiment: does a head's W_QK rank a token's own key first?

For a seeded sample of vocabulary tokens, each token alone is embedded with the position embedding replaced
by its mean (``x = LN(word + type 0 + mean position)``: exact input for layer 0 of a post-LN model, a
direct-path approximation for later layers). Per head, ``(x W_Q + b_Q)(x W_K + b_K)^T`` scores every sampled
key; the same for raw attention ``x x^T`` on the word embeddings and on the embedding output.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch
from bertscope.probes.bootstrap import mean_of_groups

WeightKey = tuple[str, str, int, int]  # (source, site, layer, head)
WEIGHT_METRICS = ("qk_self_top1", "qk_self_percentile")


def weight_view(
    model: Any,
    *,
    n_tokens: int = 2000,
    seed: int = 0,
    n_boot: int = 1000,
    level: float = 0.95,
    token_ids: list[int] | None = None,
) -> pd.DataFrame:
    """Context-free self-preference: for a seeded sample of ``n_tokens`` vocabulary tokens (specials and
    ``[unused*]`` excluded; or exactly ``token_ids``), does a token's query score its own key above every
    other sampled key?

    Metrics per head (source ``head``, site ``blocks.L.attn.W_QK``): ``qk_self_top1`` (share of tokens whose
    own key scores highest; null ``1/n_tokens``) and ``qk_self_percentile`` (share of other keys scoring
    below the own key; null 0.5); the same for raw attention ``x x^T`` on the word embeddings and on the
    embedding output (source ``raw``). Percentile bootstrap CIs at ``level`` over the sampled tokens.
    Corpus ``vocab-sample``.
    """
    token_ids = sample_tokens(model.tokenizer, n_tokens, seed) if token_ids is None else token_ids
    n_tokens = len(token_ids)
    if n_tokens < 2 or len(set(token_ids)) != n_tokens:
        raise ValueError(f"token_ids must hold at least 2 distinct ids; got {n_tokens}, {len(set(token_ids))} distinct")
    per_token = self_preferences(model, token_ids)
    return weight_rows(per_token, n_tokens, n_boot=n_boot, level=level, seed=seed)


def sample_tokens(tok: Any, n_tokens: int, seed: int) -> list[int]:
    """A seeded sample of ``n_tokens`` ordinary vocabulary ids (no specials, no ``[unused*]``), sorted."""
    special = set(tok.all_special_ids)
    candidates = sorted(i for t, i in tok.get_vocab().items() if i not in special and not t.startswith("[unused"))
    if len(candidates) < n_tokens:
        raise ValueError(f"the vocabulary has {len(candidates)} ordinary tokens; ask for n_tokens <= that")
    pick = torch.randperm(len(candidates), generator=torch.Generator().manual_seed(seed))[:n_tokens]
    return torch.tensor(candidates)[pick.sort().values].tolist()


def self_preferences(model: Any, token_ids: list[int]) -> dict[WeightKey, tuple[torch.Tensor, torch.Tensor]]:
    """Per (source, site, layer, head): ``(top1 [token], percentile [token])`` of ``self_preference``."""
    ids = torch.tensor(token_ids)[:, None].to(model.device)  # each token alone: [n_tokens, 1]
    rows = model.W_pos_tokens  # the rows tokens read (after RoBERTa's offset); None: rotary/relative positions
    mean_pos = None if rows is None else rows[1:128].mean(0)

    def mean_position(x: torch.Tensor, hook: Any) -> torch.Tensor:
        return mean_pos.to(x.dtype).expand_as(x)

    with torch.no_grad():
        _, cache = model.run_with_cache(
            ids,
            names_filter=["embed.hook_word", "embed.hook_out"],
            fwd_hooks=[] if mean_pos is None else [("embed.hook_pos", mean_position)],
            stop_at_layer=0,
        )
        word, x = cache["embed.hook_word"][:, 0].float(), cache["embed.hook_out"][:, 0].float()
        per_token = {("raw", "embed.hook_word", -1, -1): self_preference(word, word)}
        per_token[("raw", "embed.hook_out", -1, -1)] = self_preference(x, x)
        for layer, block in enumerate(model.blocks):
            attn = block.attn
            q = torch.einsum("nm,hmd->hnd", x, attn.W_Q.float()) + attn.b_Q.float()[:, None]
            k = torch.einsum("nm,hmd->hnd", x, attn.W_K.float()) + attn.b_K.float()[:, None]
            for head in range(model.config.n_heads):
                per_token[("head", f"blocks.{layer}.attn.W_QK", layer, head)] = self_preference(q[head], k[head])
    return per_token


def weight_rows(
    per_token: dict[WeightKey, tuple[torch.Tensor, torch.Tensor]],
    n_tokens: int,
    *,
    n_boot: int,
    level: float,
    seed: int,
) -> pd.DataFrame:
    """Long rows of the weight view: mean over tokens with a token-bootstrap interval, nulls and ratios."""
    keys = [(*key, metric) for key in per_token for metric in WEIGHT_METRICS]
    values = np.stack([v.numpy() for pair in per_token.values() for v in pair], axis=1)  # [token, key x metric]
    out, _ = mean_of_groups(values, n_boot=n_boot, level=level, seed=seed)
    rows = []
    for i, (source, site, layer, head, metric) in enumerate(keys):
        null = 1 / n_tokens if metric == "qk_self_top1" else 0.5
        value = float(out.value[i])
        rows.append({
            "corpus": "vocab-sample", "source": source, "site": site, "layer": layer, "head": head,
            "weighting": "weights", "metric": metric, "value": value,
            "ci_low": float(out.low[i]), "ci_high": float(out.high[i]),
            "null": null, "null_kind": "uniform", "ratio": value / null,
            "ratio_ci_low": float(out.low[i]) / null, "ratio_ci_high": float(out.high[i]) / null,
            "null_uniform": null, "ratio_uniform": value / null, "n_queries": n_tokens, "n_sentences": 0,
        })  # fmt: skip
    return pd.DataFrame(rows)


def self_preference(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [token, d]: per token, whether its own key scores highest (ties count) and the share of
    other keys scoring strictly below it -> (top1 [token], percentile [token]) as float64.

    The own key is in its row, so it scores highest iff it equals the row's maximum, and it is never strictly
    below itself, so the diagonal needs no mask."""
    scores = q @ k.T  # [query token, key token]
    own = scores.diagonal()
    top1 = scores.amax(-1) == own
    below = (scores < own[:, None]).sum(-1)
    return top1.double().cpu(), (below.double() / (len(q) - 1)).cpu()
