"""Run options and the inputs they resolve to: ``RunOptions`` (the CLI's shared flags), ``UsageError``, and
``prepare_inputs`` (device, dtype, model and corpus loaded once, with their manifest descriptions).

Bad input from the user raises :class:`UsageError`; the CLI prints it on one line and exits with status 2.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertscope.experiments import io

if TYPE_CHECKING:  # heavy imports stay lazy so `bertscope --help` is instant
    import torch

#: Options that change numbers; two runs agreeing on these (and on the model and corpus hashes) match.
FINGERPRINT_OPTIONS = ("max_sentences", "max_length", "batch_size", "seed")


class UsageError(Exception):
    """Bad input from the user (unknown model path, corpus, device, dtype...). The CLI prints the message
    on one line and exits with status 2, without a traceback."""


@dataclass
class RunOptions:
    """Options shared by every command (the CLI's shared flags)."""

    model: str | None = None  # None = bundled all-MiniLM-L6-v2; a folder; a hub id in the local cache
    corpus: str = "builtin"  # "builtin" | "repeated-random" | path to .txt / .conllu / .jsonl
    max_sentences: int | None = None
    max_length: int = 128
    batch_size: int = 32
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "float32"
    seed: int = 0
    out: Path = Path("results")
    force: bool = False
    quiet: bool = False

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        if self.max_sentences is not None and self.max_sentences < 1:
            raise UsageError(f"--max-sentences must be >= 1, got {self.max_sentences}")
        if self.max_length < 2:
            raise UsageError(f"--max-length must be >= 2 (room for [CLS] and [SEP]), got {self.max_length}")
        if self.batch_size < 1:
            raise UsageError(f"--batch-size must be >= 1, got {self.batch_size}")
        resolve_dtype_name(self.dtype)  # validate early, before anything is loaded

    def to_dict(self) -> dict[str, Any]:
        return io.to_jsonable(dataclasses.asdict(self))


@dataclass
class Inputs:
    """What several experiments share: the loaded model and corpus, with their descriptions."""

    model: Any  # models.Encoder
    corpus: Any  # experiments.corpus.Corpus
    device: torch.device
    dtype: torch.dtype
    model_info: dict[str, Any]
    corpus_info: dict[str, Any]


def prepare_inputs(options: RunOptions) -> Inputs:
    """Resolve device and dtype, load the model and the corpus once; bad input raises `UsageError`."""
    device = resolve_device(options.device)
    dtype = resolve_dtype(options.dtype)
    with warnings.catch_warnings(record=True) as caught:  # a missing tokenizer is an error here, said once
        warnings.simplefilter("always")
        model = load_model(options.model, device=device, dtype=dtype)
    for w in caught:
        if model.tokenizer is not None:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if model.tokenizer is None:
        raise UsageError(
            f"model {model.source} has no tokenizer files (tokenizer.json, vocab.txt, ...); experiments and "
            "capture need one: save the tokenizer next to the weights (tokenizer.save_pretrained(folder))"
        )
    check_max_length(options.max_length, model)
    corpus = load_corpus_spec(options.corpus, model.tokenizer, options.max_sentences, options.seed)
    return Inputs(model, corpus, device, dtype, model_summary(model), corpus_summary(corpus))


def sentences_used(max_sentences: int | None, default: int | None, available: int) -> tuple[int, str]:
    """How many sentences an experiment uses, and why, in words (the one meaning of ``--max-sentences``).

    ``--max-sentences N`` caps the corpus: the experiment uses its first ``N`` sentences (all of them if it has
    fewer). Without the option it uses the first ``default`` (its ``Settings.max_sentences``; ``None``: all).
    ``available``: the sentences the loaded corpus holds (already capped by the option).
    """
    if max_sentences is not None:
        n = min(max_sentences, available)
        why = f"--max-sentences {max_sentences}" + ("" if n == max_sentences else f"; the corpus has only {n}")
    elif default is not None:
        n = min(default, available)
        why = f"the experiment's default {default}; --max-sentences changes it"
        why += "" if n == default else f"; the corpus has only {n}"
    else:
        n, why = available, "the whole corpus; --max-sentences caps it"
    return n, why


def check_max_length(max_length: int, model: Any) -> None:
    """``--max-length`` must fit the model's positions and hold its special tokens plus one word piece;
    anything else is a `UsageError` raised before an output is written."""
    limit = getattr(model.config, "max_length", model.config.max_positions)
    minimum = model.tokenizer.num_special_tokens_to_add(pair=False) + 1
    if max_length < minimum:
        raise UsageError(
            f"--max-length {max_length} is too small: this model's special tokens plus one word piece need "
            f"at least {minimum}"
        )
    if max_length > limit:
        raise UsageError(
            f"--max-length {max_length} exceeds the model's {limit} positions; use --max-length {limit} or less"
        )


def resolve_device(spec: str) -> torch.device:
    """``models.devices.resolve_device`` with its errors as `UsageError` (``auto``, ``cpu``, ``cuda[:N]``)."""
    from bertscope.models.devices import DeviceError
    from bertscope.models.devices import resolve_device as _resolve

    try:
        return _resolve(spec or "auto")
    except DeviceError as e:
        raise UsageError(str(e)) from None


def resolve_dtype_name(spec: str) -> str:
    """Canonical dtype name (``float32``, ``float16``, ``bfloat16``, ``float64``); bad input -> `UsageError`."""
    from bertscope.models.devices import DeviceError
    from bertscope.models.devices import resolve_dtype_name as _resolve

    try:
        return _resolve(spec)
    except DeviceError as e:
        raise UsageError(str(e)) from None


def resolve_dtype(spec: str) -> torch.dtype:
    """``torch.dtype`` for a dtype spec (see :func:`resolve_dtype_name`)."""
    import torch

    return getattr(torch, resolve_dtype_name(spec))


def load_model(spec: str | None, *, device: Any = None, dtype: Any = None) -> Any:
    """``models.load`` with bad input (missing folder, unreadable checkpoint) turned into `UsageError`.

    ``spec``: ``None`` (bundled model), a folder, or a hub id already in the local Hugging Face cache.
    """
    from bertscope import models

    if spec is not None:
        path = Path(spec).expanduser()
        if path.exists():
            spec = str(path)
        elif _looks_like_path(spec):
            raise UsageError(f"--model {spec}: no such file or folder; give a model folder or omit --model")
    try:
        return models.load(spec, device=device, dtype=dtype)
    except (OSError, ValueError, KeyError) as e:
        local = spec is None or Path(spec).exists()
        where = "" if local else " (not a folder here, nor in the local HF cache)"
        raise UsageError(f"--model {spec}: cannot load it{where}: {_one_line(e)}") from e


def load_corpus_spec(spec: str, tokenizer: Any, max_sentences: int | None, seed: int) -> Any:
    """``corpus.load_corpus`` with bad input (unknown name, missing or malformed file) as `UsageError`."""
    from bertscope.experiments import corpus as corpus_mod

    try:
        return corpus_mod.load_corpus(spec, tokenizer=tokenizer, max_sentences=max_sentences, seed=seed)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UsageError(f"--corpus {spec}: {_one_line(e)}") from e


def model_summary(model: Any) -> dict[str, Any]:
    """Manifest description of a model: source, weights sha256, config, parameter count."""
    config = model.config
    config_dict = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(vars(config))
    return {
        "source": str(model.source),
        "weights_sha256": model.weights_sha256,
        "class": type(model).__name__,
        "n_parameters": int(sum(p.numel() for p in model.parameters())),
        "config": io.to_jsonable(config_dict),
        "tokenizer": type(model.tokenizer).__name__,
        "tokenizer_vocab_size": None if model.tokenizer is None else len(model.tokenizer),
    }


def corpus_summary(corpus: Any) -> dict[str, Any]:
    """Manifest description of a corpus: name, source, content sha256, size."""
    return {
        "name": corpus.name,
        "source": str(corpus.source),
        "sha256": corpus.sha256,
        "n_sentences": len(corpus),
        "n_words": int(sum(len(s.words) for s in corpus)),
        "has_syntax": bool(corpus.has_syntax),
    }


def _looks_like_path(spec: str) -> bool:
    # Hub ids look like "name" or "org/name"; these can only be meant as paths.
    return spec.startswith(("/", ".", "~")) or spec.count("/") > 1 or "\\" in spec or Path(spec).suffix != ""


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 400 else text[:397] + "..."
