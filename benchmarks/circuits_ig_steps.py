"""EAP-IG against exact patching as the number of IG steps grows: is the gap the method or too few steps?

TFC1 over the UD English EWT dev sentences on the bundled model (cosine metric, the experiment's task). For each
m in ``--steps``: Spearman and Pearson over the 72 heads of EAP-IG (inputs interpolated, Hanna et al.'s
``get_scores_eap_ig``) and EAP-IG-activations (each layer's head outputs interpolated, their
``get_scores_ig_activations``) with exact patching (mean effect over pairs), and each method's cost in
forward-equivalents (seconds / seconds of one clean forward over the same pairs, same run). ``--bert-base`` adds
the cost of every head method for the 144 heads of a random bert-base-shaped model. ``--docs FILE`` rewrites the
block between ``<!-- ig-steps:begin -->`` and ``<!-- ig-steps:end -->`` in FILE with the generated tables.

    nice python benchmarks/circuits_ig_steps.py --pairs 24 --steps 3 10 20 50 --docs docs/experiments/circuits.md

Needs ../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu (from a worktree: /work/shared/...).
"""

from __future__ import annotations

import argparse
import platform
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from benchutils import ewt_dev_path, tfc1_task
from scipy.stats import pearsonr, spearmanr


def sweep(model, task, steps: list[int], act_steps: list[int] | None = None,
          batch_size: int = 16) -> tuple[pd.DataFrame, float]:
    """Rows: method, steps, spearman, pearson (over heads, vs exact patching), seconds, forward_equivalents;
    and the seconds of one clean forward over the task (the unit)."""
    from bertscope.hooks import circuits

    circuits.metric_values(model, task, "clean", batch_size)  # warm-up: the unit is not a first call
    start = time.perf_counter()
    circuits.metric_values(model, task, "clean", batch_size)
    fwd = time.perf_counter() - start
    start = time.perf_counter()
    exact, _ = circuits.patching.patch_effects(model, task, "heads", batch_size=batch_size)
    rows = [{"method": "exact", "steps": 0, "spearman": 1.0, "pearson": 1.0,
             "seconds": time.perf_counter() - start}]
    ref = exact.mean(0)
    act_steps = steps if act_steps is None else act_steps
    runs = [("atp", 0), ("atp*", 0)] + [("eap-ig", s) for s in steps] + [("eap-ig-act", s) for s in act_steps] + [
        ("ig-act-own", s) for s in act_steps]
    for method, s in runs:
        start = time.perf_counter()
        est, _ = circuits.attribution.attribute_effects(model, task, method, "heads", steps=max(s, 1),
                                                        batch_size=batch_size)
        secs = time.perf_counter() - start
        e = est.mean(0)
        rows.append({"method": method, "steps": s, "spearman": float(spearmanr(e, ref)[0]),
                     "pearson": float(pearsonr(e, ref)[0]), "seconds": secs})
    out = pd.DataFrame(rows)
    out["forward_equivalents"] = out.seconds / fwd
    return out, fwd


def to_markdown(df: pd.DataFrame, cols: list[str]) -> str:
    """A GitHub table of ``cols`` (floats to 3 decimals; seconds, CPU seconds and forward-equivalents to 1)."""
    def fmt(c, v):
        if isinstance(v, float | np.floating):
            return f"{v:.1f}" if c in ("forward_equivalents", "seconds", "cpu_seconds") else f"{v:.3f}"
        return str(v)
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    lines += ["| " + " | ".join(fmt(c, r[c]) for c in cols) + " |" for _, r in df.iterrows()]
    return "\n".join(lines)


def write_docs(path: Path, text: str, name: str = "ig-steps") -> None:
    """Replace the block between ``<!-- {name}:begin -->`` and ``<!-- {name}:end -->`` in ``path`` (appended at the
    end when absent), atomically."""
    doc = path.read_text()
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{text}\n{end}"
    if begin in doc and end in doc:
        doc = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, doc, flags=re.S)
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(doc)
    tmp.replace(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=24)
    p.add_argument("--steps", type=int, nargs="+", default=[3, 10, 20, 50])
    p.add_argument("--ewt", type=Path, default=ewt_dev_path())
    p.add_argument("--act-steps", type=int, nargs="+", default=None,
                   help="steps for EAP-IG-activations (default: --steps; it costs n_layers x m passes)")
    p.add_argument("--bert-base", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--docs", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)



    model, task = tfc1_task(args.ewt, args.pairs)
    table, fwd = sweep(model, task, args.steps, args.act_steps)
    print(table.to_string(index=False))
    best = table[table.method.str.startswith("eap-ig")].groupby("method").spearman.max()
    text = [f"Generated by `benchmarks/circuits_ig_steps.py --pairs {args.pairs} --steps "
            f"{' '.join(map(str, args.steps))}"
            f"{' --act-steps ' + ' '.join(map(str, args.act_steps)) if args.act_steps else ''}"
            f"{' --bert-base' if args.bert_base else ''}` "
            f"({platform.machine()} CPU, {args.threads} threads, shared machine; one run, no interval on the "
            f"correlations; unit: one clean forward over the {task.n_pairs} pairs = {fwd:.3f} s after a warm-up). "
            f"TFC1 over the first {task.n_pairs} EWT dev sentences that give a pair, bundled model, 72 heads:", "",
            to_markdown(table, ["method", "steps", "spearman", "pearson", "forward_equivalents"]), "",
            f"Best Spearman over the steps tried: EAP-IG {best.get('eap-ig', float('nan')):.3f}, "
            f"EAP-IG-activations {best.get('eap-ig-act', float('nan')):.3f} (target 0.9: EAP-IG "
            f"{'met' if best.get('eap-ig', 0) >= 0.9 else 'not met'}, EAP-IG-activations "
            f"{'met' if best.get('eap-ig-act', 0) >= 0.9 else 'not met'})."]
    if args.bert_base:
        import circuits as bench  # benchmarks/circuits.py

        big, _ = bench.bert_base_cost(task, args.steps[0], (args.act_steps or args.steps)[0], 16, print)
        print(big.to_string(index=False))
        text += ["", f"bert-base shape (random 12 x 12 x 768 model, the same {task.n_pairs} pairs' token ids, a random "
                 f"linear metric on the mean-pooled state; 144 heads; EAP-IG with m = {args.steps[0]}):", "",
                 to_markdown(big, ["method", "seconds", "forward_equivalents"])]
    if args.docs:
        write_docs(args.docs, "\n".join(text))


if __name__ == "__main__":
    main()
