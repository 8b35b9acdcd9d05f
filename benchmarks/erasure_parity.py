"""Parity of `bertscope.probes.erasure` LEACE with EleutherAI's `concept-erasure` (`LeaceFitter`), and timing.

concept-erasure is not a bertscope dependency: install it in a throwaway venv and point this script at it

    python3 -m venv /tmp/ce && /tmp/ce/bin/pip install torch==2.13.0 && /tmp/ce/bin/pip install concept-erasure
    .venv/bin/python benchmarks/erasure_parity.py --peer-python /tmp/ce/bin/python

The same float64 data (saved with torch.save) go to both implementations; for every case the script prints the
largest absolute difference of the projection matrix P, of the bias, and of the erased vectors, and the fit
time of each. Cases: binary / multiclass one-hot / continuous concepts, with and without shrinkage, the
orthogonal method, a streamed fit (10 batches), no bias, and few samples in many dimensions. (The
`constrain_cov_trace` branch is not reached by any of them: with the covariance the whitening came from,
P Σ P^T = Σ^{1/2}(I - u u^T)Σ^{1/2} never has a larger trace.) Without --peer-python the peer runs in this
python (concept-erasure must then be importable here).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

PEER = r'''
import json, sys, time, torch
from concept_erasure import LeaceFitter
cases = torch.load(sys.argv[1])
out = {}
for name, case in cases.items():
    x, z, kw = case["x"], case["z"], case["kwargs"]
    t0 = time.perf_counter()
    fitter = LeaceFitter(x.shape[1], z.shape[1], dtype=torch.float64, **kw)
    for xb, zb in zip(x.chunk(case["batches"]), z.chunk(case["batches"])):
        fitter.update(xb, zb)
    eraser = fitter.eraser
    P = eraser.P
    seconds = time.perf_counter() - t0
    out[name] = {"P": P, "bias": eraser.bias, "erased": eraser(x), "seconds": seconds}
torch.save(out, sys.argv[2])
'''


def make_cases(seed: int = 0) -> dict:
    """Synthetic float64 data with planted linear concepts (n=2000, d=32)."""
    g = torch.Generator().manual_seed(seed)
    n, d = 2000, 32
    mix = torch.randn(d, d, generator=g, dtype=torch.float64)
    x = torch.randn(n, d, generator=g, dtype=torch.float64) @ mix  # correlated features
    labels = torch.randint(0, 5, (n,), generator=g)
    onehot = torch.nn.functional.one_hot(labels, 5).to(torch.float64)
    x_multi = x + onehot @ torch.randn(5, d, generator=g, dtype=torch.float64) * 3
    binary = (labels % 2).to(torch.float64)[:, None]
    x_bin = x + binary * torch.randn(d, generator=g, dtype=torch.float64) * 2
    cont = torch.randn(n, 1, generator=g, dtype=torch.float64)
    x_cont = x + cont * torch.randn(d, generator=g, dtype=torch.float64)
    # few samples (60) in 32 anisotropic dimensions: shrinkage matters most
    small_x = torch.randn(60, d, generator=g, dtype=torch.float64) * torch.linspace(0.1, 10, d, dtype=torch.float64)
    small_z = torch.nn.functional.one_hot(torch.randint(0, 3, (60,), generator=g), 3).to(torch.float64)
    small_x = small_x + small_z @ torch.randn(3, d, generator=g, dtype=torch.float64) * 5
    plain = {"shrinkage": False, "constrain_cov_trace": False}
    return {
        "binary": {"x": x_bin, "z": binary, "kwargs": {}, "batches": 1},
        "binary_plain": {"x": x_bin, "z": binary, "kwargs": plain, "batches": 1},
        "multiclass": {"x": x_multi, "z": onehot, "kwargs": {}, "batches": 1},
        "multiclass_plain": {"x": x_multi, "z": onehot, "kwargs": plain, "batches": 1},
        "continuous": {"x": x_cont, "z": cont, "kwargs": {}, "batches": 1},
        "orth": {"x": x_multi, "z": onehot, "kwargs": {"method": "orth"}, "batches": 1},
        "streamed_10_batches": {"x": x_multi, "z": onehot, "kwargs": {}, "batches": 10},
        "no_affine": {"x": x_multi, "z": onehot, "kwargs": {"affine": False}, "batches": 1},
        "few_samples": {"x": small_x, "z": small_z, "kwargs": {}, "batches": 1},
    }


def ours(cases: dict) -> dict:
    """Fit every case with bertscope's LeaceFitter."""
    from bertscope.probes.erasure import LeaceFitter

    out = {}
    for name, case in cases.items():
        x, z = case["x"], case["z"]
        t0 = time.perf_counter()
        fitter = LeaceFitter(x.shape[1], z.shape[1], dtype=torch.float64, **case["kwargs"])
        for xb, zb in zip(x.chunk(case["batches"]), z.chunk(case["batches"]), strict=True):
            fitter.update(xb, zb)
        eraser = fitter.eraser
        P = eraser.P
        out[name] = {"P": P, "bias": eraser.bias, "erased": eraser(x), "seconds": time.perf_counter() - t0}
    return out


def run_peer(cases: dict, python: str | None) -> dict:
    """Fit every case with concept-erasure, in `python` (another venv) or in-process."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst, script = Path(tmp, "cases.pt"), Path(tmp, "peer.pt"), Path(tmp, "peer.py")
        torch.save(cases, src)
        script.write_text(PEER)
        subprocess.run([python or sys.executable, str(script), str(src), str(dst)], check=True)
        return torch.load(dst)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-python", help="python of a venv with concept-erasure installed")
    parser.add_argument("--json", help="also write the table here")
    args = parser.parse_args()
    cases = make_cases()
    mine, peer = ours(cases), run_peer(cases, args.peer_python)
    rows = []
    print(f"{'case':22s} {'max|dP|':>10s} {'max|dbias|':>11s} {'max|d erased|':>14s} {'ours s':>8s} {'peer s':>8s}")
    for name in cases:
        a, b = mine[name], peer[name]
        dp = float((a["P"] - b["P"]).abs().max())
        db = 0.0 if a["bias"] is None else float((a["bias"] - b["bias"]).abs().max())
        de = float((a["erased"] - b["erased"]).abs().max())
        rows.append({"case": name, "max_abs_dP": dp, "max_abs_dbias": db, "max_abs_derased": de,
                     "ours_s": a["seconds"], "peer_s": b["seconds"]})
        print(f"{name:22s} {dp:10.2e} {db:11.2e} {de:14.2e} {a['seconds']:8.4f} {b['seconds']:8.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
