"""EWT numbers for docs/experiments/structure.md and docs/experiments/erasure.md (issue 31): prints markdown
tables generated from the runs' saved tables, with the command that made them.

1. `bertscope run structure --corpus EWT-train --eval-corpus EWT-dev`: distance and depth probes at every layer
   (trained and early-stopped on EWT train, best layer and smallest rank chosen on a dev part of EWT train,
   every number on EWT dev), the random-weights model, the embedding layer, the linear chain and random trees.
2. `bertscope run erasure` (defaults: EWT train -> EWT dev when EWT is found): the layer-wise amnesic table for
   position and UPOS.

    python benchmarks/ewt_probes.py --out /tmp/ewt [--n-train 1500 --n-dev 300 --n-test 800] [--write-docs]

``--write-docs`` writes the generated markdown (command, sizes, CPU seconds, tables) into the marked blocks of
docs/experiments/structure.md and erasure.md (between ``<!-- ewt_probes:NAME -->`` and ``<!-- /ewt_probes:NAME
-->``); ``--render-only`` redraws them from the runs already in ``--out`` (their commands and CPU seconds are kept
in ``OUT/ewt_probes.json``) without running anything. The word-level probing table (UPOS, relation, depth,
position, XPOS at every layer and sublayer, with control tasks and selectivity) comes from the erasure run.

Needs UD English EWT (`corpus.ewt.find_ewt`); exits 2 with a message when it is absent.
"""

from __future__ import annotations

