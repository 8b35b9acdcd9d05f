"""Targets of sparse dictionaries on the bundled model (docs/dictionaries.md): a TopK SAE at blocks.3.hook_resid_post
trained on UD English EWT train and scored on EWT dev, beside the same dictionary trained on a re-initialised model
and the PCA / neuron-basis controls at the same L0; optionally the other architectures.

    nice python benchmarks/dictionaries.py --tokens 1M --out /tmp/dict-bench [--archs topk,relu,jumprelu,batchtopk]

Prints a markdown table (and writes OUT/summary.csv, OUT/evaluation.csv, OUT/timing.json). Needs
../shared/data/ud-english-ewt (or --train/--dev). Activations are computed once per model and kept in memory
(about 0.3 GB for EWT train at one site).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from bertscope.experiments.corpus import load_corpus
from bertscope.experiments.sae import CorpusActivations, summary
from bertscope.probes.dictionary import (
    DictionaryConfig,
    TrainSettings,
    evaluate_dictionary,
    load_dictionary,
    neuron_topk_dictionary,
    pca_topk_dictionary,
    save_dictionary,
    train_dictionaries,
)

import bertscope

_ROOT = Path(__file__).resolve().parents[1]
_UD = ("shared", "data", "ud-english-ewt")
EWT = next((p.joinpath(*_UD) for p in (_ROOT.parent, _ROOT.parent.parent) if p.joinpath(*_UD).is_dir()),
           _ROOT.parent.joinpath(*_UD))
SITE = "blocks.3.hook_resid_post"
SPECIAL = ("special", "pad", "cls", "sep", "padding")


def _count(text: str) -> int:
    t = text.lower()
    return int(float(t[:-1]) * {"k": 1e3, "m": 1e6}[t[-1]]) if t[-1] in "km" else int(t)


def collect(model, sentences, batch_size: int) -> list:
    """Training rows in memory: one ActivationBatch per forward batch (special tokens dropped by the trainer)."""
    return list(CorpusActivations(model, sentences, [SITE], batch_size=batch_size))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=_count, default=1_000_000)
    ap.add_argument("--archs", default="topk")
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--width", type=int, default=8 * 384)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--train", default=str(EWT / "en_ewt-ud-train.conllu"))
    ap.add_argument("--dev", default=str(EWT / "en_ewt-ud-dev.conllu"))
    ap.add_argument("--max-dev", type=int, default=2001)
    ap.add_argument("--no-reinit", action="store_true")
    ap.add_argument("--only-reinit", action="store_true", help="just the re-initialised model (run beside another)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reuse", action="store_true", help="evaluate dictionaries already saved in OUT (no training)")
    ap.add_argument("--max-train", type=int, default=None, help="use the first N training sentences")
    ap.add_argument("--out", type=Path, default=Path("/tmp/dict-bench"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    model = bertscope.load()
    train = list(load_corpus(args.train, tokenizer=model.tokenizer))[: args.max_train]
    dev_texts = [s.text for s in load_corpus(args.dev, tokenizer=model.tokenizer)][: args.max_dev]
    models = {} if args.only_reinit else {"bundled": model}
    if not args.no_reinit:
        reinit = bertscope.random_encoder(model.config, seed=0, tokenizer=model.tokenizer)
        models["reinitialised"] = reinit
    timing, tables = {}, []
    for mname, m in models.items():
        t0 = time.perf_counter()
        source = collect(m, train, 64)
        timing[f"{mname}_forward_s"] = time.perf_counter() - t0
        n_rows = sum(int((~torch.from_numpy(__import__("numpy").isin(b.classes(), SPECIAL))).sum()) for b in source)
        timing[f"{mname}_train_tokens_available"] = n_rows
        archs = args.archs.split(",") if mname == "bundled" else ["topk"]
        for arch in archs:
            cfg = DictionaryConfig(d_in=384, d_sae=args.width, arch=arch,
                                   k=args.k if arch in ("topk", "batchtopk") else None, site=SITE,
                                   metadata={"model": mname})
            st = TrainSettings(tokens=args.tokens, batch_size=args.batch, buffer_rows=65536, lr=args.lr,
                               exclude_classes=SPECIAL, dead_tokens=200_000, l1_coefficient=1.0,
                               l1_warm_up_tokens=args.tokens // 20, l0_coefficient=0.05,
                               jumprelu_init_threshold=0.5)
            t0 = time.perf_counter()
            if args.reuse:
                d = load_dictionary(args.out / f"{mname}-{arch}")
            else:
                d = train_dictionaries(source, cfg, st)[SITE]
                secs = time.perf_counter() - t0
                timing[f"{mname}_{arch}_train_s"] = secs
                timing[f"{mname}_{arch}_tokens_per_s"] = d.config.metadata["tokens_trained"] / secs
                save_dictionary(d, args.out / f"{mname}-{arch}")
            ev = evaluate_dictionary(m, d, dev_texts, objective="sentence")
            ev.insert(0, "dictionary", f"{mname}/{arch}")
            tables.append(ev)
            if arch == args.archs.split(",")[0]:
                x = torch.cat([b.acts[SITE][torch.from_numpy(~__import__("numpy").isin(b.classes(), SPECIAL))]
                               for b in source])[:65536]
                l0 = d.config.k if arch in ("topk", "batchtopk") else None
                if l0 is not None:
                    for name, ctl in (("pca", pca_topk_dictionary(x, l0, site=SITE)),
                                      ("neurons", neuron_topk_dictionary(x, l0, site=SITE))):
                        ev = evaluate_dictionary(m, ctl, dev_texts, objective="sentence")
                        ev.insert(0, "dictionary", f"{mname}/{name}-top{l0}")
                        tables.append(ev)
            if not args.reuse:
                (args.out / "timing.json").write_text(json.dumps(timing, indent=2))
        del source
    import pandas as pd

    table = pd.concat(tables, ignore_index=True)
    table.to_csv(args.out / "evaluation.csv", index=False)
    summ = summary(table)
    summ.to_csv(args.out / "summary.csv", index=False)
    (args.out / "timing.json").write_text(json.dumps(timing, indent=2))
    cols = ["dictionary", "l0", "explained_variance", "dead_fraction", "spliced_embedding_cosine",
            "spliced_similarity_spearman", "recovered_vs_zero", "recovered_vs_mean"]
    print(summ[[c for c in cols if c in summ]].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    per_class = table[(table.section == "reconstruction") & (table.metric.isin(["explained_variance", "n_tokens"]))]
    print(per_class.pivot_table(index=["dictionary", "token_class"], columns="metric", values="value").to_string(
        float_format=lambda v: f"{v:.4f}"))
    print(json.dumps(timing, indent=2))


if __name__ == "__main__":
    main()
