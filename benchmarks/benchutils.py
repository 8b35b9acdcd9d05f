"""Shared helpers for the benchmark scripts (not part of the installed package).

A script run as ``python benchmarks/x.py`` has this folder on ``sys.path``, so ``import benchutils`` works
without any path edits; the distinct name cannot shadow a package module.
"""

from __future__ import annotations

import re
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


def _ewt_folder() -> Path:
    """UD English EWT's folder as the package finds it (``find_ewt``: ``BERTSCOPE_UD_EWT``, then
    ``shared/data/ud-english-ewt/`` beside the repository or any folder above it, so a worktree finds it too), else
    the folder beside the repository, which error messages then name."""
    from bertscope.experiments.corpus.ewt import find_ewt

    found = find_ewt("train")
    beside = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "ud-english-ewt"
    return found.parent if found is not None else beside


#: UD English EWT's folder (see ``_ewt_folder``).
EWT = _ewt_folder()


def ewt_dev_path() -> Path:
    """UD English EWT dev: ``EWT / en_ewt-ud-dev.conllu``."""
    return EWT / "en_ewt-ud-dev.conllu"


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


def write_docs(path: Path, text: str, name: str = "ig-steps") -> None:
    """Replace the block between ``<!-- {name}:begin -->`` and ``<!-- {name}:end -->`` in ``path`` (appended at the
    end when absent), atomically."""
    doc = path.read_text()
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{text}\n{end}"
    if begin in doc and end in doc:
        doc = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, doc, flags=re.S)
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(doc)
    tmp.replace(path)


ALL_DEV_DEAD = ("dead latents < 10% (all dev tokens)", "dev_all_dead_fraction")


def target_lines(tag: str, r, pca, k: int, dead: tuple[str, str] = ALL_DEV_DEAD) -> list[str]:
    """Rows ``| tag | target | value | met |`` of issue 28's targets for one dictionary's numbers ``r`` (a mapping or
    Series of the summary's columns): explained variance >= 0.80, dead latents < 10% (``dead`` = its label and
    column), spliced cosine >= 0.95, and, when ``pca`` (PCA-top-``k``'s numbers) is given, both above PCA's."""
    ev, cos = r["explained_variance"], r["spliced_embedding_cosine"]
    checks = [("explained variance >= 0.80", ev, ev >= 0.80), (dead[0], r[dead[1]], r[dead[1]] < 0.10),
              ("spliced embedding cosine >= 0.95", cos, cos >= 0.95)]
    if pca is not None:
        checks += [(f"explained variance > PCA-top{k} ({pca['explained_variance']:.3f})", ev,
                    ev > pca["explained_variance"]),
                   (f"spliced cosine > PCA-top{k} ({pca['spliced_embedding_cosine']:.3f})", cos,
                    cos > pca["spliced_embedding_cosine"])]
    return [f"| {tag} | {name} | {value:.3f} | {'yes' if ok else '**no**'} |" for name, value, ok in checks]
