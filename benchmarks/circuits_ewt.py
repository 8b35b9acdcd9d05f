"""Circuits targets of issue 40.13 on the TFC1 pairs of UD English EWT dev, with intervals: head-level AtP and
EAP-IG-activations against exact head patching, and per-node AtP* (queries, keys, values) against exact patching
of the same node kind; Spearman beside Kramár et al.'s own measures (top-k recall, E|effect|).

Pairs: every TFC1 pair EWT dev gives, as the circuits experiment's reader builds them (``measures.tfc1_pairs``:
one pair per sentence, at most ``--max-tokens`` word pieces), visited in a seeded random order in shards of
``--shard`` pairs; every method runs on every shard, and the script stops starting shards once ``--minutes`` of
wall time have passed, so the numbers are on all pairs when time allows and otherwise on a seeded random sample of
them (the output says how many). Per shard and method: per-pair scores (the same pairs for every method).

Measures (``experiments.circuits.measures.agreement_measures``, the experiment's agreement table's): Spearman of
the mean scores over nodes with exact patching's, top-k recall (k = 5, 10, 20) and E|effect|, each with a 95%
percentile bootstrap interval over pairs (pairs resampled, every mean recomputed: pair-sampling variance only).
AtP* (GradDrop) is a magnitude and is compared with the mean over pairs of |exact effect|; the signed methods
with the mean effect. Target: Spearman >= 0.9, "met" when the whole interval is at or above it.

    nice -n 15 python benchmarks/circuits_ewt.py --minutes 25 --docs docs/experiments/circuits.md

Needs ../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu (from a worktree: /work/shared/...).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from benchutils import ewt_dev_path, tfc1_task, write_docs
from circuits import subset
from circuits_ig_steps import to_markdown

BLOCK = "circuits-targets"
KINDS = ("queries", "keys", "values")
#: (what, node kind, method, reference node kind, target?) in the order of the table
ROWS = [("heads", "atp", True), ("heads", "eap-ig-act", True), ("heads", "atp*", False),
        ("heads", "atp-qk", False), *[(k, m, m == "atp*") for k in KINDS for m in ("atp*", "atp-qk", "atp")]]


def scores(model, task, kind: str, method: str, act_steps: int) -> np.ndarray:
    """``[n_pairs, n_nodes]`` per-pair scores of ``method`` on the node ``kind`` ("exact" = exact patching)."""
    from bertscope.hooks import circuits

    if method == "exact":
        return circuits.patching.patch_effects(model, task, kind, batch_size=16)[0]
    return circuits.attribution.attribute_effects(model, task, method, kind, steps=act_steps, batch_size=16)[0]


def measure(per_pair: dict, n_boot: int) -> pd.DataFrame:
    """A row per entry of :data:`ROWS` from the per-pair arrays ``{(kind, method): [n_pairs, n_nodes]}``."""
    from bertscope.experiments.circuits.measures import agreement_measures
    from bertscope.hooks.circuits import table

    rows = []
    for kind, method, target in ROWS:
        est, exact = per_pair[(kind, method)], per_pair[(kind, "exact")]
        signed = table.node_method(method).signed
        m = agreement_measures(est, exact, signed=signed, n_boot=n_boot)
        rows.append({"nodes": kind, "method": method, "reference": f"exact {kind}" + ("" if signed else " |.|"),
                     "target": target, "pairs": est.shape[0], **m})
    return pd.DataFrame(rows)


def small_numbers(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with the E|effect| columns as 3 significant digits (effects of single heads are about 1e-3)."""
    out = df.copy()
    for col in [c for c in out if c.startswith("mean_abs")]:
        out[col] = [f"{v:.3g}" for v in out[col]]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ewt", type=Path, default=ewt_dev_path())
    p.add_argument("--max-tokens", type=int, default=32, help="clean documents of at most this many word pieces")
    p.add_argument("--act-steps", type=int, default=3, help="EAP-IG-activations steps (the experiment's default: 3)")
    p.add_argument("--shard", type=int, default=64, help="pairs per shard")
    p.add_argument("--minutes", type=float, default=25.0, help="start no shard after this much wall time")
    p.add_argument("--n-boot", type=int, default=1000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    p.add_argument("--docs", type=Path, default=None, help="rewrite the generated block of this markdown file")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    start = time.time()
    shown = [a for i, a in enumerate(sys.argv[1:]) if a not in ("--json", "--docs")
             and sys.argv[i] not in ("--json", "--docs")]
    command = "nice -n 15 python benchmarks/circuits_ewt.py " + " ".join(shown)

    def progress(msg: str) -> None:
        print(f"[{time.time() - start:6.0f} s] {msg}", flush=True)

    model, task = tfc1_task(args.ewt, 10**9, max_tokens=args.max_tokens)
    order = np.random.default_rng(args.seed).permutation(task.n_pairs)
    progress(f"{task.n_pairs} TFC1 pairs from EWT dev; shards of {args.shard}, at most {args.minutes} min")
    methods = [("heads", m) for m in ("exact", "atp", "atp*", "atp-qk", "eap-ig-act")] + [
        (k, m) for k in KINDS for m in ("exact", "atp", "atp-qk", "atp*")]
    parts: dict = {key: [] for key in methods}
    cpu = dict.fromkeys(methods, 0.0)
    done = 0
    while done < task.n_pairs and (done == 0 or time.time() - start < 60 * args.minutes):
        rows = np.sort(order[done:done + args.shard])
        shard = subset(task, rows)
        for kind, method in methods:
            t0 = time.process_time()
            parts[(kind, method)].append(scores(model, shard, kind, method, args.act_steps))
            cpu[(kind, method)] += time.process_time() - t0
        done += len(rows)
        progress(f"{done} pairs done")
    per_pair = {key: np.concatenate(v) for key, v in parts.items()}
    table = measure(per_pair, args.n_boot)
    table["cpu_seconds"] = [cpu[(k, m)] for k, m, _ in ROWS]
    wall = time.time() - start
    scope = ("all" if done == task.n_pairs else f"a seeded random sample of {done} of the")
    progress(f"measured on {scope} {task.n_pairs} pairs in {wall / 60:.1f} min")
    shown_cols = ["nodes", "method", "reference", "pairs", "spearman", "spearman_low", "spearman_high",
                  "recall_at_5", "recall_at_10", "recall_at_10_low", "recall_at_10_high", "recall_at_20",
                  "mean_abs_exact", "mean_abs_estimate", "cpu_seconds"]
    print(table[shown_cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    verdicts = []
    for r in table[table.target].itertuples():
        ok = "met" if r.spearman_low >= 0.9 else "not met"
        verdicts.append(f"{r.method} ({r.nodes}) {r.spearman:.3f} [{r.spearman_low:.3f}, {r.spearman_high:.3f}]: {ok}")
    print("Target Spearman >= 0.9: " + "; ".join(verdicts))
    if args.json:
        args.json.write_text(json.dumps({"pairs": done, "of": task.n_pairs, "rows": table.to_dict("records")},
                                        default=float, indent=1))
    if args.docs:
        text = [
            f"Generated by `{command}` ({platform.machine()} CPU, {args.threads} torch thread, shared machine; "
            f"{time.strftime('%Y-%m-%d')}; {wall / 60:.0f} min wall). TFC1 over UD English EWT dev "
            f"({task.n_pairs} pairs, one per sentence, as the experiment's reader builds them); measured on "
            f"{scope} pairs, every method on the same pairs. Bundled all-MiniLM-L6-v2, cosine metric, 72 "
            "heads. Spearman of the mean scores over nodes with exact patching's (the same node kind); top-k recall "
            "= the share of exact patching's k largest |effects| among the estimate's k largest; E|effect| = mean "
            "over nodes of |the reference| (mean_abs_exact) and of |the estimate's mean| (mean_abs_estimate). "
            "Reference `|.|`: AtP* (GradDrop) is a magnitude, compared with the mean over pairs of |exact effect|. "
            "Intervals: 95% percentile bootstrap "
            f"over pairs ({args.n_boot} resamples, every mean recomputed: pair-sampling variance only). CPU "
            "seconds: this process's, per method over all shards.",
            "",
            to_markdown(small_numbers(table), shown_cols),
            "",
            "Target Spearman >= 0.9 (met = the whole interval at or above 0.9): " + "; ".join(verdicts) + ".",
        ]
        write_docs(args.docs, "\n".join(text), BLOCK)


if __name__ == "__main__":
    main()
