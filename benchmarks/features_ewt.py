"""The numbers of docs/experiments/features.md: `bertscope run features` on the bundled model with UD English EWT
train text (gold UPOS, relations, trees), then the doc's two tables printed as markdown from the saved tables.

    python benchmarks/features_ewt.py [--corpus .../en_ewt-ud-train.conllu] [--out /tmp/features_ewt]
        [--tokens 200000] [--sentences 4000] [--n-train 2500] [--n-eval 400] [--threads 1]
        [--doc docs/experiments/features.md]

Needs /work/shared/data/ud-english-ewt/ (or ../shared/...; `corpus.ewt.find_ewt`). About 20 minutes of CPU on
2 cores at the defaults. Prints (1) per site the share of alive latents whose best single-variable label beats the
best neuron and the best PCA direction for that label on test sentences, with the labelled counts per family;
(2) k-sparse probing accuracy (k = 1, 5) for position and UPOS from latents, neurons, PCA, re-initialised latents.
With ``--doc`` the command, its cost and the two tables replace the generated block ``features-ewt`` of that file.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/features_ewt"))
    ap.add_argument("--tokens", type=int, default=200_000)
    ap.add_argument("--sentences", type=int, default=4000)
    ap.add_argument("--n-train", type=int, default=2500)
    ap.add_argument("--n-eval", type=int, default=400)
    ap.add_argument("--threads", type=int, default=1, help="bertscope run --threads (1: best on a busy machine)")
    ap.add_argument("--doc", type=Path, default=None, help="write the generated block into this markdown file")
    ap.add_argument("--tables-only", action="store_true", help="no run: the tables of an existing --out")
    ap.add_argument("--corpus", type=Path, default=None,
                    help="en_ewt-ud-train.conllu (default: looked for under ../shared/data/ud-english-ewt/)")
    args = ap.parse_args()
    from bertscope.experiments.corpus.ewt import find_ewt

    train = args.corpus if args.corpus is not None else find_ewt("train")
    if train is None or not Path(train).is_file():
        print("UD English EWT not found (see docs/experiments/features.md for where to get it)")
        return 1
    cmd = [sys.executable, "-m", "bertscope", "run", "features", "--corpus", str(train), "--out", str(args.out),
           "--max-sentences", str(args.sentences), "--no-report", "--threads", str(args.threads),
           "--tokens", str(args.tokens), "--set", f"features.n_train={args.n_train}",
           "--set", f"features.n_dev={args.n_eval}", "--set", f"features.n_test={args.n_eval}"]
    run_file = args.out / "features_ewt_run.txt"
    if not args.tables_only:
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        child = resource.getrusage(resource.RUSAGE_CHILDREN)
        args.out.mkdir(parents=True, exist_ok=True)
        run_file.write_text(f"{time.perf_counter() - t0:.0f} s wall, {child.ru_utime:.0f} s user + "
                            f"{child.ru_stime:.0f} s system CPU, {child.ru_maxrss / 1e6:.1f} GB peak memory")
    cost = run_file.read_text() if run_file.is_file() else "cost not recorded"
    head = (f"`python benchmarks/features_ewt.py --tokens {args.tokens} --sentences {args.sentences} "
            f"--n-train {args.n_train} --n-eval {args.n_eval} --threads {args.threads}` (corpus {train.name}, "
            f"the first {args.sentences:,} sentences; {args.tokens:,} training rows per dictionary; seed 0): "
            f"{cost}.")
    text = head + "\n\n" + tables(args.out / "features")
    print("\n" + text)
    if args.doc is not None:
        sys.path.insert(0, str(Path(__file__).parent))
        from benchutils import write_docs

        write_docs(args.doc, "\n" + text + "\n", name="features-ewt")
    return 0


def tables(folder: Path) -> str:
    """The doc's two markdown tables from a features output folder."""
    s = pd.read_parquet(folder / "summary.parquet")
    lines = ["| site | model | basis | units | dictionary width (rows trained) | labelled (position / duplicate / "
             "syntax / special) | share beating neuron and PCA |", "| --- | --- | --- | ---: | ---: | --- | ---: |"]
    for r in s.itertuples():
        width = f"{int(r.d_sae)} ({int(r.tokens_trained):,})" if "tokens_trained" in s and r.tokens_trained == \
            r.tokens_trained else (f"{int(r.d_sae)}" if "d_sae" in s else "-")
        lines.append(f"| {r.site} | {r.encoder} | {r.basis} | {r.n_units} | {width} | {r.n_labelled} ({r.n_position} "
                     f"/ {r.n_duplicate} / {r.n_syntax} / {r.n_special}) | "
                     f"{100 * r.share_beating_neuron_and_pca:.1f}% |")
    p = pd.read_parquet(folder / "sparse_probing_summary.parquet")
    p = p[p["variable"].isin(["position", "upos"]) & p["k"].isin([1, 5])]
    lines += ["", "| site | variable | k | latents | neurons | PCA | re-initialised latents |",
              "| --- | --- | ---: | --- | --- | --- | --- |"]
    for (site, var, k), g in p.groupby(["site", "variable", "k"], sort=False):
        h = g.set_index("source")
        cell = [f"{h.loc[x, 'accuracy']:.3f} [{h.loc[x, 'ci_low']:.3f}, {h.loc[x, 'ci_high']:.3f}]"
                if x in h.index else "-" for x in ("latent", "neuron", "pca", "reinit_latent")]
        lines.append(f"| {site} | {var} | {k} | " + " | ".join(cell) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
