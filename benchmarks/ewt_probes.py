"""EWT numbers for docs/experiments/structure.md and docs/experiments/erasure.md (issue 31): prints markdown
tables generated from the runs' saved tables, with the command that made them.

1. `bertscope run structure --corpus EWT-train --eval-corpus EWT-dev`: distance and depth probes at every layer
   (trained and early-stopped on EWT train, best layer and smallest rank chosen on a dev part of EWT train,
   every number on EWT dev), the random-weights model, the embedding layer, the linear chain and random trees.
2. `bertscope run erasure` (defaults: EWT train -> EWT dev when EWT is found): the layer-wise amnesic table for
   position and UPOS.

    python benchmarks/ewt_probes.py --out /tmp/ewt [--n-train 1500 --n-dev 300 --n-test 800]

Needs UD English EWT (`corpus.ewt.find_ewt`); exits 2 with a message when it is absent.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd


def _run(argv: list[str]) -> float:
    """Run ``bertscope`` with ``argv``; returns CPU seconds of the child (user + system)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    print("$ bertscope " + " ".join(argv), flush=True)
    subprocess.run([sys.executable, "-m", "bertscope", *argv], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"  wall {time.perf_counter() - t0:.0f} s, CPU {cpu:.0f} s", flush=True)
    return cpu


def _ci(row: pd.Series, m: str) -> str:
    return f"{row[m]:.3f} [{row[m + '_ci_low']:.3f}, {row[m + '_ci_high']:.3f}]"


def structure_table(folder: Path) -> str:
    """Per layer: UUAS, DSpr, root accuracy, NSpr with intervals; random-weights UUAS; baselines; smallest rank."""
    s = pd.read_parquet(folder / "summary.parquet")
    lines = ["| layer | UUAS | DSpr | root acc | NSpr | random-weights UUAS | smallest rank (UUAS there) "
             "| best on dev |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for _, r in s.iterrows():
        rank = "" if pd.isna(r["smallest_rank"]) else f"{int(r['smallest_rank'])} ({r['uuas_at_smallest_rank']:.3f})"
        lines.append(f"| {int(r['layer'])} | {_ci(r, 'uuas')} | {_ci(r, 'dspr')} | {_ci(r, 'root_acc')} | "
                     f"{_ci(r, 'nspr')} | {r.get('random_uuas', float('nan')):.3f} | {rank} | {r['best_on_dev']} |")
    r0 = s.iloc[0]
    lines.append(f"\nLinear chain UUAS {r0['linear_chain_uuas']:.3f}; random spanning tree "
                 f"{r0['random_tree_uuas']:.3f}. Selection: {r0['selection']}.")
    res = pd.read_parquet(folder / "results.parquet")
    lines.append(f"Sentences: train {res['n_train'].iloc[0]}, dev {res['n_dev'].iloc[0]} (of {res['corpus'].iloc[0]}),"
                 f" test {res['n_test'].iloc[0]} (of {res['test_corpus'].iloc[0]}).")
    return "\n".join(lines)


def erasure_table(folder: Path) -> str:
    """Per concept, erasure layer and method: the change at the last layer with the equal-rank random control."""
    s = pd.read_parquet(folder / "summary.parquet")
    lines = ["| concept | erased at | method | rank | same-concept probe Δ [95% CI] | random same Δ | other probes Δ | "
             "random other Δ | UUAS after [95% CI] | UUAS Δ | random UUAS Δ | embedding cosine |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for _, r in s.iterrows():
        lines.append(f"| {r['concept']} | {int(r['erase_layer'])} | {r['method']} | {int(r['rank'])} | "
                     f"{r['same_delta']:+.3f} [{r['same_delta_ci_low']:+.3f}, {r['same_delta_ci_high']:+.3f}] | "
                     f"{r['random_same_delta']:+.3f} | {r['other_delta']:+.3f} | {r['random_other_delta']:+.3f} | "
                     f"{r['uuas_value']:.3f} [{r['uuas_ci_low']:.3f}, {r['uuas_ci_high']:.3f}] | "
                     f"{r['uuas_delta']:+.3f} | {r['random_uuas_delta']:+.3f} "
                     f"| {r['embedding_cosine']:.4f} |")
    res = pd.read_parquet(folder / "results.parquet")
    lines.append(f"\nTrain {res['n_train'].iloc[0]} sentences of {res['train_corpus'].iloc[0]}, every number on "
                 f"{res['n_eval'].iloc[0]} of {res['eval_corpus'].iloc[0]}; last layer {int(res['layer'].max())}.")
    return "\n".join(lines)


def main() -> int:
    from bertscope.experiments.corpus.ewt import find_ewt

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("results/ewt"))
    p.add_argument("--n-train", type=int, default=1500)
    p.add_argument("--n-dev", type=int, default=300)
    p.add_argument("--n-test", type=int, default=800)
    p.add_argument("--sublayers", default="resid_mid", help="structure's sublayers setting (True, False, names)")
    p.add_argument("--erasure-n-train", type=int, default=150)
    p.add_argument("--erasure-n-eval", type=int, default=80)
    p.add_argument("--only", choices=["structure", "erasure"], default=None)
    args = p.parse_args()
    train, dev = find_ewt("train"), find_ewt("dev")
    if train is None or dev is None:
        print("UD English EWT not found (BERTSCOPE_UD_EWT or shared/data/ud-english-ewt/)", file=sys.stderr)
        return 2
    if args.only in (None, "structure"):
        cpu = _run(["run", "structure", "--corpus", str(train), "--eval-corpus", str(dev), "--out", str(args.out),
                    "--quiet", "--set", f"structure.n_train={args.n_train}", "--set", f"structure.n_dev={args.n_dev}",
                    "--set", f"structure.n_test={args.n_test}", "--set", f"structure.sublayers={args.sublayers}"])
        print(f"\n### Structural probes on EWT (CPU {cpu:.0f} s)\n\n{structure_table(args.out / 'structure')}\n")
    if args.only in (None, "erasure"):
        cpu = _run(["run", "erasure", "--out", str(args.out), "--quiet", "--set",
                    f"erasure.n_train={args.erasure_n_train}", "--set", f"erasure.n_eval={args.erasure_n_eval}"])
        print(f"\n### Amnesic probing on EWT (CPU {cpu:.0f} s)\n\n{erasure_table(args.out / 'erasure')}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
