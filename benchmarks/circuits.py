"""Circuits targets: TFC1 over the UD English EWT dev sentences on the bundled model.

Prints the Spearman of AtP, AtP* and EAP-IG head scores with exact patching over the 72 heads, the found
circuit's faithfulness against random circuits of its size, CPR/CMD against random edge orders, and the cost of
each method in forward-equivalents (its wall time / one clean forward over the same pairs, same machine, same
run). ``--bert-base`` also times the head-score methods on a random bert-base-shaped model (12 x 12 heads).

    nice python benchmarks/circuits.py --pairs 48 [--bert-base]

Needs ../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu (from a worktree: /work/shared/...).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from benchutils import ewt_dev_path, tfc1_task


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=48)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--ewt", type=Path, default=ewt_dev_path())
    p.add_argument("--candidates", type=int, default=30)
    p.add_argument("--n-random", type=int, default=5)
    p.add_argument("--random-circuits", type=int, default=20)
    p.add_argument("--bert-base", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from bertscope.experiments.circuits import experiment, measures


    model, task = tfc1_task(args.ewt, args.pairs)
    settings = measures.AnalysisSettings(ig_steps=args.steps, candidates=args.candidates, n_random=args.n_random,
                                         n_random_circuits=args.random_circuits,
                                         batch_size=16, n_boot=200)
    start = time.perf_counter()
    tables = measures.analyse(model, task, settings, positions=measures.injected_positions(task),
                              progress=lambda m: print(f"  {m} ({time.perf_counter() - start:.0f} s)", flush=True))
    agree = experiment.agreement(tables["heads"])
    out = {"pairs": task.n_pairs, "corpus": str(args.ewt), "agreement": agree.to_dict("records"),
           "cost": tables["cost"].to_dict("records"), "areas": tables["areas"].to_dict("records")}
    c = tables["circuit"]
    out["circuit"] = {"edges": len(c), "faithfulness": float(c.faithfulness.iloc[0]) if len(c) else None,
                      "random_faithfulness_max": float(tables["random_circuits"].faithfulness.max()),
                      "random_faithfulness_mean": float(tables["random_circuits"].faithfulness.mean())}
    resid = tables["resid"]
    out["resid_final_share"] = float(resid[resid.layer == resid.layer.max()].normalised.iloc[0])
    print(agree.to_string(index=False))
    print(tables["cost"].to_string(index=False))
    print(tables["areas"].to_string(index=False))
    print(json.dumps(out["circuit"]), "resid final share", out["resid_final_share"])
    if args.bert_base:
        out["bert_base"] = bert_base_cost(task, args.steps)
        print(json.dumps(out["bert_base"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=float))


def bert_base_cost(task, steps: int) -> list[dict]:
    """Forward-equivalents of exact patching, AtP, AtP*, EAP-IG and EAP-IG-activations for the 144 heads of a
    random bert-base-shaped model (same token ids as the task)."""
    from bertscope.hooks import circuits
    from bertscope.hooks.circuits.tasks import Task, mean_pool
    from bertscope.models import Encoder, EncoderConfig

    torch.manual_seed(0)
    model = Encoder(EncoderConfig(hidden_dropout=0.0, attention_dropout=0.0)).eval()
    u = torch.randn(model.config.d_model)
    metric = circuits.Metric(lambda h, m, rows: mean_pool(h, m) @ u, "dot-random")
    big = Task(task.clean, task.corrupted, metric)
    circuits.metric_values(model, big, "clean", 16)  # warm-up: the unit is not a first call
    start = time.perf_counter()
    circuits.metric_values(model, big, "clean", 16)
    fwd = time.perf_counter() - start
    rows = []
    for method in ("exact", "atp", "atp*", "eap-ig", "eap-ig-act"):
        start = time.perf_counter()
        if method == "exact":
            circuits.patching.patch_effects(model, big, "heads", batch_size=16)
        else:
            circuits.attribution.attribute_effects(model, big, method, "heads", steps=steps, batch_size=16)
        secs = time.perf_counter() - start
        rows.append({"method": method, "seconds": secs, "forward_equivalents": secs / fwd})
    return rows


if __name__ == "__main__":
    main()
