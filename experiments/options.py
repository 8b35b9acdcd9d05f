"""Run options and the inputs they resolve to: ``RunOptions`` (the CLI's shared flags), ``UsageError``, and
``prepare_inputs`` (device, dtype, model and corpus loaded once, with their manifest descriptions).

Bad input from the user raises :class:`UsageError`; the CLI prints it on one line and exits with status 2.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from dataclasses import dataclass, field
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
    # False: an experiment's steps/ cache (what an interrupted run resumes from) is deleted once it is complete,
    # since a complete run never reads it again (--keep-steps yes keeps it, e.g. to inspect intermediate arrays)
    keep_steps: bool = False
    # --set NAME.FIELD=VALUE: experiment (CLI name) -> {Settings field: value}; typed by `settings.apply_overrides`
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    activations: Path | None = None  # a `bertscope capture` folder to read instead of running the forward
    # report on another corpus (e.g. EWT dev) than the one trained and selected on (--corpus); experiments that
    # support it say so in their tables (a `split`/`eval_corpus` column); the others ignore it
    eval_corpus: str | None = None
    # --threads: this process's torch threads, divided among worker processes (`jobs.set_thread_budget`); the CLI
    # records the number it set. Not part of the fingerprint: threads change only the rounding of sums
    threads: int | None = None

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        self.activations = None if self.activations is None else Path(self.activations)
        if self.max_sentences is not None and self.max_sentences < 1:
            raise UsageError(f"--max-sentences must be >= 1, got {self.max_sentences}")
        if not isinstance(self.max_length, int):
            raise UsageError(f"--max-length must be an integer, got {self.max_length!r}")
        # Its lower bound is the model's (special tokens plus one word piece): `check_max_length` states it once.
        if self.batch_size < 1:
            raise UsageError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise UsageError(f"--threads must be an integer >= 1, got {self.threads!r}")
        # dtype and device are resolved by `prepare_inputs` before anything is loaded (that needs torch); here
        # only what can be checked without importing it, so a usage error answers at once
        check_device_spelling(self.device)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if out["eval_corpus"] is None:  # manifests of runs without --eval-corpus stay as they were
            del out["eval_corpus"]
        if out["threads"] is None:  # set only by the CLI (the number it set) or a caller that chose one
            del out["threads"]
        return io.to_jsonable(out)


@dataclass
class Inputs:
    """What several experiments share: the loaded model and corpus, with their descriptions."""

    model: Any  # models.Encoder
    corpus: Any  # experiments.corpus.Corpus
    device: torch.device
    dtype: torch.dtype
    model_info: dict[str, Any]
    corpus_info: dict[str, Any]
    eval_corpus: Any = None  # experiments.corpus.Corpus from --eval-corpus, or None
    eval_corpus_info: dict[str, Any] | None = None
    # corpus.pairs.Pairs: the --corpus FILE of a pairs experiment run alone (`corpus.pairs`); None otherwise, and
    # the experiment uses its own builtin pairs
    pairs: Any = None


def prepare_inputs(options: RunOptions, pairs: Any = None) -> Inputs:
    """Resolve device and dtype, load the model and the corpus once; bad input raises `UsageError`.

    ``pairs``: a `corpus.pairs.Pairs` already read from ``options.corpus`` for an experiment that reads pairs
    (`read_pairs_spec`); the sentence corpus is then the builtin one, and the manifest's corpus is the pairs file.
    """
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
    spec = "builtin" if pairs is not None else options.corpus
    corpus = load_corpus_spec(spec, model.tokenizer, options.max_sentences, options.seed)
    corpus, skipped = drop_unencodable(corpus, model.tokenizer, options.max_length, "--corpus")
    from bertscope.experiments.corpus.coverage import warn_if_mostly_unknown
    from bertscope.experiments.naming import model_name

    warn_if_mostly_unknown(model.tokenizer, [s.text for s in corpus], model_name(str(model.source)))
    inputs = Inputs(model, corpus, device, dtype, model_summary(model), {**corpus_summary(corpus), **skipped})
    if pairs is not None:
        inputs.pairs, inputs.corpus_info = pairs, pairs.summary()
    if options.eval_corpus is not None:
        try:
            eval_corpus = load_corpus_spec(options.eval_corpus, model.tokenizer, options.max_sentences,
                                           options.seed)
        except UsageError as e:
            raise UsageError(str(e).replace("--corpus", "--eval-corpus", 1)) from e
        inputs.eval_corpus, skipped = drop_unencodable(eval_corpus, model.tokenizer, options.max_length,
                                                       "--eval-corpus")
        inputs.eval_corpus_info = {**corpus_summary(inputs.eval_corpus), **skipped}
    return inputs


#: At most this many skipped sentence ids are listed in the manifest (the count is always complete).
SKIPPED_IDS_LISTED = 20


def drop_unencodable(corpus: Any, tokenizer: Any, max_length: int, option: str = "--corpus") -> tuple[Any, dict]:
    """``corpus`` without the sentences no experiment can encode at ``--max-length`` (a one-word sentence that is
    a 300-character URL; a word without word pieces: `corpus.unencodable`), and what the manifest records of them
    (``{}`` when none: ``n_skipped_unencodable``, the first ids and why). One warning line on stderr says how many
    were skipped (even with ``--quiet``); a corpus left with no sentence at all is a `UsageError`."""
    import sys

    from bertscope.experiments import corpus as corpus_mod

    problems = corpus_mod.unencodable(corpus, tokenizer, max_length=max_length)
    if not problems:
        return corpus, {}
    kept = [s for s in corpus if s.id not in problems]
    first, why = next(iter(problems.items()))
    said = (f"{option} {corpus.name}: skipped {len(problems)} of {len(corpus)} sentence(s) that cannot be encoded "
            f"at --max-length {max_length} (e.g. {first!r}: {why})")
    if not kept:
        raise UsageError(f"{said}; nothing is left to run on")
    print(f"bertscope: warning: {said}; raise --max-length to keep them", file=sys.stderr, flush=True)
    listed = dict(list(problems.items())[:SKIPPED_IDS_LISTED])
    return dataclasses.replace(corpus, sentences=kept), {"n_skipped_unencodable": len(problems),
                                                         "skipped_unencodable": listed}


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


#: Corpus names `corpus.load_corpus` knows (kept equal to `corpus.CORPUS_NAMES` by a test; read here without
#: importing the corpus package, which brings in torch).
CORPUS_SPELLINGS = ("builtin", "repeated-random", "repeated-random:m=<int>")
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?", re.IGNORECASE)


def check_device_spelling(spec: str | None) -> None:
    """``--device`` is ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (availability is checked by `resolve_device`)."""
    if spec is not None and not isinstance(spec, str):
        return  # a torch.device from the API: resolve_device checks it
    if spec is not None and not _DEVICE.fullmatch(spec.strip()):
        raise UsageError(f"--device {spec!r}: not one of auto, cpu, cuda, cuda:N")


def check_corpus_spelling(spec: str) -> None:
    """``--corpus`` is a known corpus name or an existing path (read later by `load_corpus_spec`); checked
    without importing torch."""
    text = str(spec)
    if text in ("builtin", "repeated-random") or re.fullmatch(r"repeated-random(:m=\d+)?", text):
        return
    if not Path(text).expanduser().exists():
        raise UsageError(f"--corpus {text}: corpus {text!r} is neither a known corpus ({', '.join(CORPUS_SPELLINGS)}) "
                         "nor an existing file; give one of those names or the path of a .txt, .conllu or .jsonl "
                         "file")  # fmt: skip


def resolve_device(spec: str) -> torch.device:
    """``models.devices.resolve_device`` with its errors as `UsageError` (``auto``, ``cpu``, ``cuda[:N]``)."""
    from bertscope.models.devices import DeviceError
    from bertscope.models.devices import resolve_device as _resolve

    try:
        return _resolve(spec or "auto")
    except DeviceError as e:
        raise UsageError(e.cli_message()) from None


def resolve_dtype_name(spec: str) -> str:
    """Canonical dtype name (``float32``, ``float16``, ``bfloat16``, ``float64``); bad input -> `UsageError`."""
    from bertscope.models.devices import DeviceError
    from bertscope.models.devices import resolve_dtype_name as _resolve

    try:
        return _resolve(spec)
    except DeviceError as e:
        raise UsageError(e.cli_message()) from None


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


def read_pairs_spec(module: Any, options: RunOptions) -> Any:
    """The pairs ``--corpus`` of an experiment that reads pairs (its ``PAIRS`` format), run alone: ``None`` for
    a corpus name or an experiment without ``PAIRS``; a bad file is a `UsageError` (one line). No torch."""
    from bertscope.experiments.corpus.pairs import PairsError, check_pairs_corpus

    try:
        return check_pairs_corpus(module, options.corpus, options.max_sentences)
    except PairsError as e:
        raise UsageError(f"--corpus {options.corpus}: {_one_line(e)}") from None


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


def run_fingerprint(name: str, options: RunOptions, inputs: Inputs) -> dict[str, Any]:
    """What must match for a previous run to count as this run: experiment, options that change the
    numbers, resolved device type and dtype, model weights and corpus content."""
    out = {
        "experiment": name,
        **{k: getattr(options, k) for k in FINGERPRINT_OPTIONS},
        "device": inputs.device.type,
        "dtype": str(inputs.dtype).removeprefix("torch."),
        "model_sha256": inputs.model_info.get("weights_sha256"),
        "corpus_sha256": inputs.corpus_info.get("sha256"),
        # --set overrides of this experiment's Settings (absent without any, so older fingerprints still match)
        **({"settings": io.to_jsonable(options.settings[name])} if options.settings.get(name) else {}),
    }
    if getattr(inputs, "eval_corpus_info", None):  # only then: runs without --eval-corpus keep their fingerprint
        out["eval_corpus_sha256"] = inputs.eval_corpus_info.get("sha256")
    return out
