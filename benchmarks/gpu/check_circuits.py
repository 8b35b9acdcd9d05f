"""GPU check for circuits: exact patching, AtP, AtP* (QK fix + GradDrop), atp-qk (QK fix only), EAP-IG,
EAP-IG-activations and ig-act-own for all 144 heads of a random bert-base-shaped model on 256 TFC1 pairs (builtin
corpus), with seconds and forward-equivalents, and the Spearman of each estimate with exact patching
(``--small``: the tiny model, 8 pairs, for a CPU smoke test)."""

from __future__ import annotations

import time

import pandas as pd
import torch
from bertscope.experiments.circuits import measures
from bertscope.experiments.corpus import load_corpus
from bertscope.hooks import circuits
from common import Timer, parser, random_bert, write_result

from bertscope import models


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=256)
    p.add_argument("--steps", type=int, default=5, help="EAP-IG steps")
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args()
    n_pairs = 8 if args.small else args.pairs
    folder = random_bert(small=args.small)
    model = models.load(folder, device=args.device).eval()
    corpus = load_corpus("builtin", max_sentences=4000)
    pairs = measures.tfc1_pairs([s.words for s in corpus], model.tokenizer, max_pairs=n_pairs, max_tokens=32)
    task = circuits.make_task(model, pairs, "cosine")
    with Timer(args.device) as t:
        circuits.metric_values(model, task, "clean", args.batch_size)
    forward = t.seconds
    rows, effects = [], {}
    for method in ("exact", "atp", "atp*", "atp-qk", "eap-ig", "eap-ig-act", "ig-act-own"):
        start = time.perf_counter()
        with Timer(args.device) as t:
            if method == "exact":
                eff, _ = circuits.patching.patch_effects(model, task, "heads", batch_size=args.batch_size)
            else:
                eff, _ = circuits.attribution.attribute_effects(model, task, method, "heads", steps=args.steps,
                                                                batch_size=args.batch_size)
        effects[method] = eff.mean(0)
        rows.append({"method": method, "seconds": round(t.seconds, 3),
                     "forward_equivalents": round(t.seconds / forward, 1),
                     "wall_with_transfers": round(time.perf_counter() - start, 3)})
    exact = pd.Series(effects["exact"])
    for r in rows:  # atp* (GradDrop) is a magnitude: against |exact| (a proxy for the mean over pairs of |effect|)
        ref = exact if circuits.table.node_method(r["method"]).signed else exact.abs()
        r["spearman_vs_exact"] = round(float(pd.Series(effects[r["method"]]).corr(ref, method="spearman")), 4)
        print(r, flush=True)
    peak = torch.cuda.max_memory_allocated() / 2**30 if str(args.device).startswith("cuda") else None
    write_result(args.out, "circuits", {"device": str(args.device), "pairs": task.n_pairs,
                                        "heads": model.config.n_layers * model.config.n_heads,
                                        "forward_seconds": forward, "methods": rows, "peak_gib": peak})


if __name__ == "__main__":
    main()
