"""Atomic file output: every file the toolkit writes appears whole or not at all.

Each writer puts its bytes in a temporary file *in the destination folder* (same filesystem, so the final
``os.replace`` is atomic), flushes and fsyncs it, renames it over the destination, then fsyncs the folder.
If anything raises before the rename (an exception, Ctrl-C), the temporary file is deleted and the
destination is left as it was. A process killed outright (SIGKILL, power loss) can leave a temporary file
behind, never a half-written destination; temporaries are named ``.<name>.<token>.partial`` and
:func:`remove_partials` sweeps them.

>>> write_json(out / "manifest.json", {"status": "complete"})
>>> write_table(df, out / "results")              # results.parquet + results.csv
>>> save_figure(fig, out / "fig_heads")           # fig_heads.png + fig_heads.pdf
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

PARTIAL_SUFFIX = ".partial"
TABLE_FORMATS = ("parquet", "csv")
FIGURE_FORMATS = ("png", "pdf")
_UMASK = os.umask(0o022)
os.umask(_UMASK)
_FILE_MODE = 0o666 & ~_UMASK


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on clean exit it replaces ``path`` atomically.

    The caller writes the temporary path with any library (``df.to_parquet(tmp)``, ``fig.savefig(tmp)``);
    on exit the file is fsynced and renamed. On any exception (``KeyboardInterrupt`` included) the
    temporary file is removed and the exception propagates; ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}{PARTIAL_SUFFIX}")
    try:
        yield tmp
        if not tmp.exists():
            raise FileNotFoundError(f"atomic write of {path}: the writer produced no file at {tmp}")
        os.chmod(tmp, _FILE_MODE)  # some writers (safetensors) create 0600 files; use the usual umask mode
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Atomically write ``data`` to ``path``; returns ``path``."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
    return Path(path)


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Atomically write UTF-8 ``text`` to ``path``; returns ``path``."""
    return write_bytes(path, text.encode("utf-8"))


def write_chunks(path: str | os.PathLike[str], chunks: Iterable[bytes]) -> Path:
    """Atomically write an iterable of byte chunks (for streams too large to join in memory)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
    return Path(path)


def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Atomically write ``obj`` as indented JSON (NaN/inf become ``null``; paths and numpy scalars become
    plain values)."""
    text = json.dumps(to_jsonable(obj), indent=2, sort_keys=False, allow_nan=False)
    return write_text(path, text + "\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file; raises ``ValueError`` naming the file if it is not valid JSON."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e}); delete it or rerun with --force") from e


def write_table(
    df: Any, base: str | os.PathLike[str], formats: Iterable[str] = TABLE_FORMATS
) -> list[Path]:
    """Atomically write a DataFrame as ``base.<fmt>`` for each format (``parquet``, ``csv``).

    ``base`` may carry one of those suffixes already (``results.parquet``); it is replaced per format.
    Returns the written paths in ``formats`` order.
    """
    writers: dict[str, Callable[[Path], None]] = {
        "parquet": lambda p: df.to_parquet(p, index=False),
        "csv": lambda p: df.to_csv(p, index=False),
    }
    paths = []
    for fmt in formats:
        if fmt not in writers:
            raise ValueError(f"unknown table format {fmt!r}; use one of {sorted(writers)}")
        path = _with_format(base, fmt, writers)
        with atomic_path(path) as tmp:
            writers[fmt](tmp)
        paths.append(path)
    return paths



def read_table(out_dir: str | os.PathLike[str], name: str) -> Any:
    """The saved table ``out_dir/name.parquet`` (or ``name.csv`` when only that was written) as a DataFrame;
    ``None`` when neither exists. What ``plot`` and ``findings`` read, never the model."""
    import pandas as pd

    for suffix in (".parquet", ".csv"):
        path = Path(out_dir) / f"{name}{suffix}"
        if path.is_file():
            return pd.read_parquet(path) if suffix == ".parquet" else pd.read_csv(path)
    return None

def save_figure(
    fig: Any, base: str | os.PathLike[str], formats: Iterable[str] = FIGURE_FORMATS, dpi: int = 150
) -> list[Path]:
    """Atomically save a matplotlib figure as ``base.png`` and ``base.pdf``, cropped tight, then close it.

    Texts in scripts the default font lacks get installed fonts that cover them (``fonts.cover_figure``; one
    warning naming what to install when none does).

    The tight crop (what ``savefig(bbox_inches="tight")`` computes) is measured once, by :func:`tight_bbox`,
    and handed to every format, so each file costs one draw instead of a throwaway layout draw plus one:
    the PNG equals ``bbox_inches="tight"``'s and the PDF page has the same bounds. The figure is closed even
    if saving fails, so a failing loop does not leak figures.
    """
    import matplotlib.pyplot as plt
    from bertscope.experiments.fonts import cover_figure

    paths = []
    try:
        cover_figure(fig)  # token labels in any script: fonts that have their glyphs, or one warning saying so
        # a layout engine (constrained) re-runs at every savefig and moves the axes: let savefig crop after it
        bbox = "tight" if _lays_out_when_drawn(fig) else tight_bbox(fig, dpi)
        with _without_placeholder_layout(fig):
            for fmt in formats:
                path = _with_format(base, fmt, FIGURE_FORMATS)
                with atomic_path(path) as tmp:
                    fig.savefig(tmp, format=fmt, dpi=dpi, bbox_inches=bbox, metadata=_figure_metadata(fmt))
                paths.append(path)
    finally:
        plt.close(fig)
    return paths


