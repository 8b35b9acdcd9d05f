"""One activation batch (issue 38 item 4): the trainer reads batch-like objects by duck typing; the plain-rows
container is ``plain_rows`` and ``probes.dictionary.ActivationBatch`` stays importable as its old name."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from bertscope.probes.dictionary import (
    ActivationBatch,
    DictionaryConfig,
    TrainSettings,
    plain_rows,
    train_dictionaries,
)
from bertscope.probes.dictionary.data import as_batch


@dataclass
class _MyRows:
    """Not the package's class: only ``acts`` and ``classes()``."""

    acts: dict
    cls: np.ndarray

    def classes(self) -> np.ndarray:
        return self.cls


def test_the_old_name_builds_plain_rows():
    x = torch.randn(6, 4)
    assert type(ActivationBatch({"s": x})) is type(plain_rows({"s": x}))
    rows = as_batch(plain_rows({"s": x}, ["word"] * 6), None)
    assert rows.classes().tolist() == ["word"] * 6


def test_any_object_with_acts_and_classes_trains_like_plain_rows():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 8, generator=g)
    cls = np.array(["word"] * 1536 + ["special"] * 512, dtype=object)
    cfg = DictionaryConfig(d_in=8, d_sae=16, arch="topk", k=2, site="s")
    ts = TrainSettings(tokens=2048, batch_size=256, buffer_rows=4096, progress=False, dead_tokens=10_000)
    mine = train_dictionaries([_MyRows({"s": x}, cls)], cfg, ts)["s"]
    ref = train_dictionaries([plain_rows({"s": x}, cls)], cfg, ts)["s"]
    torch.testing.assert_close(mine.W_enc, ref.W_enc)
    assert mine.config.metadata["unique_tokens"] == 1536  # the special rows were left out by their class
