"""Write a `bertscope run similarity` output folder's numbers into a markdown block (no number typed by hand).

    python benchmarks/similarity_docs.py OUT/similarity --command "bertscope run similarity ..." \
        --docs docs/experiments/similarity.md --block stsb-run

Reads the saved tables (`benchmark`, `heads`, `aopc`, `faithfulness`, `methods`, `claims`) and the manifest, and
formats: the report split's Spearman grid, the findings' sentences on heads and claims, the AOPC table of every
removal and sides with its baselines and the ratio to attention rollout, and the conservation errors. Without
``--docs`` the block is printed.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

import pandas as pd


def _ci(v: float, low: float, high: float, digits: int = 3) -> str:
    return f"{v:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def block(folder: Path, command: str) -> str:
    """The markdown block for the run in ``folder``."""
    F = importlib.import_module("bertscope.experiments.similarity.findings")  # the package's `findings` is a function

    read = {n: pd.read_parquet(folder / f"{n}.parquet") for n in ("benchmark", "heads", "aopc", "faithfulness",
                                                                  "methods")}  # fmt: skip
    manifest = json.loads((folder / "manifest.json").read_text())
    settings = manifest["notes"]["settings"]
    bench, aopc, faith, methods = read["benchmark"], read["aopc"], read["faithfulness"], read["methods"]
    rep = bench[bench.split == "report"]
    n_sel = int(bench[bench.split == "select"].n_pairs.iloc[0])
    lines = [f"Command: `{command}` (seed {manifest.get('seed', 0)}; {n_sel + int(rep.n_pairs.iloc[0])} pairs, "
             f"{n_sel} select / {int(rep.n_pairs.iloc[0])} report; {int(aopc.n_pairs.iloc[0])} pairs attributed, "
             f"path methods at {int(methods.steps.iloc[0])} steps). Written by `benchmarks/similarity_docs.py` "
             "from the run's tables.", "",
             "**benchmark** (report split, Spearman with 95% interval; `*` = the model's own embedding, `chosen` = "
             "chosen on the select split):", "", "| site | " + " | ".join(settings["poolings"]) + " |",
             "|---|" + "---|" * len(settings["poolings"])]  # fmt: skip
    for site, g in rep.groupby("site", sort=False):
        cells = []
        for how in settings["poolings"]:
            r = g[g.pooling == how].iloc[0]
            mark = (" *" if r.own else "") + (" chosen" if r.chosen else "")
            cells.append(_ci(r.spearman, r.spearman_low, r.spearman_high) + mark)
        lines.append(f"| {site} | " + " | ".join(cells) + " |")
    own = rep[rep.own].iloc[0]
    lines += ["", f"The model's own embedding on the report half: Spearman {own.spearman:.4f}, Pearson "
              f"{own.pearson:.4f}.", "", f"**heads**: {F._heads(read['heads']).text}", "",
              "**aopc** (mean cosine drop over k = " + str(aopc.ks.iloc[0]).replace(",", ", ") + ", with 95% "
              "interval over pairs; against k random token pairs and the matched baseline; `x rollout`: the AOPC "
              "over attention rollout's, interval from the same pair resamples; `every k`: above random at every k):",
              "", "| removal | sides | method | AOPC | random | vs random | every k | matched | vs matched | "
              "x rollout |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in aopc[aopc.method != "random"].itertuples():
        f = faith[(faith.removal == r.removal) & (faith.sides == r.sides) & (faith.method == r.method)]
        every = "yes" if (f.vs_random == "above").all() else "no"
        ratio = (_ci(r.ratio_to_rollout, r.ratio_to_rollout_low, r.ratio_to_rollout_high, 2)
                 if r.ratio_to_rollout == r.ratio_to_rollout else "n/a")
        lines.append(f"| {r.removal} | {r.sides} | {r.method} | {_ci(r.aopc, r.aopc_low, r.aopc_high)} | "
                     f"{r.random_aopc:.3f} | {r.vs_random} | {every} | {r.matched_aopc:.3f} | {r.vs_matched} | "
                     f"{ratio} |")  # fmt: skip
    lines += ["", "**methods** (conservation error, mean over the attributed pairs; seconds per pair as run):", "",
              "| method | target (mean) | score (mean) | mean abs(sum - target) | relative to abs(score) | s / pair |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for r in methods.itertuples():
        lines.append(f"| {r.method} | {r.target:.4f} | {r.score:.4f} | {r.abs_error:.3g} | {r.relative_error:.3g} | "
                     f"{r.seconds_per_pair:.2f} |")  # fmt: skip
    claims = pd.read_parquet(folder / "claims.parquet")
    lines += ["", "**claims**:", ""] + [f"- {F._claim(r).text}" for r in claims.itertuples()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the run's OUT/similarity folder")
    parser.add_argument("--command", required=True, help="the command that made the folder (quoted in the block)")
    parser.add_argument("--docs", type=Path, default=None)
    parser.add_argument("--block", default="stsb-run")
    args = parser.parse_args()
    text = block(args.folder, args.command)
    print(text)
    if args.docs:
        from benchutils import write_docs

        write_docs(args.docs, text, args.block)


if __name__ == "__main__":
    main()
