"""GPU check of issue 26: every experiment on the GPU, its headline table equal to the CPU's, and capture speed.

    python benchmarks/gpu/check_activations.py                      # on the GPU machine (benchmarks/gpu.sh runs it)
    python benchmarks/gpu/check_activations.py --device cpu --small  # smoke test: tiny model, a few sentences

On a random-weight model of bert-base's shape (`common.random_bert`, saved offline with the bundled tokenizer):

1. ``bertscope run EXPERIMENT --device DEVICE`` for each installed experiment (``--max-sentences`` small so the
   whole check fits a few minutes), timed one by one (wall seconds of the subprocess);
2. the same on CPU (``--device cpu``), then each experiment's headline table (its first ``SUMMARY_TABLES``
   entry) compared CPU vs DEVICE: the largest absolute difference of every float column, equal when within
   ``--atol`` (float32 kernels differ between devices in the last bits; probe fits amplify that a little);
3. plain forward and full capture (every hook, per-head results) timed round-robin on DEVICE
   (``benchutils.time_interleaved``): the speed ratio plain / full (target >= 0.8), and on CUDA the capture's
   peak allocation over the bytes it captured (target <= 1.3).

Budget: the CPU half runs bert-base-shaped experiments too; on the lent machine (16 cores) give the check
``CHECK_LIMIT_S=600`` in ``benchmarks/gpu.sh`` or pass ``--experiments`` / ``--skip-cpu``. A CPU-only run
(``--device cpu``) compares the CPU with itself (a determinism check) and says so. Results go to
``OUT/check_activations.json``, rewritten after every step, so a time limit keeps what finished.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ (benchutils)

import common  # noqa: E402


def run_experiment(model: Path, name: str, device: str, out: Path, max_sentences: int, batch_size: int) -> dict:
    """``bertscope run NAME`` in a subprocess; its wall seconds, exit status and the tail of its output."""
    cmd = [sys.executable, "-m", "bertscope", "run", name, "--model", str(model), "--device", device, "--out", str(out),
           "--max-sentences", str(max_sentences), "--batch-size", str(batch_size), "--no-report", "--quiet", "--force"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    return {"rc": proc.returncode, "seconds": round(seconds, 2), "tail": (proc.stdout + proc.stderr)[-600:]}


def headline(out: Path, module: Any) -> Any:
    """The experiment's headline table (its first summary table) from ``out``, or ``None`` if it was not written."""
    import pandas as pd

    folder = out / module.DIRNAME
    for table in module.SUMMARY_TABLES[:1]:
        for suffix in (".parquet", ".csv"):
            path = folder / f"{table}{suffix}"
            if path.exists():
                return pd.read_parquet(path) if suffix == ".parquet" else pd.read_csv(path)
    return None


def compare(a: Any, b: Any, atol: float) -> dict:
    """Largest absolute difference over the float columns of two tables, and whether the rest is identical."""
    import numpy as np

    if a is None or b is None:
        return {"equal": False, "why": "table missing on one side"}
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return {"equal": False, "why": f"shape {a.shape} vs {b.shape} or columns differ"}
    worst, other_equal = 0.0, True
    for col in a.columns:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        if np.issubdtype(x.dtype, np.floating) and np.issubdtype(y.dtype, np.floating):
            both_nan = np.isnan(x) & np.isnan(y)
            diff = np.where(both_nan, 0.0, np.abs(x - y))
            worst = max(worst, float(np.nan_to_num(diff, nan=np.inf).max(initial=0.0)))
        else:
            sa, sb = (t[col].astype(str).where(t[col].notna(), "<NA>").to_numpy() for t in (a, b))  # NaN == NaN
            other_equal &= bool((sa == sb).all())
    return {"equal": other_equal and worst <= atol, "max_abs_diff": worst, "non_float_equal": other_equal}


