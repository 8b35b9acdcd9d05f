"""Cost of activation capture: tokens/s and peak memory per hook selection, beside transformers.

    python benchmarks/capture.py                  # bundled model, batch 16 x 128, CPU
    python benchmarks/capture.py --device cuda

Configurations (ours): no hooks; patterns only; every hook except hook_result; every hook. Reference:
transformers BertModel with sdpa (plain forward), and eager with output_attentions=True and
output_hidden_states=True. Throughput is timed round-robin in one process. Peak memory is measured in a
fresh subprocess per configuration (CPU: peak growth of resident memory during the call, sampled every
millisecond; GPU: peak allocated minus the allocated memory before the call), beside the bytes the
configuration captured.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time

import torch
from benchutils import make_batch, reference_model, time_interleaved

from bertscope import models

CONFIGS = ["ours: no hooks", "ours: patterns only", "ours: all but hook_result", "ours: every hook",
           "transformers sdpa", "transformers eager + attentions + hidden"]


def build(name: str, ours, sdpa, eager, batch):
    """A zero-argument callable running configuration ``name``; returns the bytes it captured."""
    if name == "ours: no hooks":
        return lambda: (ours(**batch), 0)[1]
    if name == "ours: patterns only":
        return lambda: ours.run_with_cache(**batch, names_filter="blocks.*.attn.hook_pattern")[1].nbytes()
    if name == "ours: all but hook_result":
        return lambda: ours.run_with_cache(**batch, names_filter=lambda n: not n.endswith("hook_result"))[1].nbytes()
    if name == "ours: every hook":
        return lambda: ours.run_with_cache(**batch)[1].nbytes()
    if name == "transformers sdpa":
        return lambda: (sdpa(**batch), 0)[1]
    if name == "transformers eager + attentions + hidden":

        def run():
            out = eager(**batch, output_attentions=True, output_hidden_states=True)
            return sum(t.numel() * t.element_size() for t in (*out.attentions, *out.hidden_states))

        return run
    raise KeyError(name)


def load_all(args, device):
    ours = models.load(args.model, device=device)
    folder = str(models.loading.resolve_source(args.model))
    return ours, reference_model(folder, "sdpa", device), reference_model(folder, "eager", device)


class RssPeak:
    """Peak growth of this process's resident memory during a block, sampled every millisecond."""

    def __enter__(self) -> RssPeak:
        self.before = self.peak_abs = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_abs = max(self.peak_abs, _rss())
            time.sleep(0.001)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_abs = max(self.peak_abs, _rss())
        self.peak = self.peak_abs - self.before


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def memory_worker(args) -> None:
    device = torch.device(args.device)
    ours, sdpa, eager = load_all(args, device)
    batch = make_batch(args.batch, args.length, ours.tokenizer, device)
    fn = build(args.only, ours, sdpa, eager, batch)
    with torch.inference_mode():
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            captured = fn()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - before
        else:
            with RssPeak() as rss:
                captured = fn()
            peak = rss.peak
    print(json.dumps({"peak": peak, "captured": captured}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--only", default="all", help=argparse.SUPPRESS)  # subprocess worker
    args = parser.parse_args()
    if args.only != "all":
        memory_worker(args)
        return

    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    ours, sdpa, eager = load_all(args, device)
    batch = make_batch(args.batch, args.length, ours.tokenizer, device)
    with torch.inference_mode():
        seconds = time_interleaved({n: build(n, ours, sdpa, eager, batch) for n in CONFIGS}, device, args.repeats)

    memory = {}
    for name in CONFIGS:
        cmd = [sys.executable, __file__, "--only", name, "--device", args.device, "--batch", str(args.batch),
               "--length", str(args.length)] + (["--model", args.model] if args.model else [])
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        memory[name] = json.loads(out)

    tokens = args.batch * args.length
    print(f"model: {ours.source}  device: {device}  threads: {torch.get_num_threads()}")
    print(f"batch {args.batch} x {args.length}, median of {args.repeats} round-robin runs")
    head = f"{'configuration':<42}{'ms':>9}{'tokens/s':>10}{'vs no hooks':>13}{'peak MiB':>10}{'captured MiB':>14}"
    print(head)
    base = seconds["ours: no hooks"]
    for name in CONFIGS:
        s, mem = seconds[name], memory[name]
        print(f"{name:<42}{s * 1e3:>9.1f}{tokens / s:>10.0f}{base / s:>13.2f}"
              f"{mem['peak'] / 2**20:>10.1f}{mem['captured'] / 2**20:>14.1f}")
    print("targets:")
    print(f"  no hooks / transformers sdpa = {seconds['transformers sdpa'] / base:.3f} (>= 0.95)")
    ref = seconds["transformers eager + attentions + hidden"]
    print(f"  patterns only / transformers eager with attentions = {ref / seconds['ours: patterns only']:.3f} (>= 0.9)")
    print(f"  every hook / no hooks = {base / seconds['ours: every hook']:.3f} (>= 0.5)")


if __name__ == "__main__":
    main()
