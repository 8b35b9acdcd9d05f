"""Streaming training of one or several dictionaries in one pass over a source of activation batches.

``train_dictionaries(source, configs, settings)`` reads the source through a shuffle buffer (memory bounded by
``settings.buffer_rows`` whatever the source's size), normalises every site to mean norm ``sqrt(d)`` (SAELens's
``expected_average_only_in``; the factor is folded back into the returned weights), initialises ``b_dec`` from
the first buffer (geometric median by default), trains with Adam, tracks dead latents (no activation over the
last ``dead_tokens`` tokens) and revives them (``relu`` / ``jumprelu``: resampling; ``topk`` / ``batchtopk``: the
AuxK loss), checkpoints every ``checkpoint_tokens`` tokens and resumes from the last checkpoint. Deterministic
per ``seed`` (on one device and thread count).

Data parallel: inside an initialised ``torch.distributed`` group (``torchrun``; gloo on CPU, nccl on CUDA) every
process reads the same stream and buffer, trains on its equal share of each batch (rows ``rank::world``) and
averages gradients, dead-latent counts and resampling inputs over the group, so every process holds the same
dictionary, equal to one process's within float summation order (``tests/test_dictionary_distributed.py``).
Checkpoints are written by rank 0. BatchTopK (a selection over the whole batch) is refused.
"""

from __future__ import annotations

import math
import os
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from .data import SPECIAL_CLASSES, EpochBuffer, RowReader, ShuffleBuffer
from .models import (
    UNIT_NORM_DECODER,
    Dictionary,
    DictionaryConfig,
    JumpReLUFunction,
    SparseDecodeFunction,
    StepFunction,
    TopKEncodeFunction,
    batch_topk_activation,
    topk_activation,
)

CHECKPOINT_NAME = "checkpoint.pt"


@dataclass(frozen=True)
class TrainSettings:
    """How to train (not saved into the dictionary's identity; recorded in its metadata).

    Sizes are in tokens (rows). ``buffer_rows`` bounds memory: a re-iterable source whose kept rows fit in it
    is read once (one pass of the model, or one read of a capture) and every epoch is a fresh shuffle of it in
    memory; a larger one streams through a shuffle buffer of that many rows. ``lr`` Adam's learning rate,
    decayed linearly to 0 over the last ``lr_decay_fraction`` of ``tokens``; gradients clipped to norm 1
    (SAELens). ``l1_coefficient`` /
    ``l1_warm_up_tokens``: the ``relu`` penalty and its linear warm-up from 0; ``l0_coefficient`` /
    ``l0_warm_up_tokens``, ``jumprelu_bandwidth``, ``jumprelu_init_threshold``: JumpReLU (SAELens defaults 0.05
    and 0.01); ``aux_coefficient``: AuxK (SAELens 1.0); ``topk_threshold_lr``: BatchTopK's threshold average
    (SAELens 0.01). ``b_dec_init``: ``"geometric_median"``, ``"mean"`` or ``"zeros"``. ``normalise``: scale
    inputs to mean norm ``sqrt(d)`` while training (folded back at the end). ``include_special``: train on
    special tokens and padding too.
    """

    tokens: int = 2_000_000
    batch_size: int = 4096
    buffer_rows: int = 262_144
    lr: float = 3e-4
    lr_decay_fraction: float = 0.2
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    l1_coefficient: float = 5.0
    l1_warm_up_tokens: int = 0
    l0_coefficient: float = 1e-3
    l0_warm_up_tokens: int = 0
    jumprelu_bandwidth: float = 0.05
    jumprelu_init_threshold: float = 0.01
    aux_coefficient: float = 1.0
    topk_threshold_lr: float = 0.01
    dead_tokens: int = 200_000
    resample: bool = True
    b_dec_init: str = "geometric_median"
    normalise: bool = True
    include_special: bool = False
    exclude_classes: tuple[str, ...] = SPECIAL_CLASSES
    checkpoint_tokens: int | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        if self.b_dec_init not in ("geometric_median", "mean", "zeros"):
            raise ValueError(f"b_dec_init must be geometric_median, mean or zeros, got {self.b_dec_init!r}")
        if self.tokens < self.batch_size:
            raise ValueError(f"tokens ({self.tokens}) must be at least one batch ({self.batch_size})")

    @property
    def excluded(self) -> tuple[str, ...]:
        """Token classes left out of training."""
        return () if self.include_special else self.exclude_classes


