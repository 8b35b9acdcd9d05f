"""GPU timing for issue 42 (run by the minimal-pairs block of ``benchmarks/gpu.sh``, only where a GPU is lent).

    python benchmarks/minimal_pairs_gpu.py --device cuda --out results/gpu [--pairs 10000]
    python benchmarks/minimal_pairs_gpu.py --device cpu --small          # smoke test: tiny model, 60 pairs

On a random-weight ``BertForMaskedLM`` of bert-base's shape (12 x 12 x 768, BERT's 30,522-piece vocabulary; saved
offline with the bundled tokenizer):

1. ``bertscope run minimal-pairs --corpus BLIMP`` on ``--pairs`` BLiMP pairs (evenly spaced, all paradigms) with
   ``--device``: wall seconds, pairs/s and tokens/s (the pieces of every masked copy the forward passes read,
   counted from the run's tables: both PLL methods' copies, each a sentence's pieces plus [CLS]/[SEP]; copies the
   two methods share are read once but counted once per method, so this overstates the tokens by the shared
   share), and the time for all 67,000 pairs at that rate (extrapolated when ``--pairs`` is less);
2. tuned-lens training: every stream at 15% masked positions of 2,000 BLiMP sentences (``masked_streams``), then
   ``fit_tuned_lens`` for 20 epochs: seconds of each part.

BLiMP is looked for at ``$BERTSCOPE_BLIMP``, ``.gpu/blimp/blimp.tsv.gz`` (copy it there before packing ``.gpu``)
and ``../shared/data/blimp/blimp.tsv.gz``. Results: ``OUT/minimal_pairs_gpu.json``, rewritten after each part.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))

import common  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
N_BLIMP = 67_000


def blimp_path() -> Path | None:
    """BLiMP's TSV where this machine has it, else None."""
    for path in (os.environ.get("BERTSCOPE_BLIMP"), ROOT / ".gpu" / "blimp" / "blimp.tsv.gz",
                 ROOT.parent / "shared" / "data" / "blimp" / "blimp.tsv.gz"):
        if path and Path(path).is_file():
            return Path(path)
    return None


def random_mlm(small: bool) -> Path:
    """A random BertForMaskedLM of bert-base's shape (``small``: 2 x 4 x 64) with the bundled tokenizer, saved once
    under the scratch folder."""
    import torch
    import transformers

    folder = common.SCRATCH / f"random_bert_mlm_{'small' if small else 'base'}"
    if (folder / "config.json").exists():
        return folder
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, max_position_embeddings=512,
                                     **(common.SMALL if small else common.BERT_BASE))
    transformers.BertForMaskedLM(config).eval().save_pretrained(folder)
    for name in common.TOKENIZER_FILES:
        shutil.copy(common.TOKENIZER_FOLDER / name, folder / name)
    return folder


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=10_000, help="BLiMP pairs to run (evenly spaced over the file)")
    p.add_argument("--batch-rows", type=int, default=2048, help="masked copies per forward pass")
    args = p.parse_args()
    import numpy as np
    import pandas as pd
    import torch

    blimp = blimp_path()
    if blimp is None:
        sys.exit("BLiMP not found: set BERTSCOPE_BLIMP or copy ../shared/data/blimp/blimp.tsv.gz to .gpu/blimp/")
    n = 60 if args.small else min(args.pairs, N_BLIMP)
    model = random_mlm(args.small)
    work = common.SCRATCH / "minimal_pairs"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with gzip.open(blimp, "rt", encoding="utf-8") as f:
        table = pd.read_csv(f, sep="\t", quoting=3, dtype=str, keep_default_na=False)
    picked = table.iloc[np.linspace(0, len(table) - 1, n).round().astype(int)]  # every paradigm represented
    picked.to_csv(work / "pairs.tsv", sep="\t", index=False, quoting=3)
    result: dict = {"device": args.device, "model": "random BertForMaskedLM " + ("small" if args.small else
                    "bert-base shape (12 x 12 x 768)"), "pairs": n}  # fmt: skip
    if args.device.startswith("cuda") and torch.cuda.is_available():
        result["gpu"] = torch.cuda.get_device_name(0)
    cmd = [sys.executable, "-m", "bertscope", "run", "minimal-pairs", "--model", str(model), "--corpus",
           str(work / "pairs.tsv"), "--out", str(work / "out"), "--device", args.device, "--no-report", "--quiet",
           "--force", "--set", f"minimal-pairs.batch_rows={args.batch_rows}"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    result["run"] = {"rc": proc.returncode, "seconds": round(seconds, 2), "tail": (proc.stdout + proc.stderr)[-600:]}
    if proc.returncode == 0:
        results = pd.read_parquet(work / "out" / "minimal_pairs" / "results.parquet")
        copies = int((results["n_good"] + results["n_bad"]).sum())
        tokens = int((results["n_good"] * (results["n_good"] + 2) + results["n_bad"] * (results["n_bad"] + 2)).sum())
        result["run"].update({"masked_copies": copies, "tokens": tokens, "pairs_per_s": round(n / seconds, 1),
                              "tokens_per_s": round(tokens / seconds), "blimp_seconds": round(N_BLIMP * seconds / n),
                              "blimp_seconds_is": "measured" if n == N_BLIMP else "extrapolated at the same rate"})
    print(f"run minimal-pairs: {n} pairs in {seconds:.1f} s (rc {proc.returncode})", result["run"].get("tokens_per_s"),
          "tokens/s", flush=True)
    common.write_result(args.out, "minimal_pairs_gpu", result)
    from bertscope.probes.lens import fit_tuned_lens, masked_streams

    import bertscope

    mlm = bertscope.load(str(model), device=args.device)
    sentences = [*table["sentence_good"].iloc[:: 67][: 20 if args.small else 1000],
                 *table["sentence_bad"].iloc[:: 67][: 20 if args.small else 1000]]
    with common.Timer(args.device) as t_collect:
        streams = masked_streams(mlm, sentences, rate=0.15, seed=0, batch_size=256)
    with common.Timer(args.device) as t_fit:
        _, losses = fit_tuned_lens(mlm, streams, epochs=2 if args.small else 20)
    result["tuned_lens"] = {"sentences": len(sentences), "masked_positions": len(streams),
                            "collect_seconds": round(t_collect.seconds, 2), "fit_seconds": round(t_fit.seconds, 2),
                            "epochs": len(losses), "first_loss": losses[0], "last_loss": losses[-1]}
    print(f"tuned lens: {len(streams)} positions collected in {t_collect.seconds:.1f} s, {len(losses)} epochs in "
          f"{t_fit.seconds:.1f} s", flush=True)
    common.write_result(args.out, "minimal_pairs_gpu", result)
    sys.exit(0 if proc.returncode == 0 else 1)


if __name__ == "__main__":
    main()
