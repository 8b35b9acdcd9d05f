"""Streaming training of one or several dictionaries in one pass over a source of activation batches.

``train_dictionaries(source, configs, settings)`` reads the source through a shuffle buffer (memory bounded by
``settings.buffer_rows`` whatever the source's size), normalises every site to mean norm ``sqrt(d)`` (SAELens's
``expected_average_only_in``; the factor is folded back into the returned weights), initialises ``b_dec`` from
the first buffer (geometric median by default), trains with Adam, tracks dead latents (no activation over the
last ``dead_tokens`` tokens) and revives them (each architecture's ``revive``: resampling, or an auxiliary loss
such as AuxK), checkpoints every ``checkpoint_tokens`` tokens and resumes from the last checkpoint. Deterministic
per ``seed`` (on one device and thread count).

Data parallel: inside an initialised ``torch.distributed`` group (``torchrun``; gloo on CPU, nccl on CUDA) every
process reads the same stream and buffer, trains on its equal share of each batch (rows ``rank::world``) and
averages gradients, dead-latent counts and resampling inputs over the group, so every process holds the same
dictionary, equal to one process's within float summation order (``tests/probes/test_dictionary_distributed.py``).
Checkpoints are written by rank 0. An architecture that is not ``data_parallel`` (BatchTopK: a selection over the
whole batch) is refused.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from .data import EpochBuffer, RowReader, ShuffleBuffer
from .initialise import geometric_median, initialise, norm_scaling_factor
from .losses import auxk_loss, dictionary_loss, topk_loss
from .models import Dictionary, DictionaryConfig
from .resample import resample_dead, resample_every
from .settings import TrainSettings, TrainState

__all__ = ["CHECKPOINT_NAME", "TrainSettings", "TrainState", "TrainingInterrupted", "auxk_loss", "dictionary_loss",
           "geometric_median", "norm_scaling_factor", "topk_loss", "train_dictionaries"]


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

    ``source``: an iterable of batch-like objects (the activations stage's batches, ``plain_rows``, dicts site ->
    ``[rows, d]``, or, for one dictionary, plain tensors ``[rows, d]``). A re-iterable source is read again from
    the start when ``tokens`` asks for more rows than it holds; a resumed run must get the same source.
    ``configs``: name -> :class:`DictionaryConfig` (each names its ``site``, and a transcoder its ``site_out``);
    one config alone is named by its site. ``checkpoint_dir``: where ``checkpoint.pt`` is written (every
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
    serial = [c.arch for c in configs.values() if not c.spec.data_parallel]
    if world > 1 and serial:
        raise ValueError(f"{serial[0]} selects over the whole batch: data-parallel training does not support it")
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
        trained = load_checkpoint(ckpt, states, buffer, reader, settings, configs)
        last_ckpt = trained
    else:
        initialise(states, buffer.fill(), settings, device, dtype)
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
                    save_checkpoint(ckpt, states, buffer, reader, trained, settings)
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
               dtype: torch.dtype) -> TrainState:
    d = Dictionary(cfg, device=device, dtype=dtype)
    d.init_weights(gen, jumprelu_threshold=settings.jumprelu_init_threshold)
    opt = torch.optim.Adam(d.parameters(), lr=settings.lr, betas=(0.9, 0.999))
    return TrainState(d, opt, tokens_since_fired=torch.zeros(cfg.d_sae, dtype=torch.int64))


# ---------------------------------------------------------------------------------------------- one step
def _train_step(state: TrainState, acts: dict[str, torch.Tensor], step: int, total_steps: int,
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
        group["lr"] = settings.lr * _lr_factor(step, total_steps, settings.lr_decay_fraction,
                                               settings.lr_warm_up_tokens // settings.batch_size)
    dead = state.tokens_since_fired.to(device) >= settings.dead_tokens
    spec = d.spec
    if spec.sparse_loss is not None and d.W_skip is None:  # the sparse form: no dense [rows, d_sae] activations
        loss, values, indices, y_hat = spec.sparse_loss(d, x, y, settings, dead)
        f = None
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
    if spec.unit_norm_decoder:
        d.remove_parallel_gradient()
    torch.nn.utils.clip_grad_norm_(d.parameters(), 1.0)
    state.optimizer.step()
    with torch.no_grad():
        if spec.unit_norm_decoder:
            d.normalise_decoder()
        if spec.after_step is not None and f is not None:
            spec.after_step(d, f, settings)
        if world > 1:
            fired = fired.to(torch.int32)
            torch.distributed.all_reduce(fired, op=torch.distributed.ReduceOp.MAX)
            fired = fired.bool()
        state.tokens_since_fired += x_all.shape[0]
        state.tokens_since_fired[fired.cpu()] = 0
        if settings.resample and spec.revive == "resample" and (step + 1) % resample_every(settings) == 0:
            # every rank resamples from the whole batch, with the same pre-step reconstruction
            y_hat_all = _pre_step_prediction(state, x_all, y_hat, rank, world) if world > 1 else y_hat
            resample_dead(state, x_all, y_all, y_hat_all, settings)
        resid = (y - y_hat).float()
        state.last = {"l0": l0,
                      "ev": float(1 - resid.pow(2).sum(-1).mean() / (y - y.mean(0)).float().pow(2).sum(-1).mean()),
                      "dead": float((state.tokens_since_fired >= settings.dead_tokens).float().mean())}


def _world() -> tuple[int, int]:
    """(rank, world size) of the running ``torch.distributed`` group, (0, 1) without one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _pre_step_prediction(state: TrainState, x_all: torch.Tensor, y_hat: torch.Tensor, rank: int,
                         world: int) -> torch.Tensor:
    """The whole batch's reconstruction before this step's update, gathered from the ranks' shares (rows
    ``rank::world``), in the batch's row order."""
    parts = [torch.empty_like(y_hat) for _ in range(world)]
    torch.distributed.all_gather(parts, y_hat.detach().contiguous())
    out = torch.empty(x_all.shape[0], y_hat.shape[1], dtype=y_hat.dtype, device=y_hat.device)
    for r, part in enumerate(parts):
        out[r::world] = part
    return out


def _lr_factor(step: int, total_steps: int, decay_fraction: float, warm_up_steps: int = 0) -> float:
    """The learning rate's factor at ``step``: linear warm-up from 0 over ``warm_up_steps``, 1, then linear decay
    to 0 over the last ``decay_fraction`` of ``total_steps``."""
    warm = 1.0 if warm_up_steps <= 0 else min(1.0, (step + 1) / warm_up_steps)
    decay_steps = int(total_steps * decay_fraction)
    if decay_steps <= 0 or step < total_steps - decay_steps:
        return warm
    return warm * max(0.0, (total_steps - step) / decay_steps)


def _postfix(states: Mapping[str, TrainState]) -> dict[str, str]:
    first = next(iter(states.values())).last
    if not first:
        return {}
    return {"L0": f"{first['l0']:.1f}", "EV": f"{first['ev']:.3f}", "dead": f"{first['dead']:.3f}"}


# ---------------------------------------------------------------------------------------------- end, checkpoints
def _finish(state: TrainState, trained: int, reader: RowReader, buffer: ShuffleBuffer | EpochBuffer,
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


