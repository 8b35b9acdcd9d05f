"""Dead-latent resampling (architectures whose ``revive`` is ``"resample"``), after Anthropic (2023)."""

from __future__ import annotations

import torch

from .settings import TrainSettings, TrainState


@torch.no_grad()
def resample_dead(state: TrainState, x: torch.Tensor, y: torch.Tensor, y_hat: torch.Tensor,
                   settings: TrainSettings) -> None:
    """Resampling after Anthropic (2023): each dead latent gets a batch row drawn with probability proportional
    to its squared reconstruction error; its decoder row becomes the unit direction of that row's error
    ``y - y_hat`` (what the dictionary misses; Anthropic used the input), its encoder column the same direction
    (a transcoder: the row's input direction) times 0.2 x the mean norm of the live encoder columns, its bias 0,
    its Adam moments 0 (and a JumpReLU threshold the smaller of its initial value and half the latent's new
    pre-activation on that row, so that it fires there: the architecture's ``revive_threshold``)."""
    d = state.dictionary
    dead = (state.tokens_since_fired >= settings.dead_tokens).to(x.device)
    n_dead = int(dead.sum())
    if n_dead == 0:
        return
    err = (y - y_hat).pow(2).sum(-1).float()
    if float(err.sum()) <= 0:
        return
    gen = torch.Generator().manual_seed(settings.seed * 7919 + int(state.tokens_since_fired.sum()) % 100_000)
    rows = torch.multinomial(err.cpu(), n_dead, replacement=n_dead > err.shape[0], generator=gen).to(x.device)
    alive = ~dead
    enc_norm = d.W_enc[:, alive].norm(dim=0).mean() if alive.any() else torch.tensor(1.0, device=x.device)
    err = (y - y_hat)[rows].to(d.W_dec.dtype)  # what the dictionary misses on that row
    dirs = err / err.norm(dim=-1, keepdim=True).clamp_min(1e-8)
    x_in = (x[rows] - d.b_dec) if d.is_sae else x[rows]  # what the encoder reads on those rows
    src = err if d.is_sae else x_in
    enc_dirs = src / src.norm(dim=-1, keepdim=True).clamp_min(1e-8)
    idx = dead.nonzero().squeeze(1)
    d.W_dec[idx] = dirs.to(d.W_dec.dtype) * (1.0 if d.spec.unit_norm_decoder else float(d.W_dec[alive].norm(
        dim=-1).mean()) if alive.any() else 1.0)
    d.W_enc[:, idx] = (enc_dirs * 0.2 * enc_norm).T.to(d.W_enc.dtype)
    d.b_enc[idx] = 0
    if d.spec.revive_threshold is not None:
        # the latent's new pre-activation on its row, for an architecture with a threshold to lower
        h_row = ((x_in * enc_dirs).sum(-1) * 0.2 * enc_norm).clamp_min(1e-6)
        d.spec.revive_threshold(d, idx, h_row, settings)
    for p in d.parameters():
        st = state.optimizer.state.get(p)
        if not st:
            continue
        for key in ("exp_avg", "exp_avg_sq"):
            if p is d.W_dec:
                st[key][idx] = 0
            elif p is d.W_enc:
                st[key][:, idx] = 0
            elif p is d.b_enc or p is d.log_threshold:
                st[key][idx] = 0
    state.tokens_since_fired[dead.cpu()] = 0


def resample_every(settings: TrainSettings) -> int:
    """Steps between resampling checks: one dead-latent window."""
    return max(1, settings.dead_tokens // settings.batch_size)