@dataclass
class _State:
    """One dictionary's training state."""

    dictionary: Dictionary
    optimizer: torch.optim.Optimizer
    scale_in: float = 1.0
    scale_out: float = 1.0
    tokens_since_fired: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    last: dict[str, float] = field(default_factory=dict)


class TrainingInterrupted(RuntimeError):
    """Raised by a ``stop_after_tokens`` test hook: the run stops right after a checkpoint."""


def train_dictionaries(
    source: Iterable,
    configs: Mapping[str, DictionaryConfig] | DictionaryConfig,
    settings: TrainSettings | None = None,
    *,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    resume: bool = True,
    stop_after_tokens: int | None = None,
) -> dict[str, Dictionary]:
    """Train dictionaries on a stream of activations; returns name -> trained :class:`Dictionary` (eval mode,
    input normalisation folded in, ``config.metadata`` recording tokens, classes and settings).

    ``source``: an iterable of :class:`ActivationBatch` (or dicts site -> ``[rows, d]``, or, for one
    dictionary, plain tensors ``[rows, d]``). A re-iterable source is read again from the start when ``tokens``
    asks for more rows than it holds; a resumed run must get the same source. ``configs``: name ->
    :class:`DictionaryConfig` (each names its ``site``, and a transcoder its ``site_out``); one config alone is
    named by its site. ``checkpoint_dir``: where ``checkpoint.pt`` is written (every
    ``settings.checkpoint_tokens`` tokens, at the end of a buffer round, atomically) and, with ``resume``, read
    back. ``stop_after_tokens`` stops (raising :class:`TrainingInterrupted`) after the first checkpoint past that
    many tokens: how tests interrupt a run.
    """
    settings = settings or TrainSettings()
    rank, world = _world()
    if world > 1 and settings.batch_size % world:
        raise ValueError(f"batch_size {settings.batch_size} must split evenly over {world} processes")
    if isinstance(configs, DictionaryConfig):
        configs = {configs.site or "x": configs}
    configs = dict(configs)
    if world > 1 and any(c.arch == "batchtopk" for c in configs.values()):
        raise ValueError("batchtopk selects over the whole batch: data-parallel training does not support it")
    sites = _sites(configs)
    single = next(iter(sites)) if len(sites) == 1 else None
    reader = RowReader(source, sites, exclude=settings.excluded, single_site=single)
    capacity = max(2 * settings.batch_size, settings.buffer_rows - settings.buffer_rows % (2 * settings.batch_size))
    whole = reader.read_whole(settings.buffer_rows)
    buffer: ShuffleBuffer | EpochBuffer = (EpochBuffer(whole, settings.batch_size, settings.seed) if whole is not None
                                           else ShuffleBuffer(reader, capacity, settings.batch_size, settings.seed))
    device, dtype = torch.device(settings.device), getattr(torch, settings.dtype)
    torch.manual_seed(settings.seed)
    states = {name: _new_state(cfg, settings, _generator(settings.seed, name), device, dtype)
              for name, cfg in configs.items()}
    ckpt = Path(checkpoint_dir) / CHECKPOINT_NAME if checkpoint_dir is not None else None
    trained, last_ckpt = 0, 0
    if ckpt is not None and resume and ckpt.exists():
        trained = _load_checkpoint(ckpt, states, buffer, reader, settings, configs)
        last_ckpt = trained
    else:
        _initialise(states, buffer.fill(), settings, device, dtype)
    total_steps = settings.tokens // settings.batch_size
    bar = tqdm(total=total_steps * settings.batch_size, initial=trained, unit="tok", unit_scale=True,
               disable=not settings.progress or rank > 0, desc="training dictionaries")
    step = trained // settings.batch_size
    try:
        while step < total_steps:
            emitted = 0
            for acts, _codes in buffer.next_round():
                if step >= total_steps:
                    break
                for _name, state in states.items():
                    _train_step(state, acts, step, total_steps, settings, device, dtype)
                step += 1
                emitted += 1
                trained = step * settings.batch_size
                bar.update(settings.batch_size)
                bar.set_postfix(_postfix(states), refresh=False)
            if emitted == 0:
                break  # the source ran out
            if ckpt is not None and settings.checkpoint_tokens and trained - last_ckpt >= settings.checkpoint_tokens \
                    and step < total_steps:
                if rank == 0:
                    _save_checkpoint(ckpt, states, buffer, reader, trained, settings)
                if world > 1:
                    torch.distributed.barrier()
                last_ckpt = trained
                if stop_after_tokens is not None and trained >= stop_after_tokens:
                    raise TrainingInterrupted(f"stopped after a checkpoint at {trained} tokens")
    finally:
        bar.close()
    return {name: _finish(state, trained, reader, buffer, settings) for name, state in states.items()}


