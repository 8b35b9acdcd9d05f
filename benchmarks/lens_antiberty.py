"""Logit lens and tuned lens on real masked-LM weights: AntiBERTy (``pip install antiberty==0.1.3``, BERT 8 x 512).

    python benchmarks/lens_antiberty.py [--train 80] [--test 40] [--docs]

Sequences are variants of trastuzumab's heavy and light chains (5% of residues replaced at random; no antibody
corpus is reachable here); the tuned lens is fitted on ``--train`` of them and every number is from the ``--test``
others (15% of residues masked). Prints per stream the KL to the final distribution, top-1 agreement and masked
accuracy of both lenses with 95% sentence-bootstrap intervals; ``--docs`` writes the table into ``docs/lens.md``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the AntiBERTy folder and the sequences are the tests' fixtures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=80)
    parser.add_argument("--test", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--docs", action="store_true", help="write the table into docs/lens.md")
    args = parser.parse_args()
    from bertscope.models import load
    from bertscope.probes.lens import fit_tuned_lens, lens_metrics, masked_streams
    from mlm_fixtures import antiberty_folder, antibody_variants

    with tempfile.TemporaryDirectory() as tmp:
        folder = antiberty_folder(tmp)
        if folder is None:
            sys.exit("antiberty is not installed: pip install antiberty==0.1.3")
        model = load(folder)
    start = time.perf_counter()
    train = masked_streams(model, antibody_variants(args.train, seed=0), seed=0)
    test = masked_streams(model, antibody_variants(args.test, seed=1), seed=1)
    collect_s = time.perf_counter() - start
    start = time.perf_counter()
    lens, losses = fit_tuned_lens(model, train, epochs=args.epochs, lr=1e-3)
    fit_s = time.perf_counter() - start
    table = pd.concat([lens_metrics(model, test), lens_metrics(model, test, lens)])

    def cell(lens_name: str, stream: int, measure: str) -> str:
        r = table[(table["lens"] == lens_name) & (table["stream"] == stream) & (table["measure"] == measure)].iloc[0]
        return f"{r['value']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"

    lines = [f"AntiBERTy (8 x 512), tuned lens fitted on {len(train)} masked residues of {args.train} variants "
             f"({args.epochs} epochs, {fit_s:.0f} s; streams collected in {collect_s:.0f} s), evaluated on "
             f"{len(test)} masked residues of {args.test} other variants; 95% intervals over sequences:", "",
             "| stream | KL logit | KL tuned | top-1 agreement logit | top-1 agreement tuned | masked accuracy logit "
             "| masked accuracy tuned |", "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for s in range(model.config.n_layers + 1):
        lines.append(f"| {s} | " + " | ".join(cell(lens_name, s, m) for m in ("kl_to_final", "top1_agreement",
                     "masked_accuracy") for lens_name in ("logit", "tuned")) + " |")  # fmt: skip
    text = "\n".join(lines)
    print(text)
    if args.docs:
        from benchutils import write_docs

        write_docs(ROOT / "docs" / "lens.md", text, name="antiberty-lens")


if __name__ == "__main__":
    main()
