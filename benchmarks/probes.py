"""Benchmark: fitting a many-class linear probe with each backend, and one `probes.evaluate` call.

    python benchmarks/probes.py --threads 2 --rounds 2  # 128-class probe, 100k x 384, sklearn and torch, A/B
    python benchmarks/probes.py --device cuda         # torch backend on a GPU (sklearn stays on CPU)
    python benchmarks/probes.py --mode evaluate --n 30000 --folds 5 --alpha 10

The data are planted: class means in a random 384-d space plus unit Gaussian noise, scaled so that a linear
probe reaches a moderate (not perfect) accuracy, which keeps the optimiser honest. `fit` mode reports wall
time, process CPU time (less sensitive to other load on a shared machine), iterations and held-out accuracy
per backend, and the largest difference between the backends' held-out class probabilities. With
`--rounds R` the backends are fit R times each, alternating (the order rotates every round, so load that
other processes put on a shared machine hits both alike); one row per fit, then a `ratio` summary of the
median times (sklearn / torch).

Alpha is on the MEAN loss (`LinearProbe`); the default 1 / n_train is scikit-learn's C = 1 (its default). `evaluate`
mode times one grouped-CV `evaluate` call (sentence-like groups, ordinal position-like labels, control task
and selectivity rows, 1000 bootstrap resamples).
"""

from __future__ import annotations

import argparse
import platform
import time
import warnings

import numpy as np
import pandas as pd
import threadpoolctl
import torch

from bertscope import probes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["fit", "evaluate"], default="fit")
    p.add_argument("--n", type=int, default=100_000, help="rows")
    p.add_argument("--d", type=int, default=384, help="features")
    p.add_argument("--classes", type=int, default=128)
    p.add_argument("--backends", nargs="+", default=["sklearn", "torch"], choices=["sklearn", "torch"])
    p.add_argument("--device", default="cpu", help="torch device for the torch backend (cpu, cuda, cuda:1)")
    p.add_argument("--alpha", type=float, default=None, help="L2 on the mean loss (default 1/n_train: C = 1)")
    p.add_argument("--rounds", type=int, default=1, help="fit mode: fits per backend, alternating")
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--max-iter", type=int, default=1000)
    p.add_argument("--folds", type=int, default=5, help="evaluate mode: outer folds")
    p.add_argument("--n-boot", type=int, default=1000, help="evaluate mode: bootstrap resamples")
    p.add_argument("--no-control", action="store_true", help="evaluate mode: skip the control task")
    p.add_argument("--threads", type=int, default=None,
                   help="limit torch, BLAS and OpenMP threads (default: the libraries' own)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="also write the table to this CSV path")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        threadpoolctl.threadpool_limits(limits=args.threads)  # numpy BLAS and scikit-learn's OpenMP loops
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, device {args.device}")  # fmt: skip
    table = run_fit(args) if args.mode == "fit" else run_evaluate(args)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(index=False))
    if args.out:
        table.to_csv(args.out, index=False)


def run_fit(args: argparse.Namespace) -> pd.DataFrame:
    X, y = planted(args.n, args.d, args.classes, args.seed)
    n_train = int(0.9 * len(X))
    alpha = args.alpha if args.alpha is not None else 1.0 / n_train
    rows, proba = [], {}
    backends = list(args.backends)
    for r in range(args.rounds):
        for backend in backends[r % len(backends) :] + backends[: r % len(backends)]:
            device = args.device if backend == "torch" else None
            probe = probes.LinearProbe(alpha=alpha, backend=backend, device=device, max_iter=args.max_iter,
                                       tol=args.tol)  # fmt: skip
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                start, cpu_start = time.perf_counter(), time.process_time()
                probe.fit(X[:n_train], y[:n_train])
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
            proba[backend] = probe.predict_proba(X[n_train:])
            rows.append({
                "round": r, "backend": backend,
                "device": args.device if backend == "torch" else "cpu",
                "n_train": n_train, "d": args.d, "classes": args.classes, "alpha": f"{alpha:.3g}",
                "sklearn_C": f"{1 / (alpha * n_train):.3g}", "tol": args.tol,
                "fit_seconds": round(seconds, 2),
                "cpu_seconds": round(cpu_seconds, 2),
                "iterations": probe.n_iter_,
                "converged": probe.converged_ and not caught,
                "heldout_accuracy": round(probe.score(X[n_train:], y[n_train:]), 4),
            })  # fmt: skip
            print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    if len(proba) == 2:
        diff = np.abs(proba["sklearn"] - proba["torch"])
        table["proba_diff_max"] = round(float(diff.max()), 4)
        agree = np.argmax(proba["sklearn"], axis=1) == np.argmax(proba["torch"], axis=1)
        table["same_prediction"] = round(float(agree.mean()), 4)
        med = table.groupby("backend")[["fit_seconds", "cpu_seconds"]].median()
        acc = table.groupby("backend").heldout_accuracy.first()
        print(f"# ratio sklearn/torch (median over {args.rounds} round(s)): wall "
              f"{med.fit_seconds['sklearn'] / med.fit_seconds['torch']:.2f}x, process CPU "
              f"{med.cpu_seconds['sklearn'] / med.cpu_seconds['torch']:.2f}x; held-out accuracy sklearn "
              f"{acc['sklearn']:.4f}, torch {acc['torch']:.4f}")  # fmt: skip
    return table


def run_evaluate(args: argparse.Namespace) -> pd.DataFrame:
    rng = np.random.default_rng(args.seed)
    lengths = rng.integers(8, args.classes + 1, size=args.n)  # sentences until n tokens
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), args.n)) + 1]
    groups = np.repeat(np.arange(len(lengths)), lengths)[: args.n]
    position = np.concatenate([np.arange(k) for k in lengths])[: args.n]
    X, _ = planted(args.n, args.d, args.classes, args.seed, labels=position)
    word_types = rng.zipf(1.3, size=args.n) % 5000
    rows = []
    for backend in args.backends:
        device = args.device if backend == "torch" else None
        control = None if args.no_control else probes.control_labels(word_types, position)
        start, cpu_start = time.perf_counter(), time.process_time()
        alpha = args.alpha if args.alpha is not None else 1e-4
        table = probes.evaluate(X, position, groups, task="classification", alphas=alpha, n_folds=args.folds,
                                backend=backend, device=device, n_boot=args.n_boot, within_k=2, control=control,
                                max_iter=args.max_iter, tol=args.tol)  # fmt: skip
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        acc = table[(table.metric == "accuracy")].set_index("labels").value
        rows.append({
            "backend": backend, "rows": args.n, "groups": int(groups.max()) + 1, "d": args.d,
            "classes": int(position.max()) + 1, "folds": args.folds, "alpha": alpha, "tol": args.tol,
            "n_boot": args.n_boot, "evaluate_seconds": round(seconds, 2), "cpu_seconds": round(cpu_seconds, 2),
            "task_accuracy": round(acc["task"], 4), "control_accuracy": round(acc.get("control", np.nan), 4),
        })  # fmt: skip
    return pd.DataFrame(rows)


def planted(n: int, d: int, n_classes: int, seed: int, labels: np.ndarray | None = None):
    """Features [n, d] float32 = 0.2 * class mean + N(0, 1) noise; labels [n] (drawn if not given)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, size=n) if labels is None else labels
    means = rng.normal(size=(n_classes, d)).astype(np.float32)
    X = 0.2 * means[y] + rng.normal(size=(n, d)).astype(np.float32)
    return X.astype(np.float32), y


if __name__ == "__main__":
    main()
