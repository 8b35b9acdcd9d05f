"""Scaling of ``bertscope capture`` over processes: whole-command wall time, tokens/s, and bit-identity with one
process.

    python benchmarks/capture_scaling.py --max-procs 2 --threads 1 --max-sentences 3000
    python benchmarks/capture_scaling.py --max-procs 4 --threads 4 --model /tmp/minilm --corpus /tmp/mid.txt
    python benchmarks/capture_scaling.py --procs 1 --device cuda --model /tmp/minilm --corpus /tmp/big.txt

For each process count (1, 2, ... ``--max-procs``, or the list ``--procs``) it runs ``python -m bertscope
capture`` once (``--repeat`` times, keeping the fastest), each into a fresh folder under ``--work``, every
process with ``OMP_NUM_THREADS=--threads``, and times the whole command. One process is a plain process (no
torchrun); N > 1 is ``--nproc N``; ``--torchrun-one`` adds ``--nproc 1`` (torchrun with one worker), which
shows what the launcher costs. ``--model``, ``--corpus``, ``--max-sentences``, ``--hooks``, ``--device``,
``--shard-size``, ``--batch-size`` are passed through. Every capture is then compared with the first one-process
capture: shard files byte for byte, and ``bertscope.load_capture``'s rows and tensors (``torch.equal``).

Columns: processes, threads each, shards, wall s (the whole command), forward s (the slowest rank's forward and
shard writing, from the command's per-rank summary), other s (wall minus forward: interpreter and package
start-up, model and tokenizer loading, tokenising the corpus on every rank, the index, shutdown, and the
launcher's own start-up with torchrun), tokens/s in total (token rows / wall), tokens/s per process (that
over the processes), the ranks' own forward tokens/s, speed-up in wall time vs one process, identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RANK_LINE = re.compile(r"^\s*rank (\d+): (\d+) shard\(s\), ([\d,]+) token rows run, (?:([\d,.]+) tokens/s|idle)")


def main() -> int:
    args = parse_args()
    counts = [int(n) for n in args.procs.split(",")] if args.procs else list(range(1, args.max_procs + 1))
    runs = [("1", 1, False)] if 1 in counts else []
    if args.torchrun_one:
        runs.append(("1 (torchrun)", 1, True))
    runs += [(str(n), n, True) for n in counts if n > 1]
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="capture-scaling-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"threads per process {args.threads}; folders under {work}", flush=True)
    results = []
    try:
        for label, n, torchrun in runs:
            out = work / f"procs-{label.replace(' ', '-').strip('()')}"
            best = None
            for _ in range(args.repeat):
                result = run_capture(args, out, n if torchrun else None, work)
                best = result if best is None or result["wall"] < best["wall"] else best
            best |= {"label": label, "n": n, "out": out}
            results.append(best)
            print(f"  {label:>12} process(es): {best['wall']:.1f} s", flush=True)
        reference = next((r["out"] for r in results if r["label"] == "1"), results[0]["out"])
        for r in results:
            r["identical"] = "-" if r["out"] == reference else same_capture(reference, r["out"])
        print_table(results, args.threads)
    finally:
        if not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r["identical"] in ("-", "yes") for r in results) else 1


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--max-procs", type=int, default=2, help="run 1, 2, ... this many processes (default 2)")
    p.add_argument("--procs", help="comma-separated process counts instead, e.g. 1,2,4,8")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS for every process (default 1)")
    p.add_argument("--torchrun-one", action="store_true", help="also run --nproc 1 (torchrun with one worker)")
    p.add_argument("--repeat", type=int, default=1, help="runs per process count, the fastest kept (default 1)")
    p.add_argument("--model", help="passed to bertscope capture (default: the bundled model)")
    p.add_argument("--corpus", help="passed to bertscope capture (default: builtin)")
    p.add_argument("--max-sentences", type=int, help="passed to bertscope capture")
    p.add_argument("--hooks", default="blocks.*.hook_resid_post", help="passed to bertscope capture")
    p.add_argument("--device", default="cpu", help="passed to bertscope capture (default cpu)")
    p.add_argument("--shard-size", help="passed to bertscope capture (default: its own, auto)")
    p.add_argument("--batch-size", type=int, help="passed to bertscope capture")
    p.add_argument("--work", help="folder for the captures (default: a temporary one, removed at the end)")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder")
    return p.parse_args()


def run_capture(args: argparse.Namespace, out: Path, nproc: int | None, cwd: Path) -> dict:
    """One ``bertscope capture`` into ``out`` (emptied first): wall seconds and what its summary says."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "bertscope", "capture", "--hooks", args.hooks, "--device", args.device,
           "--out", str(out)]  # fmt: skip
    for flag, value in (("--model", _path(args.model)), ("--corpus", _path(args.corpus)),
                        ("--max-sentences", args.max_sentences), ("--shard-size", args.shard_size),
                        ("--batch-size", args.batch_size), ("--nproc", nproc)):  # fmt: skip
        if value is not None:
            cmd += [flag, str(value)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    # run outside the source tree: a `bertscope` folder in the working directory would shadow the package
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    ranks = []
    for line in proc.stdout.splitlines():
        if m := RANK_LINE.match(line):
            rows = int(m.group(3).replace(",", ""))
            rate = float(m.group(4).replace(",", "")) if m.group(4) else None
            ranks.append({"rank": int(m.group(1)), "shards": int(m.group(2)), "rows": rows, "rate": rate,
                          "seconds": rows / rate if rate else 0.0})  # fmt: skip
    index = json.loads((out / "index.json").read_text())
    return {"wall": wall, "ranks": ranks, "n_rows": index["n_rows"], "n_shards": len(index["shards"])}


def _path(value: str | None) -> str | None:
    """A path that exists made absolute (the command runs in another folder); names such as builtin kept."""
    return str(Path(value).resolve()) if value and Path(value).exists() else value


def same_capture(a: Path, b: Path) -> str:
    """``yes`` when both captures hold the same shard bytes, rows and tensors; else what differs."""
    import torch

    import bertscope

    def hashes(folder: Path) -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("shard-*.safetensors"))}

    same_bytes = hashes(a) == hashes(b)
    tensors_a, rows_a = bertscope.load_capture(a)
    tensors_b, rows_b = bertscope.load_capture(b)
    same_rows = rows_a.equals(rows_b)
    same_tensors = tensors_a.keys() == tensors_b.keys() and all(
        torch.equal(tensors_a[k], tensors_b[k]) for k in tensors_a
    )
    if same_bytes and same_rows and same_tensors:
        return "yes"
    return "NO (" + ", ".join(w for w, ok in (("shard bytes", same_bytes), ("rows", same_rows),
                                             ("tensors", same_tensors)) if not ok) + ")"  # fmt: skip


def print_table(results: list[dict], threads: int) -> None:
    base = next((r["wall"] for r in results if r["label"] == "1"), None)
    header = ["processes", "threads each", "shards", "wall s", "forward s", "other s", "tokens/s total",
              "tokens/s per process", "rank forward tokens/s", "speed-up vs 1", "identical"]  # fmt: skip
    rows = []
    for r in results:
        forward = max((k["seconds"] for k in r["ranks"]), default=0.0)
        total = r["n_rows"] / r["wall"]
        rates = [k["rate"] for k in r["ranks"] if k["rate"]]
        if len(rates) <= 4:
            rank_rates = ", ".join(f"{x:,.0f}" for x in rates)
        else:
            rank_rates = f"{min(rates):,.0f} to {max(rates):,.0f}"
        rows.append([r["label"], str(threads), str(r["n_shards"]), f"{r['wall']:.1f}", f"{forward:.1f}",
                     f"{r['wall'] - forward:.1f}", f"{total:,.0f}", f"{total / r['n']:,.0f}", rank_rates,
                     f"{base / r['wall']:.2f}" if base else "-", r["identical"]])  # fmt: skip
    print(f"\n{results[0]['n_rows']:,} token rows per capture")
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    sys.exit(main())