# ---------------------------------------------------------------------------------------------- setup
def _generator(seed: int, name: str) -> torch.Generator:
    """Each dictionary's own initialisation stream, from the seed and its name (so a dictionary trained with
    others in one pass starts where it would alone)."""
    return torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))


def _sites(configs: Mapping[str, DictionaryConfig]) -> list[str]:
    sites: list[str] = []
    for name, cfg in configs.items():
        if cfg.site is None:
            configs[name] = cfg = replace(cfg, site=name)  # type: ignore[index]
        for s in (cfg.site, cfg.site_out or cfg.site):
            if s not in sites:
                sites.append(s)
    return sites


def _new_state(cfg: DictionaryConfig, settings: TrainSettings, gen: torch.Generator, device: torch.device,
               dtype: torch.dtype) -> _State:
    d = Dictionary(cfg, device=device, dtype=dtype)
    d.init_weights(gen, jumprelu_threshold=settings.jumprelu_init_threshold)
    opt = torch.optim.Adam(d.parameters(), lr=settings.lr, betas=(0.9, 0.999))
    return _State(d, opt, tokens_since_fired=torch.zeros(cfg.d_sae, dtype=torch.int64))


@torch.no_grad()
def _initialise(states: Mapping[str, _State], first: tuple[dict[str, torch.Tensor], torch.Tensor],
                settings: TrainSettings, device: torch.device, dtype: torch.dtype) -> None:
    acts, codes = first
    if codes.shape[0] < settings.batch_size:
        raise ValueError(f"the source holds {codes.shape[0]} usable tokens, fewer than one batch "
                         f"({settings.batch_size}); special tokens and padding are left out unless include_special")
    for state in states.values():
        cfg = state.dictionary.config
        x, y = acts[cfg.site].float(), acts[cfg.site_out or cfg.site].float()
        if x.shape[1] != cfg.d_in or y.shape[1] != cfg.width_out:
            raise ValueError(f"site {cfg.site!r} has width {x.shape[1]} (output {y.shape[1]}); the dictionary "
                             f"expects {cfg.d_in} (output {cfg.width_out})")
        if settings.normalise:
            state.scale_in = norm_scaling_factor(x)
            state.scale_out = state.scale_in if cfg.kind == "sae" else norm_scaling_factor(y)
        y = y * state.scale_out
        if settings.b_dec_init == "geometric_median":
            b = geometric_median(y[:8192])
        elif settings.b_dec_init == "mean":
            b = y.mean(0)
        else:
            b = torch.zeros(y.shape[1])
        state.dictionary.b_dec.copy_(b.to(device=device, dtype=dtype))


def norm_scaling_factor(x: torch.Tensor) -> float:
    """SAELens's ``estimate_scaling_factor``: ``sqrt(d) / mean_row ||x||`` (rows ``[n, d]``), the factor that
    gives the activations mean norm ``sqrt(d)``."""
    return float(math.sqrt(x.shape[1]) / x.float().norm(dim=-1).mean())