def capture_speed(model_dir: Path, device: str, batch: int, length: int, repeats: int) -> dict:
    """Plain forward vs full capture on ``device``, timed round-robin in this process."""
    import torch
    from benchutils import make_batch, time_interleaved

    from bertscope import models

    dev = torch.device(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    model = models.load(str(model_dir), device=dev)
    inputs = make_batch(batch, length, model.tokenizer, dev, vocab_size=model.config.vocab_size)
    fns = {"plain forward": lambda: model(**inputs), "full capture": lambda: model.run_with_cache(**inputs)[1].nbytes()}
    with torch.inference_mode():
        wall = time_interleaved(fns, dev, repeats)
        memory = _capture_memory(model, inputs, dev)
    return {"batch": batch, "length": length, "repeats": repeats,
            "plain_ms": round(wall["plain forward"] * 1e3, 3), "full_ms": round(wall["full capture"] * 1e3, 3),
            "ratio": round(wall["plain forward"] / wall["full capture"], 3), **memory}


def _capture_memory(model: Any, inputs: dict, dev: Any) -> dict:
    """Bytes one full capture holds and, on CUDA, its peak allocation above what was held before (target: peak <=
    1.3 x captured); on CPU only the bytes (``benchmarks/full_capture.py`` measures the CPU peak in a fresh process)."""
    import torch

    if dev.type != "cuda":
        return {"captured_mib": round(model.run_with_cache(**inputs)[1].nbytes() / 2**20, 1)}
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    before = torch.cuda.memory_allocated(dev)
    captured = model.run_with_cache(**inputs)[1].nbytes()
    torch.cuda.synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev) - before
    return {"captured_mib": round(captured / 2**20, 1), "peak_mib": round(peak / 2**20, 1),
            "peak_over_captured": round(peak / captured, 3)}


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--max-sentences", type=int, default=None, help="sentences per experiment (default 48; small: 12)")
    p.add_argument("--experiments", default=None, help="comma-separated experiment names (default: all installed)")
    p.add_argument("--atol", type=float, default=1e-3, help="CPU-vs-device tolerance on headline floats")
    p.add_argument("--skip-cpu", action="store_true", help="only the device runs and the capture ratio")
    p.add_argument("--compare", default=None,
                   help="comma-separated experiments to rerun on CPU and compare (default: every one run)")
    args = p.parse_args()

    import torch
    from bertscope.experiments import registry

    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        print(f"no CUDA device here; running the check on cpu instead of {device}")
        device = "cpu"
    out = args.out
    work = common.SCRATCH / "check_activations"
    model = common.random_bert(small=args.small)
    n = args.max_sentences or (12 if args.small else 48)
    names = args.experiments.split(",") if args.experiments else list(registry.EXPERIMENTS)
    result: dict[str, Any] = {"device": device, "model": "random bert-base shape" if not args.small else "random small",
                              "max_sentences": n, "cpu_only": device == "cpu", "experiments": {}}
    if device.startswith("cuda"):
        result["gpu"] = torch.cuda.get_device_name(torch.device(device))
    else:
        result["note"] = "CPU only: the 'device' run is on the CPU too, so equality is a determinism check"

    # the capture ratio first, then every experiment on the device, then the CPU runs to compare with: a check cut
    # short by its time limit keeps what finished (the JSON is rewritten after each step)
    speed = capture_speed(model, device, 4 if args.small else 16, 32 if args.small else 128, 3 if args.small else 10)
    result["capture_speed"] = speed
    print(f"full capture / plain forward speed on {device} = {speed['ratio']:.3f} "
          f"(plain {speed['plain_ms']:.1f} ms, full {speed['full_ms']:.1f} ms; {speed['batch']} x {speed['length']}); "
          + (f"peak memory {speed['peak_over_captured']:.3f} x the {speed['captured_mib']:.1f} MiB captured"
             if "peak_mib" in speed else f"{speed['captured_mib']:.1f} MiB captured"), flush=True)
    common.write_result(out, "check_activations", result)
    for name in names:
        run = run_experiment(model, name, device, work / "runs_device", n, 16)
        entry = result["experiments"][name] = {"device_run": run}
        print(f"{name:<12} {device} rc={entry['device_run']['rc']} {entry['device_run']['seconds']:7.1f}s", flush=True)
        if entry["device_run"]["rc"] != 0:
            print(entry["device_run"]["tail"], flush=True)
        common.write_result(out, "check_activations", result)
    compare_names = [] if args.skip_cpu else args.compare.split(",") if args.compare else names
    for name in compare_names:
        module = registry.load_experiment(name)
        entry = result["experiments"][name]
        entry["cpu_run"] = run_experiment(model, name, "cpu", work / "runs_cpu", n, 16)
        entry["headline"] = module.SUMMARY_TABLES[0]
        entry["equality"] = eq = compare(headline(work / "runs_cpu", module), headline(work / "runs_device", module),
                                         args.atol)
        print(f"{name:<12} cpu rc={entry['cpu_run']['rc']} {entry['cpu_run']['seconds']:7.1f}s  headline "
              f"{entry['headline']} equal={eq.get('equal')} max|diff|={eq.get('max_abs_diff', eq.get('why'))}",
              flush=True)
        common.write_result(out, "check_activations", result)
    path = common.write_result(out, "check_activations", result)
    print(f"wrote {path}")
    failed = [k for k, e in result["experiments"].items()
              if e["device_run"]["rc"] != 0 or not e.get("equality", {"equal": True})["equal"]]
    if failed:
        print(f"not equal or failed: {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
