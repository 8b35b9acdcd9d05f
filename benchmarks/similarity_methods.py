"""Every pairwise method on STS-B dev pairs: completeness (|error| / |score|) and time per pair (issue 41).

    python benchmarks/similarity_methods.py [--pairs 200] [--docs docs/similarity.md]

Integrated Jacobians run at their defaults (50 steps, Simpson's rule, xsbert's depth) and again at block 0's input,
with the trapezoid rule and with xsbert's right Riemann sum. Times are wall-clock seconds per pair on the threads
given, printed beside the machine's load average. ``--methods`` chooses the methods (default: the similarity
experiment's); ``all`` runs every name of ``bertscope.similarity.TABLE``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from similarity_stsb import DEV, read_pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--docs", type=Path, default=None)
    parser.add_argument("--methods", default="experiment", help="comma-separated names, 'experiment' or 'all'")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import bertscope
    from bertscope import similarity as S

    a, b, _ = read_pairs(DEV, args.pairs)
    model = bertscope.load().eval()
    from bertscope.experiments.similarity.experiment import DEFAULT_METHODS

    names = {"all": list(S.TABLE), "experiment": list(DEFAULT_METHODS)}.get(args.methods)
    names = names or [m.strip() for m in args.methods.split(",") if m.strip()]
    runs = [(m, {}) for m in names] + [("integrated-jacobians", o) for o in (
        {"layer": 0}, {"rule": "trapezoid"}, {"rule": "xsbert"})]
    stats: dict[str, tuple[list[float], list[float]]] = {}
    load = [os.getloadavg()[0]]
    for i in range(len(a)):
        for method, opts in runs:
            label = method + (" (" + ", ".join(f"{k}={v}" for k, v in opts.items()) + ")" if opts else "")
            t = time.perf_counter()
            r = S.attribute(model, a[i], b[i], method=method, **opts)
            times, errs = stats.setdefault(label, ([], []))
            times.append(time.perf_counter() - t)
            errs.append(abs(r.error) / max(abs(r.score), 1e-12))
        load.append(os.getloadavg()[0])
    lines = [f"{len(a)} STS-B dev pairs (the first), {args.threads} threads, load average "
             f"{min(load):.1f} to {max(load):.1f}", "",
             "| method | exact | median s / pair | median abs(error) / abs(score) | max abs(error) / abs(score) | "
             "pairs with abs(error) <= 1e-3 abs(score) |", "|---|---|---|---|---|---|"]  # fmt: skip
    for label, (times, errs) in stats.items():
        exact = S.TABLE[label.split(" ")[0]].exact
        within = sum(e <= 1e-3 for e in errs)
        lines.append(f"| {label} | {exact} | {statistics.median(times):.2f} | {statistics.median(errs):.1e} | "
                     f"{max(errs):.1e} | {within} of {len(errs)} |")  # fmt: skip
    text = "\n".join(lines)
    print(text)
    if args.docs:
        from benchutils import write_docs

        write_docs(args.docs, text, "methods")


if __name__ == "__main__":
    main()
