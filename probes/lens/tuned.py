"""The tuned lens (Belrose et al. 2023, "Eliciting Latent Predictions from Transformers with the Tuned Lens"),
adapted to masked LMs.

Stream ``s`` (0 = embeddings .. n_layers - 1) gets an affine translator ``h + A_s h + b_s`` (``A_s``, ``b_s`` start
at zero, so an untrained tuned lens is the logit lens), read through the model's own masked-LM head (final LayerNorm
first in pre-LN models, as in ``logit_lens``). The last stream's translator is the identity: its lens is the model.
Training minimises, at masked positions, ``KL(p_final || p_lens)`` summed over streams (the paper's loss: the
final layer's distribution is the target), the model frozen; Adam here (the paper's SGD with Nesterov momentum
needs far more tokens than a CPU run has). Saved as one ``safetensors`` file with its shape in the header.

Shapes: ``s`` stream, ``n`` positions, ``m`` d_model, ``v`` vocab.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .logit import logit_lens, n_streams
from .masking import MaskedStreams


class TunedLens(nn.Module):
    """One affine translator per stream but the last: ``translate(h, s) = h + translators[s](h)``."""

    def __init__(self, d_model: int, n_streams: int) -> None:
        super().__init__()
        if n_streams < 1 or d_model < 1:
            raise ValueError(f"a tuned lens needs d_model >= 1 and n_streams >= 1, got {d_model}, {n_streams}")
        self.d_model, self.n_streams = d_model, n_streams
        self.translators = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(n_streams - 1)])
        for t in self.translators:
            nn.init.zeros_(t.weight)
            nn.init.zeros_(t.bias)

    @classmethod
    def for_model(cls, model: Any) -> TunedLens:
        """An identity-initialised tuned lens shaped for ``model`` (on its device, in its dtype)."""
        return cls(model.config.d_model, n_streams(model)).to(device=model.device, dtype=model.dtype)

    def translate(self, hidden: torch.Tensor, stream: int) -> torch.Tensor:
        """``hidden`` ``[..., d_model]`` of stream ``stream`` -> its translation ``[..., d_model]``."""
        if not 0 <= stream < self.n_streams:
            raise ValueError(f"stream must be in 0..{self.n_streams - 1}, got {stream}")
        if stream == self.n_streams - 1:
            return hidden
        return hidden + self.translators[stream](hidden)

    def logits(self, model: Any, hidden: torch.Tensor, stream: int, *, bias: bool = True) -> torch.Tensor:
        """The tuned lens of stream ``stream``: logits ``[..., vocab]`` through ``model``'s masked-LM head."""
        return logit_lens(model, self.translate(hidden, stream), bias=bias)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the lens to ``path`` (one ``.safetensors`` file, whole or not at all); returns the path."""
        from safetensors.torch import save_file

        path = Path(path)
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        meta = {"bertscope": json.dumps({"kind": "tuned-lens", "d_model": self.d_model, "n_streams": self.n_streams})}
        tmp = path.with_name(f".{path.name}.partial")
        save_file(state, str(tmp), metadata=meta)
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, device: str | torch.device = "cpu") -> TunedLens:
        """Read a lens written by ``save``."""
        from safetensors import safe_open
        from safetensors.torch import load_file

        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("bertscope", "{}"))
        if meta.get("kind") != "tuned-lens":
            raise ValueError(f"{path} is not a tuned lens saved by bertscope")
        lens = cls(int(meta["d_model"]), int(meta["n_streams"]))
        state = load_file(str(path))
        lens = lens.to(dtype=next(iter(state.values())).dtype) if state else lens
        lens.load_state_dict(state)
        return lens.to(device)


def kl_to_final(final_logits: torch.Tensor, lens_logits: torch.Tensor) -> torch.Tensor:
    """``KL(p_final || p_lens)`` per position, in nats: ``[..., vocab]`` twice -> ``[...]``."""
    final = torch.log_softmax(final_logits, dim=-1)
    lens = torch.log_softmax(lens_logits, dim=-1)
    return (final.exp() * (final - lens)).sum(-1)


def fit_tuned_lens(
    model: Any,
    data: MaskedStreams,
    *,
    epochs: int = 20,
    lr: float = 1e-3,
    batch_size: int = 256,
    seed: int = 0,
    lens: TunedLens | None = None,
) -> tuple[TunedLens, list[float]]:
    """Train a tuned lens on ``data`` (``masked_streams`` of the training sentences): returns the lens and the mean
    training loss (KL summed over streams, nats per position) of each epoch. The model is not changed."""
    if len(data) == 0:
        raise ValueError("no masked positions to train the tuned lens on")
    lens = TunedLens.for_model(model) if lens is None else lens
    frozen = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in frozen:
        p.requires_grad_(False)
    try:
        return lens, _train(model, lens, data, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed)
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
        lens.eval()


def _train(model: Any, lens: TunedLens, data: MaskedStreams, *, epochs: int, lr: float, batch_size: int,
           seed: int) -> list[float]:
    """``fit_tuned_lens``'s loop, the model's parameters frozen: the mean loss of each epoch."""
    hidden = data.hidden.to(model.device)
    with torch.no_grad():
        final = torch.cat([logit_lens(model, hidden[-1, i : i + batch_size]) for i in range(0, len(data), batch_size)])
    opt = torch.optim.Adam(lens.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(epochs):
        order = torch.randperm(len(data), generator=generator)
        total = 0.0
        for start in range(0, len(data), batch_size):
            idx = order[start : start + batch_size].to(model.device)
            loss = sum(kl_to_final(final[idx], lens.logits(model, hidden[s, idx], s)).sum()
                       for s in range(lens.n_streams - 1)) / len(idx)  # fmt: skip
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        losses.append(total / len(data))
    return losses
