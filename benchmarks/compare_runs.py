"""Compare two ``bertscope run`` results folders table by table.

    python benchmarks/compare_runs.py BEFORE AFTER [--atol 1e-9] [--ignore-column model]

Every table (``*.parquet``, and ``*.csv`` without a parquet twin) under either folder is matched by its path
relative to the folder; ``steps/`` and capture shards are skipped. For each pair it reports: missing on one
side, different columns, different row counts, and per column the rows whose values differ (numbers beyond
``atol``, NaN equal to NaN; anything else by equality). Rows are compared in their saved order; tables are
first sorted by their non-float columns when both sides hold the same rows in another order. Exit status 0
when everything matches, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def tables(root: Path) -> dict[str, Path]:
    """Relative path (without suffix) -> file, for every results table under ``root``."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or "steps" in rel.parts or path.suffix not in (".parquet", ".csv"):
            continue
        key = rel.with_suffix("").as_posix()
        if key not in found or path.suffix == ".parquet":  # the parquet copy keeps dtypes
            found[key] = path
    return found


def read(path: Path) -> pd.DataFrame:
    """A table as saved (parquet or csv)."""
    return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)


def compare(a: pd.DataFrame, b: pd.DataFrame, atol: float, ignore: set[str]) -> list[str]:
    """Differences between two tables as lines of text (empty when they match)."""
    problems = []
    if list(a.columns) != list(b.columns):
        only_a = [c for c in a.columns if c not in b.columns]
        only_b = [c for c in b.columns if c not in a.columns]
        problems.append(f"columns differ: only before {only_a}, only after {only_b}"
                        + ("" if only_a or only_b else " (order)"))
    if len(a) != len(b):
        return [*problems, f"rows differ: {len(a)} before, {len(b)} after"]
    common = [c for c in a.columns if c in b.columns and c not in ignore]
    a, b = _align(a.reset_index(drop=True), b.reset_index(drop=True), common)
    for col in common:
        bad = _mismatch(a[col], b[col], atol)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            delta = ""
            if _numeric(a[col]) and _numeric(b[col]):
                diff = np.abs(a[col].to_numpy(float) - b[col].to_numpy(float))
                delta = f", max |diff| {np.nanmax(np.where(bad, diff, np.nan)):.3g}"
            problems.append(f"column {col!r}: {int(bad.sum())}/{len(bad)} rows differ{delta} "
                            f"(first: row {i}: {a[col].iloc[i]!r} vs {b[col].iloc[i]!r})")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--atol", type=float, default=1e-9, help="absolute tolerance on numbers (default 1e-9)")
    p.add_argument("--ignore-column", action="append", default=[], help="a column not to compare (repeatable)")
    args = p.parse_args(argv)
    before, after = tables(args.before), tables(args.after)
    n_bad = 0
    for key in sorted(set(before) | set(after)):
        if key not in before or key not in after:
            print(f"{key}: only {'after' if key not in before else 'before'}")
            n_bad += 1
            continue
        problems = compare(read(before[key]), read(after[key]), args.atol, set(args.ignore_column))
        print(f"{key}: {'equal' if not problems else 'DIFFERENT'}")
        for line in problems:
            print(f"    {line}")
        n_bad += bool(problems)
    print(f"{len(set(before) | set(after))} tables, {n_bad} with differences")
    return 1 if n_bad else 0


def _numeric(s: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s)


def _mismatch(a: pd.Series, b: pd.Series, atol: float) -> np.ndarray:
    if _numeric(a) and _numeric(b):
        x, y = a.to_numpy(float), b.to_numpy(float)
        both_nan = np.isnan(x) & np.isnan(y)
        with np.errstate(invalid="ignore"):
            return ~(both_nan | (np.abs(x - y) <= atol))
    both_na = a.isna().to_numpy() & b.isna().to_numpy()
    return ~(both_na | (a.astype(str).to_numpy() == b.astype(str).to_numpy()))


def _align(a: pd.DataFrame, b: pd.DataFrame, columns: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    # Same rows in another order: sort both by their identifying (non-float) columns.
    keys = [c for c in columns if not pd.api.types.is_float_dtype(a[c])]
    if not keys:
        return a, b
    ka, kb = a[keys].map(str), b[keys].map(str)  # elementwise: pandas 3 astype(str) keeps missing values
    if ka.equals(kb) or ka.duplicated().any():
        return a, b
    if sorted(map(tuple, ka.to_numpy())) != sorted(map(tuple, kb.to_numpy())):
        return a, b
    order_a = ka.sort_values(keys).index
    order_b = kb.sort_values(keys).index
    return a.loc[order_a].reset_index(drop=True), b.loc[order_b].reset_index(drop=True)


if __name__ == "__main__":
    sys.exit(main())
