"""Time ``bertscope run all`` and each experiment on the bundled model and builtin corpus.

    python benchmarks/run_all.py                      # time `run all` (fresh output folder), print a table
    python benchmarks/run_all.py --record             # also write experiments/run_times.json for `run NAME --help`
    python benchmarks/run_all.py --from OUT --record  # record from a finished `bertscope run all --out OUT`

`run all` runs in a child process with a fresh output folder (nothing cached); wall seconds per experiment come
from each manifest's ``seconds``, CPU seconds of the whole child from ``getrusage``. CPU seconds divided by the
cores this process may use is the least wall time any schedule of that work could take; it is printed beside
the wall time with the share of it the cores were busy. The load average before and
after is printed: on a shared machine the times mean little unless it stays near zero. ``--record`` refuses to
write when the 1-minute load average before the run exceeds ``--max-load`` (default 0.5).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "experiments" / "run_times.json"


def time_run_all(extra: list[str]) -> dict:
    """Run ``bertscope run all`` once in a fresh folder; returns wall, CPU and per-experiment seconds."""
    with tempfile.TemporaryDirectory(prefix="bertscope-run-all-") as out:
        load_before = os.getloadavg()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "bertscope", "run", "all", "--out", out, "--quiet", *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            sys.exit(f"run all failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        per = {}
        for manifest in sorted(Path(out).glob("*/manifest.json")):
            data = json.loads(manifest.read_text())
            per[data["experiment"]] = {"seconds": data["seconds"], "status": data["status"]}
        return {
            "wall_seconds": round(wall, 1),
            "cpu_seconds": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1),
            "experiments": per,
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
        }


def read_run(out: Path) -> dict:
    """Per-experiment seconds from the manifests of a finished ``bertscope run all --out OUT`` (no CPU time or
    load average: those were not observed)."""
    per = {}
    for manifest in sorted(Path(out).glob("*/manifest.json")):
        data = json.loads(manifest.read_text())
        if data.get("status") != "complete":
            sys.exit(f"{manifest}: status {data.get('status')!r}; record only complete runs")
        per[data["experiment"]] = {"seconds": data["seconds"], "status": data["status"]}
    if not per:
        sys.exit(f"no manifests under {out}")
    total = round(sum(row["seconds"] for row in per.values()), 1)
    return {"wall_seconds": total, "cpu_seconds": None, "experiments": per, "load_before": None, "load_after": None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help="write experiments/run_times.json")
    parser.add_argument("--max-load", type=float, default=0.5, help="refuse --record above this load (default 0.5)")
    parser.add_argument("--from", dest="source", type=Path, help="read a finished run's manifests instead of running")
    parser.add_argument("extra", nargs="*", help="more `bertscope run` options, after --")
    args = parser.parse_args()
    if args.record and args.source is None and os.getloadavg()[0] > args.max_load:
        sys.exit(f"load average {os.getloadavg()[0]:.2f} > {args.max_load}: timings would not be honest; not recording")
    result = read_run(args.source) if args.source else time_run_all(args.extra)
    cpu = "" if result["cpu_seconds"] is None else f", {result['cpu_seconds']:.0f} s CPU"
    print(f"run all: {result['wall_seconds']:.0f} s wall{cpu} (load before {result['load_before']}, "
          f"after {result['load_after']})")
    if result["cpu_seconds"] is not None:
        cores = len(os.sched_getaffinity(0))
        floor = result["cpu_seconds"] / cores
        print(f"  the CPU work alone needs at least {floor:.0f} s on {cores} cores "
              f"(CPU / cores: no schedule of this work finishes sooner); the cores were busy "
              f"{100 * floor / result['wall_seconds']:.0f}% of the wall time")
    for name, row in result["experiments"].items():
        print(f"  {name:<12} {row['seconds']:>7.1f} s  {row['status']}")
    if args.record:
        record = {
            "measured": _dt.date.today().isoformat(),
            "machine": f"{os.cpu_count()} CPU cores, {platform.processor() or platform.machine()}, "
            f"torch threads default",
            "command": "bertscope run all (bundled model, builtin corpus, default settings, nothing cached)",
            **result,
        }
        RECORD.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {RECORD.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
