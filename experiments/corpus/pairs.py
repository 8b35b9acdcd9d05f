"""Pairs corpora: files of text pairs for the experiments that read pairs rather than sentences (similarity's
scored sentence pairs, minimal-pairs' good/bad sentences).

    fmt = PairsFormat("similarity pairs", ("a", "b", "score"), numeric=("score",),
                      aliases={"a": ("sentence1",), "b": ("sentence2",)})
    pairs = read_pairs("stsb-en-dev.csv", fmt)     # CSV, TSV or JSONL; gzip too; header optional
    pairs.frame                                    # DataFrame: id, a, b, score

An experiment package that declares ``PAIRS: PairsFormat`` reads ``--corpus FILE`` with `read_pairs` when it
runs alone (`check_pairs_corpus`, before anything is written); otherwise it uses its own builtin pairs, built
with `pairs_from_rows`. Bad files raise `PairsError`: one line naming the file, the line and what is wrong.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

#: Suffixes read as comma-separated, tab-separated and JSON lines (a trailing ``.gz`` is read through gzip).
CSV_SUFFIXES = (".csv",)
TSV_SUFFIXES = (".tsv", ".txt", ".tab")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


class PairsError(ValueError):
    """A pairs file that cannot be read: the message is one line naming the file, the line and the problem."""


@dataclass(frozen=True)
class PairsFormat:
    """What a row of a pairs file holds.

    ``kind``: words for messages ("similarity pairs"); ``columns``: the columns every row needs, in the order a
    header-less CSV/TSV gives them; ``optional``: columns kept when present (a header or JSON key names them;
    a header-less file's extra cells fill them in order); ``numeric``: columns that must parse as numbers;
    ``aliases``: other header/JSON-key spellings of a column (matched case-insensitively).
    """

    kind: str
    columns: tuple[str, ...]
    optional: tuple[str, ...] = ()
    numeric: tuple[str, ...] = ()
    aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def spellings(self) -> dict[str, str]:
        """Lower-cased header spelling -> column name."""
        out = {}
        for name in (*self.columns, *self.optional):
            for spelling in (name, *self.aliases.get(name, ())):
                out[spelling.lower()] = name
        return out

    def text_columns(self) -> tuple[str, ...]:
        """The required columns that are texts (not numeric): none of them may be empty."""
        return tuple(c for c in self.columns if c not in self.numeric)


@dataclass(frozen=True)
class Pairs:
    """A pairs corpus: ``frame`` has ``id`` (0..n-1, file order) and the format's columns."""

    name: str
    source: str
    sha256: str
    frame: pd.DataFrame
    kind: str = "pairs"

    def __len__(self) -> int:
        return len(self.frame)

    def summary(self) -> dict[str, Any]:
        """The manifest's description of the corpus."""
        return {"name": self.name, "source": self.source, "sha256": self.sha256, "kind": self.kind,
                "n_pairs": len(self.frame), "columns": [c for c in self.frame.columns if c != "id"]}


def read_pairs(path: str | Path, fmt: PairsFormat, *, max_rows: int | None = None) -> Pairs:
    """Read a CSV, TSV or JSONL pairs file (optionally gzipped) as ``fmt`` describes; the first ``max_rows`` rows.

    A CSV/TSV header is recognised when every required column is named by one of its cells; without one the
    cells are taken in ``fmt.columns`` order, then ``fmt.optional``. Quoted cells may hold the delimiter.
    Raises `PairsError` (one line) for a missing file, an empty file, a row without a required column, a
    non-numeric value in a numeric column or an empty text.
    """
    p = Path(path).expanduser()
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise PairsError(f"{p}: cannot read it ({e.strerror or type(e).__name__})") from None
    try:
        text = (gzip.decompress(raw) if p.suffix == ".gz" else raw).decode("utf-8-sig")
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise PairsError(f"{p}: not UTF-8 text{' (or not gzip)' if p.suffix == '.gz' else ''}: {e}") from None
    suffix = Path(p.name.removesuffix(".gz")).suffix.lower()
    if not text.strip():
        raise PairsError(f"{p}: the file is empty; give one {fmt.kind} row per line")
    if suffix in JSONL_SUFFIXES:
        rows = _jsonl_rows(p, text, fmt)
    else:
        delimiter = "," if suffix in CSV_SUFFIXES else "\t" if suffix in TSV_SUFFIXES else _sniff(text)
        rows = _delimited_rows(p, text, fmt, delimiter)
    if max_rows is not None:
        rows = rows[:max_rows]
    if not rows:
        raise PairsError(f"{p}: no {fmt.kind} rows (only a header?)")
    frame = _frame(p, rows, fmt)
    return Pairs(p.name, str(p), hashlib.sha256(raw).hexdigest(), frame, fmt.kind)


def pairs_from_rows(name: str, rows: Iterable[Mapping[str, Any]], fmt: PairsFormat) -> Pairs:
    """A builtin pairs corpus from dicts keyed by the format's columns (checked like a file's rows)."""
    listed = [(i + 1, dict(r)) for i, r in enumerate(rows)]
    frame = _frame(Path(name), listed, fmt)
    digest = hashlib.sha256(frame.to_csv(index=False).encode()).hexdigest()
    return Pairs(name, "builtin", digest, frame, fmt.kind)


def check_pairs_corpus(module: Any, spec: str, max_rows: int | None = None) -> Pairs | None:
    """The pairs ``--corpus`` of an experiment run alone: ``None`` for a corpus name (``builtin``) or an
    experiment without ``PAIRS``, else the file read by `read_pairs` (`PairsError` for a bad one)."""
    fmt = getattr(module, "PAIRS", None)
    if fmt is None or spec in ("builtin", None):
        return None
    return read_pairs(spec, fmt, max_rows=max_rows)


def _sniff(text: str) -> str:
    first = text.lstrip().splitlines()[0]
    return "\t" if "\t" in first else ","


def _jsonl_rows(p: Path, text: str, fmt: PairsFormat) -> list[tuple[int, dict[str, Any]]]:
    spellings = fmt.spellings()
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise PairsError(f"{p}:{n}: not a JSON object ({e.msg})") from None
        if not isinstance(obj, dict):
            raise PairsError(f"{p}:{n}: not a JSON object; give one object a line with keys "
                             f"{', '.join(map(repr, fmt.columns))}")
        rows.append((n, {spellings[k.lower()]: v for k, v in obj.items() if k.lower() in spellings}))
    return rows


def _delimited_rows(p: Path, text: str, fmt: PairsFormat, delimiter: str) -> list[tuple[int, dict[str, Any]]]:
    spellings = fmt.spellings()
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    rows: list[tuple[int, dict[str, Any]]] = []
    names: Sequence[str | None] | None = None
    try:
        for cells in reader:
            n = reader.line_num
            if not any(c.strip() for c in cells):
                continue
            if names is None:
                header = [spellings.get(c.strip().lower()) for c in cells]
                if set(fmt.columns) <= set(header):
                    names = header
                    continue
                names = [*fmt.columns, *fmt.optional]
            rows.append((n, {name: cell for name, cell in zip(names, cells, strict=False) if name is not None}))
    except csv.Error as e:
        raise PairsError(f"{p}:{reader.line_num}: {e}") from None
    return rows


def _frame(p: Path, rows: list[tuple[int, dict[str, Any]]], fmt: PairsFormat) -> pd.DataFrame:
    present = [c for c in fmt.optional if any(c in r for _, r in rows)]
    records = []
    for n, row in rows:
        missing = [c for c in fmt.columns if c not in row or row[c] is None]
        if missing:
            raise PairsError(f"{p}:{n}: no {', '.join(map(repr, missing))} column; each {fmt.kind} row needs "
                             f"{', '.join(map(repr, fmt.columns))}")
        record: dict[str, Any] = {}
        for c in (*fmt.columns, *present):
            value = row.get(c)
            if c in fmt.numeric and value is not None:
                try:
                    value = float(value)
                except (TypeError, ValueError):
                    raise PairsError(f"{p}:{n}: {c} {value!r} is not a number") from None
            elif value is not None:
                value = str(value)
            record[c] = value
        for c in fmt.text_columns():
            if not record[c].strip():
                raise PairsError(f"{p}:{n}: empty {c!r} text; every {fmt.kind} row needs both texts")
        records.append(record)
    frame = pd.DataFrame.from_records(records, columns=[*fmt.columns, *present])
    frame.insert(0, "id", range(len(frame)))
    return frame