def tight_bbox(fig: Any, dpi: float) -> Any:
    """The box, in inches, that ``fig.savefig(..., dpi=dpi, bbox_inches="tight")`` crops to.

    ``fig.get_tightbbox`` with the renderer the PNG is drawn with (text extents depend on the dpi), padded
    by ``rcParams["savefig.pad_inches"]`` as savefig pads it; returns a ``matplotlib.transforms.Bbox``.
    Savefig draws the figure once, with rendering disabled, before it measures; the measure lays out what
    it needs itself (ticks, titles, axis labels, aspect, colour bars, legends: the same box on every figure
    of the experiments, and `tests/experiments/test_io.py` pins the PNG), so that draw is left out (it cost as much as
    the measure) unless a layout engine has to place the axes first.
    """
    import matplotlib as mpl

    figure_dpi = fig.dpi
    fig.dpi = dpi
    try:
        if _lays_out_when_drawn(fig):
            fig.draw_without_rendering()  # a constrained (or tight) layout engine places the axes at draw time
        bbox = fig.get_tightbbox()
    finally:
        fig.dpi = figure_dpi
    return bbox.padded(mpl.rcParams["savefig.pad_inches"])


def remove_partials(folder: str | os.PathLike[str], recursive: bool = True) -> list[Path]:
    """Delete temporary files left by a killed writer under ``folder``; returns what was removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    pattern = f".*{PARTIAL_SUFFIX}"
    found = folder.rglob(pattern) if recursive else folder.glob(pattern)
    removed = []
    for p in found:
        if p.is_file():
            p.unlink()
            removed.append(p)
    return removed


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def parse_size(text: str | int) -> int:
    """Bytes in ``"256MB"``, ``"1.5GiB"``, ``"4096"`` (decimal kB/MB/GB, binary KiB/MiB/GiB)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?i?)b?\s*", str(text).lower())
    if not m:
        raise ValueError(f"size {text!r} is not a number of bytes like 4096, 64MB or 1GiB")
    number, unit = float(m.group(1)), m.group(2)
    power = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}[unit.rstrip("i")]
    size = int(number * (1024 if unit.endswith("i") else 1000) ** power)
    if size < 1:
        raise ValueError(f"size {text!r} is less than one byte")
    return size


def to_jsonable(obj: Any) -> Any:
    """Convert ``obj`` into plain JSON types: paths to str, numpy/torch scalars to numbers, tuples and
    sets to lists, dataclasses to dicts, non-finite floats to ``None``."""
    import dataclasses

    if obj is None or isinstance(obj, (bool, str, int)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj, key=str) if isinstance(obj, (set, frozenset)) else obj
        return [to_jsonable(v) for v in items]
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 0) == 0:
        return to_jsonable(obj.item())  # numpy / torch scalar
    if hasattr(obj, "tolist"):
        return to_jsonable(obj.tolist())
    return str(obj)


# ----------------------------------------------------------------------------------------------- helpers


def now() -> str:
    """UTC time now, ISO 8601 to the second (manifest timestamps)."""
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def is_dataframe(obj: Any) -> bool:
    """Whether ``obj`` is a pandas ``DataFrame`` (without importing pandas for callers that never hold one)."""
    import pandas as pd

    return isinstance(obj, pd.DataFrame)


def relative_path(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> str:
    """``path`` relative to ``root`` in POSIX form (as manifests record files), or ``path`` itself outside it."""
    try:
        return Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return str(path)


def _with_format(base: str | os.PathLike[str], fmt: str, known: Iterable[str]) -> Path:
    base = Path(base)
    if base.suffix.lstrip(".") in set(known):
        base = base.with_suffix("")
    return base.with_name(f"{base.name}.{fmt}")


def _lays_out_when_drawn(fig: Any) -> bool:
    from matplotlib.layout_engine import PlaceHolderLayoutEngine

    return not isinstance(fig.get_layout_engine(), (PlaceHolderLayoutEngine, type(None)))


@contextlib.contextmanager
def _without_placeholder_layout(fig: Any) -> Iterator[None]:
    # fig.tight_layout() leaves an inert PlaceHolderLayoutEngine behind; savefig re-lays out (one throwaway
    # draw) whenever any engine is set. The placeholder lays nothing out, so lift it while saving.
    from matplotlib.layout_engine import PlaceHolderLayoutEngine

    engine = fig.get_layout_engine()
    if not isinstance(engine, PlaceHolderLayoutEngine) or not hasattr(fig, "_layout_engine"):
        yield
        return
    fig._layout_engine = None
    try:
        yield
    finally:
        fig._layout_engine = engine


def _figure_metadata(fmt: str) -> dict[str, Any] | None:
    # No creation dates in the files, so identical figures give identical bytes.
    if fmt == "pdf":
        return {"CreationDate": None, "ModDate": None}
    if fmt == "png":
        return {"Software": None}
    return None


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(folder: Path) -> None:
    # Makes the rename itself durable; not supported on every platform (e.g. Windows), hence best effort.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