def geometric_median(x: torch.Tensor, *, max_iter: int = 100, tol: float = 1e-6) -> torch.Tensor:
    """The geometric median of rows ``x [n, d]`` (Weiszfeld's iteration, as SAELens's ``compute_geometric_median``
    before 6.x), started from the mean: the point minimising the sum of Euclidean distances."""
    x = x.double()
    m = x.mean(0)
    for _ in range(max_iter):
        w = 1.0 / (x - m).norm(dim=-1).clamp_min(1e-8)
        new = (w[:, None] * x).sum(0) / w.sum()
        if (new - m).norm() <= tol * max(1.0, float(m.norm())):
            m = new
            break
        m = new
    return m.float()


# ---------------------------------------------------------------------------------------------- one step
def _train_step(state: _State, acts: dict[str, torch.Tensor], step: int, total_steps: int,
                settings: TrainSettings, device: torch.device, dtype: torch.dtype) -> None:
    d = state.dictionary
    cfg = d.config
    x = (acts[cfg.site].to(device=device, dtype=dtype)) * state.scale_in
    y = x if cfg.kind == "sae" else acts[cfg.site_out].to(device=device, dtype=dtype) * state.scale_out
    x_all, y_all = x, y
    rank, world = _world()
    if world > 1:  # data parallel: this rank's equal share of the batch; gradients averaged below
        x, y = x[rank::world], y[rank::world]
    tokens = step * settings.batch_size
    for group in state.optimizer.param_groups:
        group["lr"] = settings.lr * _lr_factor(step, total_steps, settings.lr_decay_fraction)
    dead = state.tokens_since_fired.to(device) >= settings.dead_tokens
    if cfg.arch == "topk" and d.W_skip is None:  # the sparse form: no dense [rows, d_sae] activations
        loss, values, indices, y_hat = topk_loss(d, x, y, settings, dead=dead)
        active = values.detach() > 0
        fired = torch.zeros(cfg.d_sae, dtype=torch.bool, device=values.device)
        fired[indices[active]] = True
        l0 = float(active.sum(-1).float().mean())
    else:
        loss, f, y_hat = dictionary_loss(d, x, y, settings, tokens=tokens, dead=dead)
        fired = (f > 0).any(0)
        l0 = float((f > 0).sum(-1).float().mean())
    state.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if world > 1:
        for p in d.parameters():
            if p.grad is not None:
                torch.distributed.all_reduce(p.grad)
                p.grad /= world
    if cfg.arch in UNIT_NORM_DECODER:
        d.remove_parallel_gradient()
    torch.nn.utils.clip_grad_norm_(d.parameters(), 1.0)
    state.optimizer.step()
    with torch.no_grad():
        if cfg.arch in UNIT_NORM_DECODER:
            d.normalise_decoder()
        if cfg.arch == "batchtopk":
            positive = f > 0
            if positive.any():
                lr = settings.topk_threshold_lr
                d.batch_threshold.mul_(1 - lr).add_(lr * f[positive].min())
        if world > 1:
            fired = fired.to(torch.int32)
            torch.distributed.all_reduce(fired, op=torch.distributed.ReduceOp.MAX)
            fired = fired.bool()
        state.tokens_since_fired += x_all.shape[0]
        state.tokens_since_fired[fired.cpu()] = 0
        if settings.resample and cfg.arch in ("relu", "jumprelu") and (step + 1) % _resample_every(settings) == 0:
            # every rank resamples from the whole batch, with the same pre-step reconstruction
            y_hat_all = _pre_step_prediction(state, x_all, y_hat, rank, world) if world > 1 else y_hat
            _resample_dead(state, x_all, y_all, y_hat_all, settings)
        resid = (y - y_hat).float()
        state.last = {"l0": l0,
                      "ev": float(1 - resid.pow(2).sum(-1).mean() / (y - y.mean(0)).float().pow(2).sum(-1).mean()),
                      "dead": float((state.tokens_since_fired >= settings.dead_tokens).float().mean())}


def _world() -> tuple[int, int]:
    """(rank, world size) of the running ``torch.distributed`` group, (0, 1) without one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _pre_step_prediction(state: _State, x_all: torch.Tensor, y_hat: torch.Tensor, rank: int,
                         world: int) -> torch.Tensor:
    """The whole batch's reconstruction before this step's update, gathered from the ranks' shares (rows
    ``rank::world``), in the batch's row order."""
    parts = [torch.empty_like(y_hat) for _ in range(world)]
    torch.distributed.all_gather(parts, y_hat.detach().contiguous())
    out = torch.empty(x_all.shape[0], y_hat.shape[1], dtype=y_hat.dtype, device=y_hat.device)
    for r, part in enumerate(parts):
        out[r::world] = part
    return out


