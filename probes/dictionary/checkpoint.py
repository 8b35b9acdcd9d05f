"""Checkpoints of a training run (weights, Adam state, dead-latent counters, the buffer's state), written
atomically, and resuming from them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from .data import EpochBuffer, RowReader, ShuffleBuffer
from .models import DictionaryConfig
from .settings import TrainSettings, TrainState

CHECKPOINT_NAME = "checkpoint.pt"


def save_checkpoint(path: Path, states: Mapping[str, TrainState], buffer: ShuffleBuffer | EpochBuffer,
                    reader: RowReader, trained: int, settings: TrainSettings) -> None:
    """Write ``checkpoint.pt`` atomically (a ``.partial`` file renamed into place)."""
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


def load_checkpoint(path: Path, states: Mapping[str, TrainState], buffer: ShuffleBuffer | EpochBuffer,
                    reader: RowReader, settings: TrainSettings, configs: Mapping[str, DictionaryConfig]) -> int:
    """Restore a run from ``path``: weights, optimiser, counters, the buffer; returns the tokens trained. Refuses a
    checkpoint of other dictionaries, configurations or another kind of source."""
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