import argparse
import json
import re
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
    """Per concept, erasure layer and method: the change at the last layer with the equal-rank random control
    (layers named as in the report: `naming.residual_name` of the tables' residual index)."""
    from bertscope.experiments.naming import residual_name

    s = pd.read_parquet(folder / "summary.parquet")
    lines = ["| concept | erased at | method | rank | same-concept probe Δ [95% CI] | random same Δ | other probes Δ | "
             "random other Δ | UUAS after [95% CI] | UUAS Δ | random UUAS Δ | embedding cosine |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for _, r in s.iterrows():
        lines.append(f"| {r['concept']} | {residual_name(int(r['erase_layer']))} | {r['method']} | {int(r['rank'])} | "
                     f"{r['same_delta']:+.3f} [{r['same_delta_ci_low']:+.3f}, {r['same_delta_ci_high']:+.3f}] | "
                     f"{r['random_same_delta']:+.3f} | {r['other_delta']:+.3f} | {r['random_other_delta']:+.3f} | "
                     f"{r['uuas_value']:.3f} [{r['uuas_ci_low']:.3f}, {r['uuas_ci_high']:.3f}] | "
                     f"{r['uuas_delta']:+.3f} | {r['random_uuas_delta']:+.3f} "
                     f"| {r['embedding_cosine']:.4f} |")
    res = pd.read_parquet(folder / "results.parquet")
    lines.append(f"\nTrain {res['n_train'].iloc[0]} sentences of {res['train_corpus'].iloc[0]}, every number on "
                 f"{res['n_eval'].iloc[0]} of {res['eval_corpus'].iloc[0]}; \"after\" is the last layer's residual "
                 f"stream ({residual_name(int(res['layer'].max()))}).")
    return "\n".join(lines)


PROBED = {"upos": "UPOS", "xpos": "XPOS", "deprel": "relation to head", "depth": "tree depth",
          "position": "position"}


def probing_table(folder: Path) -> str:
    """Word-level probes per target and site (erasure's ``probing`` table): task accuracy, control task,
    selectivity, each with its interval, and the majority baseline."""
    t = pd.read_parquet(folder / "probing.parquet")
    flow = {"embed": 0, "attn_out": 1, "resid_mid": 2, "mlp_out": 3, "resid_post": 4}  # in a block's order
    t = t.assign(_flow=t["component"].map(flow)).sort_values(["layer", "_flow"], kind="stable")
    t = t.assign(_target=t["target"].map({k: i for i, k in enumerate(PROBED)})).sort_values("_target", kind="stable")
    lines = ["| target | layer | site | accuracy [95% CI] | control task [95% CI] | selectivity [95% CI] | majority |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for (target, layer, site), g in t.groupby(["target", "layer", "site"], sort=False):
        by = g.set_index("label")
        cells = [f"{by.loc[k, 'value']:.3f} [{by.loc[k, 'ci_low']:.3f}, {by.loc[k, 'ci_high']:.3f}]"
                 for k in ("task", "control", "selectivity")]
        lines.append(f"| {PROBED.get(target, target)} | {int(layer)} | `{site}` | {' | '.join(cells)} | "
                     f"{by['majority'].iloc[0]:.3f} |")
    sel = t[t["label"] == "selectivity"]
    counts = [f"{PROBED.get(k, k)} {int((g['ci_low'] > 0).sum())} above 0 and {int((g['ci_high'] < 0).sum())} "
              f"below 0 of {len(g)}" for k, g in sel.groupby("target", sort=False)]
    lines.append("\nSites whose selectivity interval lies above / below 0: " + "; ".join(counts) + ". Below 0: "
                 "the word-identity control task is learned better than the task itself from these training "
                 "sentences, so the task accuracy there says little about the concept.")
    r = t.iloc[0]
    lines.append(f"\nProbes (ridge, alpha {r['alpha']}) trained on {r['n_train']} sentences of {r['train_corpus']}, "
                 f"every number on {r['n_eval']} of {r['eval_corpus']}; control task: word identity (Hewitt & Liang); "
                 "selectivity = task - control, paired interval over evaluation sentences.")
    return "\n".join(lines)


def best_layers(folder: Path) -> str:
    """One sentence per metric: the layer chosen on the dev split and its test value against the controls."""
    s = pd.read_parquet(folder / "summary.parquet")
    out = []
    for m, name in (("uuas", "UUAS"), ("dspr", "DSpr"), ("root_acc", "root accuracy"), ("nspr", "NSpr")):
        chosen = s[s["best_on_dev"].str.split(",").apply(lambda b, m=m: m in b)]
        if not len(chosen):
            continue
        r, emb = chosen.iloc[0], s[s["layer"] == 0].iloc[0]
        out.append(f"{name}: layer {int(r['layer'])} (chosen on dev) {_ci(r, m)}, against {emb[m]:.3f} at the "
                   f"embedding layer and {r.get('random_' + m, float('nan')):.3f} for the random-weights model "
                   "at the same layer")
    chain = s["linear_chain_uuas"].iloc[0]
    return "; ".join(out) + f"; linear chain UUAS {chain:.3f}."


def _block(name: str, body: str, doc: Path) -> None:
    """Replace the block between ``<!-- ewt_probes:NAME -->`` and ``<!-- /ewt_probes:NAME -->`` in ``doc``."""
    text = doc.read_text()
    start, end = f"<!-- ewt_probes:{name} -->", f"<!-- /ewt_probes:{name} -->"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{doc}: no block {start} ... {end} to write into")
    text = pattern.sub(lambda _: f"{start}\n{body.strip()}\n{end}", text)
    from bertscope.experiments.io import write_text

    write_text(doc, text)


def _n_sentences(path: Path) -> int:
    """Sentences in a CoNLL-U file (blocks separated by blank lines)."""
    return sum(1 for block in path.read_text(encoding="utf-8").split("\n\n") if block.strip())


def structure_markdown(out: Path, run: dict) -> str:
    from bertscope.experiments.corpus.ewt import find_ewt

    res = pd.read_parquet(out / "structure" / "results.parquet")
    n_train, n_dev, n_test = (int(res[c].iloc[0]) for c in ("n_train", "n_dev", "n_test"))
    sizes = {k: _n_sentences(find_ewt(k)) for k in ("train", "dev")}
    full = ("" if n_train + n_dev >= sizes["train"] else ": not all of EWT train, because this measurement's budget "
            "was about 25 CPU-minutes on a 2-core machine shared with other jobs; `--n-train 12000` runs the full "
            "size")
    return f"""Generated by `benchmarks/ewt_probes.py` (this block is written by the script from the saved tables), run
niced on the shared 2-core machine: **{run['cpu']:.0f} CPU-s** ({run['wall']:.0f} s wall under the load of other
jobs).

```bash
{_command(run)}
```

Sizes: {n_train} training sentences and {n_dev} early-stopping / selection sentences drawn from
{res['corpus'].iloc[0]} (of its {sizes['train']:,}{full}), and {n_test} test sentences of
{res['test_corpus'].iloc[0]} (of its {sizes['dev']:,}; sentences cut by `--max-length` are left out), disjoint from
every selection. Every site of the trained model (embeddings and each block's output) with the
rank sweep; the random-weights model at the same sites; the linear chain and random trees.

{structure_table(out / 'structure')}

Best layers (chosen on the dev sentences of EWT train, reported on EWT dev): {best_layers(out / 'structure')}

Intervals: 95% group bootstrap over the {n_test} EWT dev sentences (probes held fixed: not the training sample or
seed)."""


def _command(run: dict) -> str:
    """The recorded script command (``--out`` as run) and the ``bertscope`` command it ran (EWT files by name)."""
    argv, script = run["argv"], run["script"]
    out = argv[argv.index("--out") + 1]
    script = script.replace(f"--out {Path(out).name} ", f"--out {out} ")  # runs recorded before the --out fix
    return f"{script}\n# = bertscope {' '.join(Path(a).name if a.endswith('.conllu') else a for a in argv)}"


def erasure_markdown(out: Path, run: dict) -> str:
    return f"""Generated by `benchmarks/ewt_probes.py` (this block is written by the script from the saved tables), run
niced on the shared 2-core machine: **{run['cpu']:.0f} CPU-s** ({run['wall']:.0f} s wall under the load of other
jobs).

```bash
{_command(run)}
```

{erasure_table(out / 'erasure')}

Δ: erased minus clean at the last layer, 95% group bootstrap over evaluation sentences (paired; the probes and
erasers held fixed).

#### Word-level probes on EWT at every layer and sublayer (same run, clean vectors)

{probing_table(out / 'erasure')}"""


def main() -> int:
    from bertscope.experiments.corpus.ewt import find_ewt
    from bertscope.experiments.io import write_json

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("results/ewt"))
    p.add_argument("--n-train", type=int, default=1500)
    p.add_argument("--n-dev", type=int, default=300)
    p.add_argument("--n-test", type=int, default=800)
    p.add_argument("--sublayers", default="resid_mid", help="structure's sublayers setting (True, False, names)")
    p.add_argument("--erasure-n-train", type=int, default=150)
    p.add_argument("--erasure-n-eval", type=int, default=80)
    p.add_argument("--erase-layers", default=None, help="erasure's erase_layers, e.g. 1,3 (default: the experiment's)")
    p.add_argument("--only", choices=["structure", "erasure"], default=None)
    p.add_argument("--write-docs", action="store_true", help="write the markdown into docs/experiments/*.md")
    p.add_argument("--render-only", action="store_true", help="no runs: render the runs already in --out")
    args = p.parse_args()
    train, dev = find_ewt("train"), find_ewt("dev")
    if train is None or dev is None:
        print("UD English EWT not found (BERTSCOPE_UD_EWT or shared/data/ud-english-ewt/)", file=sys.stderr)
        return 2
    record = args.out / "ewt_probes.json"
    runs = json.loads(record.read_text()) if record.exists() else {}
    script = "python " + " ".join(Path(a).name if a.endswith(".conllu") else a for a in sys.argv)
    todo = [n for n in ("structure", "erasure") if args.only in (None, n)]
    argv = {"structure": ["run", "structure", "--corpus", str(train), "--eval-corpus", str(dev), "--out",
                          str(args.out), "--quiet", "--set", f"structure.n_train={args.n_train}", "--set",
                          f"structure.n_dev={args.n_dev}", "--set", f"structure.n_test={args.n_test}", "--set",
                          f"structure.sublayers={args.sublayers}"],
            "erasure": ["run", "erasure", "--out", str(args.out), "--quiet", "--set",
                        f"erasure.n_train={args.erasure_n_train}", "--set", f"erasure.n_eval={args.erasure_n_eval}"]
            + (["--set", f"erasure.erase_layers=({args.erase_layers},)"] if args.erase_layers else [])}
    for name in todo:
        if not args.render_only:
            t0 = time.perf_counter()
            cpu = _run(argv[name])
            runs[name] = {"cpu": cpu, "wall": time.perf_counter() - t0, "argv": argv[name], "script": script}
            args.out.mkdir(parents=True, exist_ok=True)
            write_json(record, runs)
        if name not in runs:
            print(f"{name}: no recorded run in {record}", file=sys.stderr)
            return 2
        text = (structure_markdown if name == "structure" else erasure_markdown)(args.out, runs[name])
        print(f"\n### {name} on EWT\n\n{text}\n")
        if args.write_docs:
            _block(name, text, Path(__file__).resolve().parents[1] / "docs" / "experiments" / f"{name}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
