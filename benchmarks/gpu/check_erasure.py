"""GPU check for issue 31: EWT structural probes at every layer and the erasure experiment on the bert-base-shaped
random model (``common.random_bert``), with their times.

1. ``bertscope run structure`` on UD English EWT train (every layer and resid_mid, distance and depth probes, the
   rank sweep and the random-weights control): its own split of EWT train by sentence.
2. ``bertscope run erasure`` trained on EWT train and evaluated on EWT dev (``--corpus train --eval-corpus dev``).

EWT is looked up as the package does (`corpus.ewt.find_ewt`: ``BERTSCOPE_UD_EWT`` or ``shared/data/ud-english-ewt/``
beside the repository or above it); when it is absent the check prints why and writes a result saying it skipped
(exit 0). ``--small``: the tiny random model, a few dozen sentences, a CPU smoke test.

    python3 benchmarks/gpu/check_erasure.py --device cuda --out results/gpu
    python3 benchmarks/gpu/check_erasure.py --device cpu --small --out /tmp/gpu
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Timer, parser, random_bert, write_result  # noqa: E402


def main() -> int:
    args = parser(__doc__.splitlines()[0]).parse_args()
    from bertscope.experiments import erasure, structure
    from bertscope.experiments.corpus.ewt import find_ewt
    from bertscope.experiments.options import RunOptions, prepare_inputs
    from bertscope.experiments.runner import run_experiment

    train, dev = find_ewt("train"), find_ewt("dev")
    result: dict = {"device": args.device, "small": args.small}
    if train is None or dev is None:
        print("check_erasure: skipped: UD English EWT not found (set BERTSCOPE_UD_EWT or put shared/data/"
              "ud-english-ewt/ beside the repository)")
        write_result(args.out, "check_erasure", {**result, "skipped": "EWT not found"})
        return 0
    work = Path(tempfile.mkdtemp(prefix="check_erasure_"))
    model = random_bert(small=args.small)
    sizes = ({"n_train": 24, "n_dev": 8, "n_test": 12, "max_epochs": 3, "n_boot": 50, "workers": 1} if args.small
             else {"n_train": 500, "n_dev": 100, "n_test": 300, "n_boot": 1000, "workers": 1})
    er_sizes = ({"n_train": 24, "n_eval": 12, "inlp_iterations": 2, "structural_epochs": 2, "structural_rank": 8,
                 "n_boot": 20, "erase_layers": (1,)} if args.small
                else {"n_train": 500, "n_eval": 200, "erase_layers": (4, 8)})
    base = dict(model=str(model), device=args.device, quiet=True, max_length=128)
    opts_s = RunOptions(**base, corpus=str(train), out=work / "structure", max_sentences=None if not args.small
                        else 60, settings={"structure": sizes})
    inputs = prepare_inputs(opts_s)
    with Timer(args.device) as t:
        status = run_experiment(structure, opts_s, inputs).status
    result["structure"] = {"status": status, "seconds": round(t.seconds, 1), "sentences": len(inputs.corpus), **sizes}
    print(f"structure on EWT train ({len(inputs.corpus)} sentences, all layers): {status} in {t.seconds:.1f} s")
    write_result(args.out, "check_erasure", result)  # kept if the erasure run is cut short by gpu.sh's time limit
    opts_e = RunOptions(**base, corpus=str(train), eval_corpus=str(dev), out=work / "erasure",
                        max_sentences=4 * er_sizes["n_train"], settings={"erasure": er_sizes})
    inputs = prepare_inputs(opts_e)
    with Timer(args.device) as t:
        status = run_experiment(erasure, opts_e, inputs).status
    result["erasure"] = {"status": status, "seconds": round(t.seconds, 1),
                         **{k: list(v) if isinstance(v, tuple) else v for k, v in er_sizes.items()}}
    print(f"erasure EWT train -> dev: {status} in {t.seconds:.1f} s")
    for name in ("structure", "erasure"):
        summary = work / name / name / "summary.csv"
        if summary.is_file():
            result[name]["summary_csv"] = summary.read_text()[:20000]
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {write_result(args.out, 'check_erasure', result)}")
    return 0 if all(result[n]["status"] == "complete" for n in ("structure", "erasure")) else 1


if __name__ == "__main__":
    sys.exit(main())
