"""GPU check for bertscope.similarity (issue 41): the STS-B dev ``benchmark`` computation (every block's
``hook_resid_post`` x mean / cls / max pooling over 1,500 pairs, one ``embed`` call) and integrated Jacobians
(50 steps, block 0's input) over up to 1,000 dev pairs, on a random bert-base-shaped model, with seconds
(``--small``: the tiny model and 40 pairs, for a CPU smoke test).

The bundled weights do not travel to a lent machine, so the Spearman printed is a random model's (a sanity value,
not the anchor). Integrated Jacobians stop at ``--budget`` seconds (the check's slot in gpu.sh is 80 s): the JSON
says how many pairs ran, their rate, and the time 1,000 pairs take at that rate. STS-B dev is read from
``.gpu/stsb-en/`` (``gpu_pack.sh`` copies it) or ``../shared/data/stsb-en/``; without it the check says so and
writes ``skipped``."""

from __future__ import annotations

import csv
import statistics
import time
from pathlib import Path

import torch
from common import Timer, parser, random_bert, write_result
from scipy.stats import spearmanr

from bertscope import models, similarity

ROOT = Path(__file__).resolve().parents[2]
PLACES = (ROOT / ".gpu" / "stsb-en" / "stsb-en-dev.csv",
          ROOT.parent / "shared" / "data" / "stsb-en" / "stsb-en-dev.csv")


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=1500, help="pairs of the benchmark computation")
    p.add_argument("--ij-pairs", type=int, default=1000, help="most pairs for integrated Jacobians")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--budget", type=float, default=40.0, help="seconds for integrated Jacobians")
    args = p.parse_args()
    path = next((f for f in PLACES if f.is_file()), None)
    if path is None:
        why = f"STS-B dev not found ({', '.join(map(str, PLACES))}): run benchmarks/gpu_pack.sh first"
        print(why)
        write_result(args.out, "similarity", {"skipped": why})
        return
    with open(path, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.reader(f) if r][: 40 if args.small else args.pairs]
    a, b, gold = [r[0] for r in rows], [r[1] for r in rows], [float(r[2]) for r in rows]
    model = models.load(random_bert(small=args.small), device=args.device).eval()
    sites = [f"blocks.{L}.hook_resid_post" for L in range(model.config.n_layers)]
    similarity.embed(model, a[:64], pooling=similarity.POOLINGS, sites=sites)  # warm-up
    with Timer(args.device) as t:
        embs = similarity.embed(model, a + b, pooling=similarity.POOLINGS, sites=sites)
    own = embs[(similarity.final_site(model), "mean")]
    rho = float(spearmanr(similarity.score(own[: len(a)], own[len(a):]).numpy(), gold).statistic)
    bench = {"pairs": len(a), "rows": len(embs), "seconds": round(t.seconds, 3), "spearman_random_model": rho}
    print({"benchmark": bench}, flush=True)

    similarity.attribute(model, a[0], b[0], steps=2)  # warm-up
    times, errors = [], []
    start = time.perf_counter()
    for i in range(min(args.ij_pairs, len(a))):
        with Timer(args.device) as t:
            r = similarity.attribute(model, a[i], b[i], steps=args.steps)
        times.append(t.seconds)
        errors.append(abs(r.error) / max(abs(r.score), 1e-12))
        if time.perf_counter() - start > args.budget:
            break
    ij = {"pairs": len(times), "steps": args.steps, "seconds": round(sum(times), 3),
          "pairs_per_second": round(len(times) / sum(times), 3),
          "seconds_for_1000_pairs_at_this_rate": round(1000 * sum(times) / len(times), 1),
          "median_seconds_per_pair": round(statistics.median(times), 4),
          "max_error_over_score": max(errors)}  # fmt: skip
    print({"integrated_jacobians": ij}, flush=True)
    peak = torch.cuda.max_memory_allocated() / 2**30 if str(args.device).startswith("cuda") else None
    write_result(args.out, "similarity", {"device": str(args.device), "model": f"{model.config.n_layers} x "
                                          f"{model.config.d_model} random", "benchmark": bench,
                                          "integrated_jacobians": ij, "peak_gib": peak})  # fmt: skip


if __name__ == "__main__":
    main()