def dictionary_loss(d: Dictionary, x: torch.Tensor, y: torch.Tensor, settings: TrainSettings, *, tokens: int,
                    dead: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training loss of one batch (normalised space): ``(loss, f [rows, d_sae], y_hat [rows, d_out])``.

    ``mse = sum_d (y_hat - y)^2`` averaged over rows (SAELens's ``mse_loss``), plus by architecture
    ``relu``: ``l1(t) * mean_rows sum_i f_i ||W_dec[i]||``; ``jumprelu``: ``l0(t) * mean_rows sum_i
    step(h_i - theta_i)`` (straight-through, SAELens ``"step"`` mode); ``topk`` / ``batchtopk``: AuxK, SAELens's
    ``calculate_topk_aux_loss``: the top ``k_aux = d_in // 2`` pre-activations among ``dead`` latents, decoded
    (with ``b_dec``), against the detached residual ``y - y_hat``: ``aux * min(n_dead / k_aux, 1) * mean_rows
    sum_d (decode(aux_acts) - residual)^2``. Coefficients ``l1(t)``, ``l0(t)`` ramp linearly from 0 over their
    warm-up tokens.
    """
    cfg = d.config
    if cfg.arch == "topk" and d.W_skip is None:
        loss, values, indices, y_hat = topk_loss(d, x, y, settings, dead=dead)
        f = torch.zeros(x.shape[0], cfg.d_sae, dtype=values.dtype, device=values.device).scatter_(
            -1, indices, values.detach())
        return loss, f, y_hat
    h = d.pre_activation(x)
    if cfg.arch == "relu":
        f = h.relu()
    elif cfg.arch == "topk":
        f = topk_activation(h, cfg.k)
    elif cfg.arch == "batchtopk":
        f = batch_topk_activation(h, cfg.k)
    else:
        f = JumpReLUFunction.apply(h, d.threshold, settings.jumprelu_bandwidth)
    y_hat = d.decode(f, x)
    loss = (y_hat - y).pow(2).sum(-1).mean()
    if cfg.arch == "relu":
        coef = settings.l1_coefficient * _warm_up(tokens, settings.l1_warm_up_tokens)
        loss = loss + coef * (f * d.W_dec.norm(dim=1)).sum(-1).mean()
    elif cfg.arch == "jumprelu":
        coef = settings.l0_coefficient * _warm_up(tokens, settings.l0_warm_up_tokens)
        loss = loss + coef * StepFunction.apply(h, d.threshold, settings.jumprelu_bandwidth).sum(-1).mean()
    elif dead is not None and int(dead.sum()) > 0:
        loss = loss + settings.aux_coefficient * auxk_loss(d, h, y, y_hat, dead)
    return loss, f, y_hat


def topk_loss(d: Dictionary, x: torch.Tensor, y: torch.Tensor, settings: TrainSettings, *,
              dead: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`dictionary_loss` of a TopK dictionary (no skip path) on its sparse form: ``(loss, values [rows, k],
    indices [rows, k], y_hat [rows, d_out])``, the ``k`` kept activations of each row (after ReLU) and their
    latents. The encoder's backward and the decoder (forward and backward) touch only the ``k`` active latents
    of each row (:class:`TopKEncodeFunction`, :class:`SparseDecodeFunction`), AuxK only the dead latents'
    pre-activations: the same loss and gradients as the dense formulas."""
    cfg = d.config
    x_in = x.to(d.W_enc.dtype)
    values, indices = TopKEncodeFunction.apply(x_in, d.b_dec if d.is_sae else None, d.W_enc, d.b_enc, cfg.k)
    values = values.relu()
    y_hat = SparseDecodeFunction.apply(values, indices, d.W_dec) + d.b_dec
    loss = (y_hat - y).pow(2).sum(-1).mean()
    if dead is not None and int(dead.sum()) > 0:
        cols = dead.nonzero().squeeze(1)
        shifted = x_in - d.b_dec if d.is_sae else x_in
        h_dead = torch.addmm(d.b_enc[cols], shifted, d.W_enc[:, cols])
        loss = loss + settings.aux_coefficient * _auxk_on_dead(d, h_dead, cols, y, y_hat)
    return loss, values, indices, y_hat


def auxk_loss(d: Dictionary, h: torch.Tensor, y: torch.Tensor, y_hat: torch.Tensor, dead: torch.Tensor) -> torch.Tensor:
    """SAELens's TopK auxiliary loss without its coefficient: ``min(n_dead / k_aux, 1) * mean_rows sum_d
    (aux_acts @ W_dec + b_dec - (y - y_hat).detach())^2`` with ``k_aux = min(d_in // 2, n_dead)`` largest
    pre-activations ``h`` among the ``dead`` latents (``[d_sae]`` bool)."""
    n_dead = int(dead.sum())
    if n_dead == 0:
        return h.new_zeros(())
    k_aux = d.config.d_in // 2
    scale = min(n_dead / k_aux, 1.0)
    k_aux = min(k_aux, n_dead)
    masked = torch.where(dead[None], h, torch.full_like(h, -torch.inf))
    top = masked.topk(k_aux, dim=-1, sorted=False)
    acts = torch.zeros_like(h).scatter_(-1, top.indices, top.values)
    recon = acts @ d.W_dec + d.b_dec
    return scale * (recon - (y - y_hat).detach()).pow(2).sum(-1).mean()


def _auxk_on_dead(d: Dictionary, h_dead: torch.Tensor, cols: torch.Tensor, y: torch.Tensor,
                  y_hat: torch.Tensor) -> torch.Tensor:
    """:func:`auxk_loss` from the dead latents' pre-activations ``h_dead [rows, n_dead]`` (latents ``cols``)."""
    n_dead = int(cols.numel())
    k_aux = d.config.d_in // 2
    scale = min(n_dead / k_aux, 1.0)
    top = h_dead.topk(min(k_aux, n_dead), dim=-1, sorted=False)
    recon = torch.nn.functional.embedding_bag(top.indices, d.W_dec[cols], per_sample_weights=top.values,
                                              mode="sum") + d.b_dec
    return scale * (recon - (y - y_hat).detach()).pow(2).sum(-1).mean()


@torch.no_grad()
def _resample_dead(state: _State, x: torch.Tensor, y: torch.Tensor, y_hat: torch.Tensor,
                   settings: TrainSettings) -> None:
    """Resampling after Anthropic (2023): each dead latent gets a batch row drawn with probability proportional
    to its squared reconstruction error; its decoder row becomes the unit direction of that row's error
    ``y - y_hat`` (what the dictionary misses; Anthropic used the input), its encoder column the same direction
    (a transcoder: the row's input direction) times 0.2 x the mean norm of the live encoder columns, its bias 0,
    its Adam moments 0 (and a JumpReLU threshold the smaller of its initial value and half the latent's new
    pre-activation on that row, so that it fires there)."""
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
    d.W_dec[idx] = dirs.to(d.W_dec.dtype) * (1.0 if d.arch in UNIT_NORM_DECODER else float(d.W_dec[alive].norm(
        dim=-1).mean()) if alive.any() else 1.0)
    d.W_enc[:, idx] = (enc_dirs * 0.2 * enc_norm).T.to(d.W_enc.dtype)
    d.b_enc[idx] = 0
    if d.log_threshold is not None:
        # a JumpReLU latent fires on its row again: threshold at most half its new pre-activation there
        h_row = ((x_in * enc_dirs).sum(-1) * 0.2 * enc_norm).clamp_min(1e-6)
        d.log_threshold[idx] = torch.minimum(torch.full_like(h_row, settings.jumprelu_init_threshold),
                                             0.5 * h_row).log().to(d.log_threshold.dtype)
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


def _resample_every(settings: TrainSettings) -> int:
    return max(1, settings.dead_tokens // settings.batch_size)


def _warm_up(tokens: int, warm_up_tokens: int) -> float:
    return 1.0 if warm_up_tokens <= 0 else min(1.0, (tokens + 1) / warm_up_tokens)


def _lr_factor(step: int, total_steps: int, decay_fraction: float) -> float:
    decay_steps = int(total_steps * decay_fraction)
    if decay_steps <= 0 or step < total_steps - decay_steps:
        return 1.0
    return max(0.0, (total_steps - step) / decay_steps)


def _postfix(states: Mapping[str, _State]) -> dict[str, str]:
    first = next(iter(states.values())).last
    if not first:
        return {}
    return {"L0": f"{first['l0']:.1f}", "EV": f"{first['ev']:.3f}", "dead": f"{first['dead']:.3f}"}


# ---------------------------------------------------------------------------------------------- end, checkpoints
def _finish(state: _State, trained: int, reader: RowReader, buffer: ShuffleBuffer | EpochBuffer,
            settings: TrainSettings) -> Dictionary:
    d = state.dictionary
    with torch.no_grad():
        d.fold_scaling(state.scale_in, state.scale_out)
    meta = dict(d.config.metadata)
    meta.update({"tokens_trained": trained, "scale_in_folded": state.scale_in, "scale_out_folded": state.scale_out,
                 "token_classes_excluded": list(settings.excluded), "token_classes_seen": list(reader.class_names),
                 "epochs_read": reader.epochs, "held_in_memory": isinstance(buffer, EpochBuffer),
                 "unique_tokens": buffer.n_rows if isinstance(buffer, EpochBuffer) else None,
                 "epochs": trained / buffer.n_rows if isinstance(buffer, EpochBuffer) else None,
                 "train_settings": {k: v for k, v in asdict(settings).items()
                                                                 if k != "progress"}})
    d.config = replace(d.config, metadata=meta)
    return d.eval()


def _save_checkpoint(path: Path, states: Mapping[str, _State], buffer: ShuffleBuffer | EpochBuffer, reader: RowReader,
                     trained: int, settings: TrainSettings) -> None:
    data: dict[str, Any] = {
        "trained": trained, "rows_read": reader.rows_read, "class_names": reader.class_names,
        "buffer": buffer.state(), "settings": asdict(settings),
        "dicts": {name: {"config": s.dictionary.config.to_dict(), "weights": s.dictionary.state_dict(),
                         "optimizer": s.optimizer.state_dict(), "scale_in": s.scale_in, "scale_out": s.scale_out,
                         "tokens_since_fired": s.tokens_since_fired} for name, s in states.items()},
        "rng": torch.get_rng_state(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    torch.save(data, tmp)
    os.replace(tmp, path)


def _load_checkpoint(path: Path, states: Mapping[str, _State], buffer: ShuffleBuffer | EpochBuffer, reader: RowReader,
                     settings: TrainSettings, configs: Mapping[str, DictionaryConfig]) -> int:
    data = torch.load(path, map_location="cpu", weights_only=False)
    if set(data["dicts"]) != set(states):
        raise ValueError(f"the checkpoint in {path.parent} trains {sorted(data['dicts'])}, not {sorted(states)}")
    for name, s in states.items():
        saved = data["dicts"][name]
        if saved["config"] != configs[name].to_dict():
            raise ValueError(f"the checkpoint in {path.parent} holds another configuration for {name!r}")
        s.dictionary.load_state_dict(saved["weights"])
        s.optimizer.load_state_dict(saved["optimizer"])
        s.scale_in, s.scale_out = saved["scale_in"], saved["scale_out"]
        s.tokens_since_fired = saved["tokens_since_fired"]
    whole = isinstance(buffer, EpochBuffer)
    if bool(data["buffer"].get("whole", False)) != whole:
        raise ValueError(f"the checkpoint in {path.parent} was made from another source (one that "
                         f"{'did not fit' if whole else 'fitted'} in the buffer)")
    if not whole:  # a whole corpus was read again already; a stream skips what the run had read
        reader.skip(data["rows_read"])
    reader.class_names = list(data["class_names"])
    buffer.load_state(data["buffer"])
    torch.set_rng_state(data["rng"])
    return int(data["trained"])
