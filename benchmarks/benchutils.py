"""Shared helpers for the benchmark scripts (not part of the installed package).

A script run as ``python benchmarks/x.py`` has this folder on ``sys.path``, so ``import benchutils`` works
without any path edits; the distinct name cannot shadow a package module.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch


def make_batch(
    batch: int, length: int, tokenizer, device: torch.device, seed: int = 0, *, vocab_size: int | None = None
) -> dict[str, torch.Tensor]:
    """Random ids framed by the tokenizer's [CLS] ... [SEP] (or <s> ... </s>), no padding: ``[batch, length]``.

    Ids are drawn above every special token's id (special tokens come first in these vocabularies). A random
    checkpoint saved without a tokenizer (``tokenizer=None``) takes ids from ``[5, vocab_size)`` framed by 1 and 2:
    for timing, which ids frame the sequence does not matter."""
    g = torch.Generator().manual_seed(seed)
    if tokenizer is None:
        if vocab_size is None:
            raise ValueError("make_batch needs a tokenizer or vocab_size")
        low, high, first, last = 5, vocab_size, 1, 2
    else:
        low, high = max(tokenizer.all_special_ids) + 1, len(tokenizer)
        first, last = tokenizer.cls_token_id, tokenizer.sep_token_id
    ids = torch.randint(low, high, (batch, length), generator=g)
    ids[:, 0], ids[:, -1] = first, last
    return {
        "input_ids": ids.to(device),
        "attention_mask": torch.ones_like(ids).to(device),
        "token_type_ids": torch.zeros_like(ids).to(device),
    }


def sync(device: torch.device) -> None:
    """Wait for queued GPU work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_interleaved(
    fns: dict[str, Callable[[], object]], device: torch.device, repeats: int, warmup: int = 2,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Median seconds per call of each function, measured round-robin so that machine drift hits all alike.
    ``clock``: wall time by default; ``time.process_time`` (CPU seconds of this process) is steadier on a loaded
    machine when torch runs one thread.

    The order rotates every round, so no function always runs right after the same neighbour (a run after
    one that freed large buffers pays for fresh pages).
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync(device)
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = fns[name]
            sync(device)
            start = clock()
            fn()
            sync(device)
            times[name].append(clock() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def reference_model(path: str, impl: str, device: torch.device):
    """``transformers.BertModel`` from ``path`` with attention implementation ``impl`` (eval mode)."""
    from transformers import BertModel

    return BertModel.from_pretrained(path, attn_implementation=impl).to(device).eval()


_UD = ("shared", "data", "ud-english-ewt")
_ROOT = Path(__file__).resolve().parents[1]
#: UD English EWT's folder beside the repository (``../shared/...``) or, from a worktree, beside its parent; the
#: first that exists, else the one beside the repository.
EWT = next((p.joinpath(*_UD) for p in (_ROOT.parent, _ROOT.parent.parent) if p.joinpath(*_UD).is_dir()),
           _ROOT.parent.joinpath(*_UD))


def ewt_dev_path() -> Path:
    """UD English EWT dev beside the repository (``../shared/...``), else the shared machine's copy."""
    beside = Path(__file__).resolve().parents[1].parent / "shared/data/ud-english-ewt/en_ewt-ud-dev.conllu"
    return beside if beside.is_file() else Path("/work/shared/data/ud-english-ewt/en_ewt-ud-dev.conllu")


def tfc1_task(corpus_path, n_pairs: int, max_tokens: int = 32):
    """The bundled model and the circuits experiment's TFC1 task (cosine metric) over the first ``n_pairs``
    sentences of ``corpus_path`` that give a pair: ``(model, task)``."""
    from bertscope.experiments.circuits import measures
    from bertscope.experiments.corpus import load_corpus
    from bertscope.hooks import circuits

    import bertscope

    model = bertscope.load().eval()
    corpus = load_corpus(str(corpus_path))
    pairs = measures.tfc1_pairs([s.words for s in corpus], model.tokenizer, max_pairs=n_pairs, max_tokens=max_tokens)
    return model, circuits.make_task(model, pairs, "cosine")
