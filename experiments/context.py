"""The run context: what an experiment's ``run(ctx)`` gets, and the step cache that makes resuming safe.

Only an experiment's ``run`` sees a :class:`Context`; the measurement code below it takes plain tensors, arrays
and ``Settings``. Constructing a context touches nothing on disk: folders appear when something is written.

Step cache. ``ctx.step(name, fn)`` / ``ctx.step_arrays(name, fn)`` store an intermediate result under
``OUT/<exp>/steps/<name>-<key>.parquet|npz``. The key hashes everything that decides its content: the run's
fingerprint (experiment, options that change numbers, device type, dtype, model and corpus sha256), the
experiment's code hash (its package's source files), its ``Settings``, and the step's own ``key`` arguments.
A resumed run reads a step only if all of those match; anything else recomputes it. A result is written
atomically as soon as it is computed, so Ctrl-C loses at most the step in flight. The cache itself is a
:class:`StepCache` (``ctx.steps``); ``ctx.jobs(...)`` gives the job service (`experiments.jobs`) that runs many
independent jobs on workers and writes each result through it as it arrives.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from bertscope.experiments import io
from bertscope.experiments.io import is_dataframe, relative_path
from bertscope.experiments.options import Inputs, RunOptions, run_fingerprint

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

T = TypeVar("T")
STEPS = "steps"


@dataclass(frozen=True)
class RunValues:
    """What measurement code takes from the run, as plain values (the run context stays in ``experiment.run``):
    built by :meth:`Context.run_values`, one class for every experiment.

    ``model``; ``seed`` (``--seed``); ``progress`` and ``log`` (the run's progress-bar and log callables);
    ``encode`` (``encode(sentences) -> EncodedCorpus`` with the run's ``--max-length`` and ``--batch-size``);
    ``max_length`` (``--max-length``); ``capture_train`` / ``capture_eval``: with ``--activations``, a
    `CaptureSource` serving the clean pass of the training / evaluation sentences when they come from the run's
    corpus (None: run the model); ``save_dictionaries``: where trained dictionaries are saved (``<site>/``), if
    anywhere."""

    model: Any
    seed: int
    progress: Callable[..., Any]
    log: Callable[[str], None]
    encode: Callable[[list], Any] | None = None
    max_length: int = 128
    capture_train: Any = None
    capture_eval: Any = None
    save_dictionaries: Path | None = None


class Context:
    """What an experiment's ``run(ctx)`` gets: inputs, options, settings, an output folder, and helpers.

    Attributes: ``options``, ``model``, ``corpus``, ``out_dir`` (``OUT/<DIRNAME>``), ``device``, ``dtype``,
    ``seed``, ``name``, ``settings`` (the experiment's ``Settings``), ``code_sha256`` (the experiment's source),
    ``notes`` (dict recorded in the manifest: put the defaults you chose here). Creating one writes nothing.
    """

    def __init__(
        self,
        name: str,
        options: RunOptions,
        inputs: Inputs,
        out_dir: Path,
        fingerprint: dict[str, Any] | None = None,
        *,
        settings: Any = None,
        code_sha256: str | None = None,
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
        self.code_sha256 = code_sha256
        self.notes: dict[str, Any] = {}
        self.messages: list[str] = []
        self.steps_used: set[str] = set()  # step files read or written by this run (the rest is stale)
        self.steps = StepCache(self.out_dir, self.fingerprint, code_sha256, settings, used=self.steps_used,
                               log=self.log)  # fmt: skip
        self.started_at = io.now()

    def run_values(self, **extra: Any) -> RunValues:
        """The run's plain values for measurement code (:class:`RunValues`): model, ``--seed``, progress and log,
        ``encode``, ``--max-length``; ``extra`` sets the optional fields (``capture_train``, ``save_dictionaries``)."""
        return RunValues(model=self.model, seed=self.seed, progress=self.progress, log=self.log, encode=self.encode,
                         max_length=self.options.max_length, **extra)

    def use_settings(self, settings: T | None) -> T:
        """The experiment's settings for this run: ``settings`` if given (it replaces ``ctx.settings``, so the
        step keys follow it), else ``ctx.settings``. Experiments start ``run`` with this."""
        if settings is not None:
            self.settings = settings
        if self.settings is None:
            raise ValueError(f"{self.name}: no Settings given to the context nor to run()")
        return self.settings

    @property
    def model_id(self) -> str:
        """The model identifier every table's ``model`` column holds: the source ``bertscope info`` prints."""
        return str(self.model.source)

    @property
    def corpus_id(self) -> str:
        """The corpus identifier every table's ``corpus`` column holds: the corpus's name."""
        return str(self.corpus.name)

    # -- progress and logging
    def progress(self, iterable: Iterable[T] | None, desc: str, total: int | None = None) -> Iterable[T]:
        """Wrap a long loop in a progress display on stderr, silent with ``--quiet``: a tqdm bar in a terminal;
        in a log file or pipe, one line every :data:`LOG_EVERY_S` seconds of work (and one at the end), so a long
        run shows it is moving. ``iterable=None`` gives a bar that the caller advances with ``.update(n)``
        (work counted in finer units than the loop's items). Returns the bar."""
        if self.options.quiet:
            from tqdm.auto import tqdm

            return tqdm(iterable, total=total, disable=True)
        if not sys.stderr.isatty():  # no bars in logs or pipes: periodic lines instead
            return LineProgress(iterable, f"[{self.name}] {desc}", total)
        from tqdm.auto import tqdm

        return tqdm(
            iterable,
            desc=f"{self.name}: {desc}",
            total=total,
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

    def record_used(self, counts: dict[str, int], *, available: int | None = None, more: str | None = None,
                    unit: str = "sentences") -> None:
        """Record what this run really measured on, the one count the report reads (its "sentences used" and the
        small-sample caveat): ``counts`` {part: number}, e.g. ``{"train": 150, "eval": 80}``, in ``unit``
        (``sentences``, or ``pairs``...), as the manifest's ``notes["used"]``. ``available``: the sentences the
        corpus offered; when it holds at least :data:`MUCH_LARGER` times what is used, one line says what is used
        and how to use more (``more``: the option or ``--set`` that raises it), and the manifest records both."""
        total = int(sum(counts.values()))
        record: dict[str, Any] = {"unit": unit, "counts": {k: int(v) for k, v in counts.items()}}
        if available is not None:
            record["available"] = int(available)
        if more:
            record["more"] = more
        self.notes["used"] = io.to_jsonable(record)
        if available is not None and total and available >= MUCH_LARGER * total:
            parts = f" ({', '.join(f'{k} {v:,}' for k, v in counts.items())})" if len(counts) > 1 else ""
            self.log(f"uses {total:,} {unit}{parts} of the {available:,} sentences of {self.corpus_id}"
                     + (f"; to use more: {more}" if more else ""))

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
        seen: set[str] = set()
        for w in caught:  # truncation and similar: printed once even with --quiet, and kept in the manifest
            msg = f"corpus {getattr(corpus, 'name', '?')}: {w.message}"
            if msg not in seen and f"warning: {msg}" not in self.messages:
                seen.add(msg)
                self.warn(msg)
        key = "n_truncated_pair" if pair else "n_truncated"
        self.notes[key] = self.notes.get(key, 0) + encoded.n_truncated
        return encoded

    def rng(self, *keys: str | int) -> np.random.Generator:
        """A numpy Generator seeded from ``--seed`` and ``keys`` (distinct keys give independent streams)."""
        import numpy as np

        return np.random.default_rng(_seed_sequence(self.seed, keys))

    # -- outputs
    @property
    def settings(self) -> Any:
        """The experiment's ``Settings`` for this run (part of every step's key)."""
        return self.steps.settings

    @settings.setter
    def settings(self, value: Any) -> None:
        self.steps.settings = value

    def jobs(self, workers: int | None = 1, threads: int | None = 1, device: Any = None) -> Any:
        """A `jobs.JobService` for this run: jobs on ``workers`` forked processes (None: every core this process
        may use; 1: here), ``threads`` threads each, computing on ``device`` (default: the run's), each result
        cached in this run's step cache as it arrives, progress on this run's bars. Measurement code gets this
        service, never the context."""
        from bertscope.experiments.jobs import JobService

        return JobService(workers=workers, threads=threads, device=self.device if device is None else device,
                          cache=self.steps, progress=self.progress)  # fmt: skip

    def step_key(self, name: str, **key: Any) -> str:
        """16 hex digits identifying step ``name``'s content: fingerprint, code hash, settings and ``key``."""
        return self.steps.step_key(name, **key)

    def step_path(self, name: str, suffix: str, **key: Any) -> Path:
        """Where step ``name`` (with these ``key`` arguments) is cached: ``steps/<name>-<key>.<suffix>``."""
        return self.steps.step_path(name, suffix, **key)

    def step(self, name: str, fn: Callable[[], pd.DataFrame], **key: Any) -> pd.DataFrame:
        """Cached intermediate table (`StepCache.step`): read from ``steps/`` when a previous run with the same
        key wrote it, else ``fn()`` computed and saved atomically. ``key``: whatever else the result depends on
        (JSON-able), e.g. a probe's target and site."""
        return self.steps.step(name, fn, **key)

    def step_arrays(self, name: str, fn: Callable[[], dict[str, np.ndarray]], **key: Any) -> dict[str, np.ndarray]:
        """Like :meth:`step` for a dict of numpy arrays (``steps/<name>-<key>.npz``)."""
        return self.steps.step_arrays(name, fn, **key)

    def write_table(self, df: pd.DataFrame, name: str, formats: Iterable[str] = io.TABLE_FORMATS) -> list[Path]:
        """Atomically write ``OUT/<exp>/<name>.parquet`` and ``.csv``; returns the paths."""
        return io.write_table(df, self.out_dir / name, formats=formats)


class StepCache:
    """The step cache of one experiment run (see the module docstring): results under
    ``out_dir/steps/<name>-<key>.parquet|npz``, keyed by the run's ``fingerprint``, the experiment's
    ``code_sha256``, its ``settings`` and each step's own key. ``used`` collects the file names read or written
    (the runner removes the others as stale); ``log`` says when a step is reused. The context owns one
    (``ctx.steps``); the job service (`experiments.jobs`) writes through it."""

    def __init__(self, out_dir: Path, fingerprint: dict[str, Any], code_sha256: str | None, settings: Any = None,
                 *, used: set[str] | None = None, log: Callable[[str], None] | None = None) -> None:  # fmt: skip
        self.out_dir = Path(out_dir)
        self.fingerprint, self.code_sha256, self.settings = fingerprint, code_sha256, settings
        self.used: set[str] = used if used is not None else set()
        self.log = log or (lambda msg: None)

    def step_key(self, name: str, **key: Any) -> str:
        """16 hex digits identifying step ``name``'s content: fingerprint, code hash, settings and ``key``."""
        import dataclasses

        settings = self.settings
        if dataclasses.is_dataclass(settings) and not isinstance(settings, type):
            settings = {"type": type(settings).__qualname__, **dataclasses.asdict(settings)}
        blob = {
            "step": name,
            "fingerprint": self.fingerprint,
            "code_sha256": self.code_sha256,
            "settings": settings,
            "key": key,
        }
        text = json.dumps(io.to_jsonable(blob), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def step_path(self, name: str, suffix: str, **key: Any) -> Path:
        """Where step ``name`` (with these ``key`` arguments) is cached: ``steps/<name>-<key>.<suffix>``."""
        return self.out_dir / STEPS / f"{_safe_name(name)}-{self.step_key(name, **key)}.{suffix}"

    def is_cached(self, name: str, suffix: str, **key: Any) -> bool:
        """Whether step ``name`` with this key is cached (``suffix``: ``parquet`` for a table, ``npz``)."""
        return self.step_path(name, suffix, **key).is_file()

    def step(self, name: str, fn: Callable[[], pd.DataFrame], **key: Any) -> pd.DataFrame:
        """Cached table: read back when cached, else ``fn()`` computed and written atomically."""
        import pandas as pd

        path = self.step_path(name, "parquet", **key)
        self.used.add(path.name)
        if path.is_file():
            self.log(f"step {name}: reusing {relative_path(path, self.out_dir)}")
            return pd.read_parquet(path)
        table = fn()
        if not is_dataframe(table):
            raise TypeError(f"step {name!r} must return a pandas DataFrame, got {type(table).__name__}")
        io.write_table(table, path, formats=("parquet",))
        return table

    def step_arrays(self, name: str, fn: Callable[[], dict[str, np.ndarray]], **key: Any) -> dict[str, np.ndarray]:
        """Like :meth:`step` for a dict of numpy arrays (``steps/<name>-<key>.npz``)."""
        import numpy as np

        path = self.step_path(name, "npz", **key)
        self.used.add(path.name)
        if path.is_file():
            self.log(f"step {name}: reusing {relative_path(path, self.out_dir)}")
            with np.load(path, allow_pickle=False) as data:
                return {k: data[k] for k in data.files}
        arrays = {k: np.asarray(v) for k, v in fn().items()}
        with io.atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, **arrays)
        return arrays


#: `Context.record_used` says what is used when the corpus holds at least this many times as many sentences.
MUCH_LARGER = 4

#: Seconds between two progress lines in a log file (`Context.progress` when stderr is not a terminal).
LOG_EVERY_S = 30.0


class LineProgress:
    """A progress counter that writes ``desc: n/total (p%), 1m30s elapsed, about 2m left`` to stderr at most every
    ``every`` seconds of work, and once at the end: the log-file form of a tqdm bar (iterate it, or ``update(n)``).
    """

    def __init__(self, iterable: Iterable[Any] | None, desc: str, total: int | None = None, *,
                 every: float | None = None, file: Any = None) -> None:  # fmt: skip
        import time

        self.iterable, self.desc, self.every, self.file = iterable, desc, every, file
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total, self.n = total, 0
        self.start = self.last = time.monotonic()
        self.closed = False

    def __iter__(self) -> Any:
        for item in self.iterable or ():
            yield item
            self.update(1)
        self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        """Count ``n`` more units done; write a line if ``every`` seconds passed since the last one."""
        import time

        self.n += n
        now = time.monotonic()
        if now - self.last >= (LOG_EVERY_S if self.every is None else self.every):
            self.last = now
            self._write(now)

    def close(self) -> None:
        """Write the closing line (once), when the work took long enough to have been reported at all."""
        import time

        if not self.closed:
            self.closed = True
            now = time.monotonic()
            if now - self.start >= (LOG_EVERY_S if self.every is None else self.every) or self.last != self.start:
                self._write(now, done=True)

    def _write(self, now: float, done: bool = False) -> None:
        elapsed = now - self.start
        count = f"{self.n}/{self.total}" if self.total else str(self.n)
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        left = ""
        if self.total and 0 < self.n < self.total:
            left = f", about {_duration(elapsed * (self.total - self.n) / self.n)} left"
        state = "done" if done else "elapsed"
        print(f"{self.desc}: {count}{pct}, {_duration(elapsed)} {state}{left}", file=self.file or sys.stderr,
              flush=True)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _seed_sequence(seed: int, keys: tuple[str | int, ...]) -> Any:
    import numpy as np

    entropy = [seed % 2**32] + [zlib.crc32(str(k).encode("utf-8")) for k in keys]
    return np.random.SeedSequence(entropy)


def _safe_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip(".")
    if not cleaned:
        raise ValueError(f"step name {name!r} has no usable characters")
    if cleaned != name:
        cleaned += "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return cleaned
