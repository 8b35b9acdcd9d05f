"""CPU time of positions' activation collection: through the activations stage from the forward, and from a
capture made by `bertscope capture --for positions` (the bundled model, the builtin corpus, the run's plan).

    python benchmarks/positions_activations.py [--max-windows 128] [--tune-windows 48] [--repeats 2]
        [--old-commit 7184608]

Times every sequence set of the plan (`positions.windows.Plan.datasets`) collected with `positions.data.collect`
(process CPU time, one torch thread), from the forward and from the capture; with ``--old-commit``, also the
forward loop positions had before it went through the stage (its ``positions/data.py`` at that commit, read
with ``git show``), and checks all three give the same arrays bit for bit. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-windows", type=int, default=128)
    p.add_argument("--tune-windows", type=int, default=48)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--old-commit", default=None, help="time positions' forward loop of this commit beside")
    args = p.parse_args()

    from bertscope.experiments import positions
    from bertscope.experiments.activations import CaptureSource
    from bertscope.experiments.corpus import load_corpus
    from bertscope.experiments.options import Inputs, RunOptions, corpus_summary, model_summary
    from bertscope.experiments.positions.data import collect
    from bertscope.experiments.positions.windows import capture_positions, plan_inputs

    from bertscope import models

    torch.set_num_threads(1)
    model, corpus = models.load().eval(), load_corpus("builtin")
    settings = dataclasses.replace(positions.Settings(), max_windows=args.max_windows, tune_windows=args.tune_windows)
    plan = plan_inputs(model, corpus, settings, seed=0, max_sentences=None, max_length=128)
    sets = plan.datasets()
    ways = {"stage_forward": lambda s, n, at, h: collect(model, s, at, batch_size=32, fwd_hooks=h, name=n,
                                                           max_length=128)}  # fmt: skip
    if args.old_commit:
        ways["old_loop"] = _old_collect(args.old_commit)
    with tempfile.TemporaryDirectory() as tmp:
        options = RunOptions(out=Path(tmp) / "cap", quiet=True)
        inputs = Inputs(model, corpus, torch.device("cpu"), torch.float32, model_summary(model), corpus_summary(corpus))
        t = time.process_time()
        index = capture_positions(inputs, options, settings)
        capture_cpu = time.process_time() - t
        source = CaptureSource(options.out, model)
        ways["stage_capture"] = lambda s, n, at, h: collect(model, s, at, batch_size=32, capture=source, name=n,
                                                            max_length=128)  # fmt: skip
        seconds: dict[str, list[float]] = {k: [] for k in ways}
        arrays: dict[str, list] = {}
        for _ in range(args.repeats):
            for way, fn in ways.items():
                t = time.process_time()
                out = [fn(seqs, name, at, hooks) for name, seqs, at, hooks in sets]
                seconds[way].append(round(time.process_time() - t, 2))
                arrays[way] = [a.to_arrays() for a in out]
        equal = all(np.array_equal(a[k], b[k]) for way in ways for a, b in zip(arrays[way], arrays["stage_forward"],
                    strict=True) for k in a)  # fmt: skip
        print(json.dumps({"cpu_seconds": seconds, "capture_cpu_seconds": round(capture_cpu, 2),
                          "capture_bytes": sum(s["bytes"] for s in index["shards"]), "equal_arrays": equal,
                          "n_sequences": sum(len(s) for _, s, _, _ in sets), "plan": plan.describe()}))  # fmt: skip


def _old_collect(commit: str):
    """``collect`` of positions/data.py at ``commit`` (its own forward loop), loaded from ``git show``."""
    root = Path(__file__).resolve().parent.parent
    text = subprocess.run(["git", "show", f"{commit}:experiments/positions/data.py"], cwd=root, check=True,
                          capture_output=True, text=True).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "old_positions_data.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("old_positions_data", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_positions_data"] = module
    spec.loader.exec_module(module)
    return lambda s, n, at, h: module.collect(_model(), s, at, batch_size=32, fwd_hooks=h)


def _model():
    from bertscope import models

    if not hasattr(_model, "m"):
        _model.m = models.load().eval()
    return _model.m


if __name__ == "__main__":
    main()
