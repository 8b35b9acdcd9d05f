"""Full capture against a plain forward: the ratio of their speeds, measured in one run, and the capture's peak memory.

    python benchmarks/full_capture.py                       # bundled model, 16 x 128, 2 threads, CPU
    python benchmarks/full_capture.py --device cuda
    python benchmarks/full_capture.py --model DIR --batch 4 --length 32 --repeats 3
    python benchmarks/full_capture.py --profile            # + where the full capture spends its extra time
    python benchmarks/full_capture.py --system-allocator   # glibc's defaults, as before keep_freed_memory

"Full capture" is ``run_with_cache`` with every hook point, per-head results (``attn.hook_result``) included; "plain"
is the forward with no hooks. The two are timed round-robin in one process (``benchutils.time_interleaved``), so
a machine shared with other work slows both alike; the ratio plain / full is the speed of a full capture as a
fraction of a plain forward's (target >= 0.8, i.e. a capture costs at most 1.25 forwards). On CPU the ratio is
also given in CPU seconds of this process (steadier than wall time on a loaded machine). Peak memory of one full
capture is measured in a fresh subprocess (CPU: peak growth of resident memory; GPU: peak allocated) beside the
bytes captured (target: peak <= 1.3 x captured). On CPU it also prints each arm's minor page faults per call: a
capture writes its bytes into fresh pages (glibc hands large freed blocks back to the system, so every capture faults
its pages in again, kernel time that a plain forward, reusing its buffers, does not pay). So the benchmark
first applies ``keep_freed_memory`` (``experiments/capture/allocator.py``), as the ``bertscope`` command does at
start: glibc then keeps freed memory and reuses it; ``--system-allocator`` measures glibc's defaults instead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from benchutils import make_batch, time_interleaved
from bertscope.experiments.capture import keep_freed_memory

from bertscope import models


def _configs(model, batch):
    return {
        "plain forward": lambda: model(**batch),
        "full capture": lambda: model.run_with_cache(**batch)[1].nbytes(),
    }


def _counting_faults(fns: dict, faults: dict[str, list[int]]) -> dict:
    """``fns`` wrapped to append each call's minor page faults (this process, ``getrusage``) to ``faults[name]``."""
    import resource

    def wrap(name, fn):
        def call():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            out = fn()
            faults.setdefault(name, []).append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
            return out

        return call

    return {name: wrap(name, fn) for name, fn in fns.items()}


def _memory(args) -> dict:
    """Peak memory and captured bytes of one full capture, in this (fresh) process."""
    from capture import RssPeak  # benchmarks/capture.py

    device = torch.device(args.device)
    model = models.load(args.model, device=device)
    batch = make_batch(args.batch, args.length, model.tokenizer, device, vocab_size=model.config.vocab_size)
    with torch.inference_mode():
        model(**batch)  # kernels and allocator warmed; the cache below is the only thing held
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            captured = model.run_with_cache(**batch)[1].nbytes()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - before
        else:
            with RssPeak() as rss:
                captured = model.run_with_cache(**batch)[1].nbytes()
            peak = rss.peak
    return {"peak": peak, "captured": captured}


def _profile(fns: dict, repeats: int = 2, top: int = 14) -> None:
    """Print, per operator, the CPU seconds of each configuration (torch.profiler, ``repeats`` calls each) and the
    full capture's extra over the plain forward, largest first: where the captured path loses its time."""
    from torch.profiler import ProfilerActivity, profile

    per: dict[str, dict[str, float]] = {}
    for name, fn in fns.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(repeats):
                fn()
        per[name] = {e.key: e.self_cpu_time_total / 1e6 / repeats for e in prof.key_averages()}
    plain, full = per["plain forward"], per["full capture"]
    total_plain, total_full = sum(plain.values()), sum(full.values())
    print(f"profile (self CPU s per call): plain {total_plain:.3f}, full {total_full:.3f}; by operator:")
    ops = sorted(set(plain) | set(full), key=lambda k: -abs(full.get(k, 0.0) - plain.get(k, 0.0)))
    for op in ops[:top]:
        a, b = plain.get(op, 0.0), full.get(op, 0.0)
        print(f"  {op:<52} plain {a:7.3f}  full {b:7.3f}  extra {b - a:+7.3f}  ({(b - a) / total_full:+6.1%} of full)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint folder or name (default: the bundled model)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--profile", action="store_true", help="also print the per-operator profile of both paths")
    parser.add_argument("--system-allocator", action="store_true",
                        help="leave glibc's malloc at its defaults (no keep_freed_memory): the page faults it costs")
    parser.add_argument("--memory-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    allocator = {} if args.system_allocator else keep_freed_memory()
    if args.memory_worker:
        print(json.dumps(_memory(args)))
        return

    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    model = models.load(args.model, device=device)
    batch = make_batch(args.batch, args.length, model.tokenizer, device, vocab_size=model.config.vocab_size)
    with torch.inference_mode():
        fns = _configs(model, batch)
        wall = time_interleaved(fns, device, args.repeats)
        faults: dict[str, list[int]] = {}
        cpu = None
        if device.type == "cpu":
            cpu = time_interleaved(_counting_faults(fns, faults), device, args.repeats, clock=time.process_time)

    cmd = [sys.executable, __file__, "--memory-worker", "--device", args.device, "--batch", str(args.batch),
           "--length", str(args.length), "--threads", str(args.threads)] + (["--model", args.model] if args.model
                                                                              else [])
    cmd += ["--system-allocator"] if args.system_allocator else []
    mem = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])

    print(f"model: {model.source}  device: {device}  threads: {torch.get_num_threads()}")
    own = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")} if args.system_allocator else {}
    kept = "keep_freed_memory applied" if any(allocator.values()) else "glibc defaults (or not glibc)"
    print(f"allocator: {kept}" + (f", environment {own}" if own else ""))
    print(f"batch {args.batch} x {args.length}, median of {args.repeats} round-robin runs (plain and full interleaved)")
    for name in fns:
        extra = f"  cpu {cpu[name] * 1e3:8.1f} ms" if cpu else ""
        print(f"  {name:<15} wall {wall[name] * 1e3:8.1f} ms{extra}")
    ratio = wall["plain forward"] / wall["full capture"]
    print(f"full capture / plain forward speed (wall) = {ratio:.3f}  (target >= 0.8)")
    if cpu:
        print(f"full capture / plain forward speed (cpu)  = {cpu['plain forward'] / cpu['full capture']:.3f}")
    if faults:
        print("minor page faults per call (median): " + ", ".join(
            f"{name} {statistics.median(counts):.0f}" for name, counts in faults.items()))
    print(f"peak memory {mem['peak'] / 2**20:.1f} MiB for {mem['captured'] / 2**20:.1f} MiB captured: "
          f"{mem['peak'] / mem['captured']:.3f} x  (target <= 1.3)")
    if args.profile:
        with torch.inference_mode():
            _profile(fns)


if __name__ == "__main__":
    main()
