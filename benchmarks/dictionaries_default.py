"""The default dictionary recipe (``bertscope.probes.dictionary.RECIPE``) on EWT dev against its PCA control, beside
SAELens's defaults (lr 3e-4, batch 4096) and the default with Gao et al.'s AuxK at the same tokens
(docs/dictionaries.md, "The default recipe").

    nice python benchmarks/dictionaries_default.py --tokens 200k --max-train 6000 --max-dev 200 \\
        --doc docs/dictionaries.md

Bundled model, ``blocks.3.hook_resid_post``; the training rows of the first ``--max-train`` EWT train sentences are
computed once (special tokens left out, as ``sae train`` does) and every epoch reshuffles them. The default
dictionary is ``TrainSettings(tokens=N)`` with every other setting at its default and the default architecture,
``k`` and width (what ``bertscope sae train --tokens N`` trains); the PCA control keeps the same L0 and is fitted on
the first 65,536 training rows (``sae train``'s controls). Each is scored on the first ``--max-dev`` EWT dev
sentences (reconstruction, and spliced into the model: embedding cosine). Writes OUT/summary.csv and, with
``--doc``, the generated block ``default`` of that file.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from benchutils import EWT, write_docs
from bertscope.experiments.corpus import load_corpus
from bertscope.experiments.dictionary import CorpusActivations, parse_width, summary
from bertscope.probes.dictionary import (
    RECIPE,
    DictionaryConfig,
    TrainSettings,
    architectures,
    evaluate_dictionary,
    pca_topk_dictionary,
    train_dictionaries,
)
from bertscope.probes.dictionary.architectures.kernels import GAO_AUX_COEFFICIENT, GAO_AUX_K
from bertscope.probes.dictionary.data import SPECIAL_CLASSES

import bertscope

SITE = "blocks.3.hook_resid_post"
#: SAELens's own defaults (its LanguageModelSAERunnerConfig: lr 3e-4, train_batch_size_tokens 4096)
SAELENS = {"lr": 3e-4, "batch_size": 4096}
#: Gao et al.'s AuxK as their code sets it (openai/sparse_autoencoder train.py: auxk 256, auxk_coef 1/32)
GAO = {"auxk": "gao", "aux_k": GAO_AUX_K, "aux_coefficient": GAO_AUX_COEFFICIENT}
COLUMNS = ["dictionary", "l0", "explained_variance", "dead_fraction", "spliced_embedding_cosine",
           "spliced_similarity_spearman", "recovered_vs_mean"]


def _count(text: str) -> int:
    t = text.lower()
    return int(float(t[:-1]) * {"k": 1e3, "m": 1e6}[t[-1]]) if t[-1] in "km" else int(t)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rows(model, sentences) -> list:
    """The training rows ``[{SITE: [rows, d]}]`` of ``sentences``, special tokens left out (one forward)."""
    out = []
    for b in CorpusActivations(model, sentences, [SITE], batch_size=64):
        keep = torch.from_numpy(~np.isin(b.classes(), list(SPECIAL_CLASSES)))
        out.append({SITE: b.acts[SITE][keep]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=_count, default=200_000)
    ap.add_argument("--max-train", type=int, default=6000, help="the first N EWT train sentences")
    ap.add_argument("--max-dev", type=int, default=200, help="the first N EWT dev sentences")
    ap.add_argument("--train", default=str(EWT / "en_ewt-ud-train.conllu"))
    ap.add_argument("--dev", default=str(EWT / "en_ewt-ud-dev.conllu"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("/tmp/dict-default"))
    ap.add_argument("--doc", type=Path, default=None, help="write the generated block into this markdown file")
    args = ap.parse_args()
    for p in (args.train, args.dev):
        if not Path(p).is_file():
            raise SystemExit(f"dictionaries_default: {p} not found (UD English EWT; see --train/--dev)")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    t0, c0 = time.perf_counter(), _cpu()
    model = bertscope.load().eval()
    train = list(load_corpus(args.train))[: args.max_train]
    dev = [s.text for s in list(load_corpus(args.dev))[: args.max_dev]]
    rows = _rows(model, train)
    n_rows = sum(len(r[SITE]) for r in rows)
    d_in = rows[0][SITE].shape[1]
    cfg = DictionaryConfig(d_in=d_in, d_sae=parse_width(RECIPE.width, d_in), arch=architectures.DEFAULT,
                           k=RECIPE.k, site=SITE)
    runs = {"default": TrainSettings(tokens=args.tokens, progress=False),
            "saelens-defaults": TrainSettings(tokens=args.tokens, progress=False, **SAELENS),
            # AuxK acts on latents dead for dead_tokens (200k by default, so never within a 200k-token run):
            # both conventions side by side with latents counted dead after a quarter of the run
            "default, dead after N/4, SAELens AuxK": TrainSettings(tokens=args.tokens, progress=False,
                                                                  dead_tokens=args.tokens // 4),
            "default, dead after N/4, Gao AuxK": TrainSettings(tokens=args.tokens, progress=False,
                                                              dead_tokens=args.tokens // 4, **GAO)}
    dicts, cpu = {}, {}
    for name, ts in runs.items():
        c = _cpu()
        dicts[name] = train_dictionaries(rows, cfg, ts)[SITE]
        cpu[name] = round(_cpu() - c)
    x = torch.cat([r[SITE] for r in rows])[:65536]
    dicts[f"pca-top{RECIPE.k}"] = pca_topk_dictionary(x, RECIPE.k, site=SITE)
    tables = []
    for name, d in dicts.items():
        ev = evaluate_dictionary(model, d, dev, objective="sentence")
        ev.insert(0, "dictionary", name)
        tables.append(ev)
    summ = summary(pd.concat(tables, ignore_index=True)).set_index("dictionary").loc[list(dicts)].reset_index()
    args.out.mkdir(parents=True, exist_ok=True)
    summ.to_csv(args.out / "summary.csv", index=False)
    a, b = dicts["default, dead after N/4, SAELens AuxK"], dicts["default, dead after N/4, Gao AuxK"]
    auxk_acted = not torch.equal(a.W_enc, b.W_enc)
    info = {"auxk_acted": auxk_acted,
            "tokens": args.tokens, "train_sentences": len(train), "train_rows": n_rows, "dev_sentences": len(dev),
            "train_cpu_s": cpu, "wall_s": round(time.perf_counter() - t0), "cpu_s": round(_cpu() - c0),
            "tokens_trained": {k: dicts[k].config.metadata.get("tokens_trained") for k in runs}}
    (args.out / "run.json").write_text(json.dumps(info, indent=1))
    text = block(summ, info, runs)
    print(text)
    if args.doc is not None:
        write_docs(args.doc, text, name="default")


def block(summ: pd.DataFrame, info: dict, runs: dict[str, TrainSettings]) -> str:
    """The generated markdown: sizes, the table, and whether the default beats PCA on both headline numbers."""
    d, s, g = runs["default"], runs["saelens-defaults"], runs["default, dead after N/4, Gao AuxK"]
    cols = [c for c in COLUMNS if c in summ]
    lines = ["", f"Written by `benchmarks/dictionaries_default.py` (bundled model, `{SITE}`): "
             f"{info['tokens']:,} training tokens ({info['tokens'] / info['train_rows']:.2f} epochs over the "
             f"{info['train_rows']:,} non-special tokens of the first {info['train_sentences']:,} EWT train "
             f"sentences), scored on the first {info['dev_sentences']} EWT dev sentences. `default`: "
             f"`TrainSettings(tokens={info['tokens']})` with the default architecture, k = {RECIPE.k}, width "
             f"{RECIPE.width}, lr {d.lr:g}, batch {d.batch_size} (`RECIPE`); `saelens-defaults`: the same with "
             f"lr {s.lr:g}, batch {s.batch_size}. AuxK acts only on latents silent for `dead_tokens` "
             f"({d.dead_tokens:,} by default, so never within the default run here); the two `dead after N/4` rows "
             f"count a latent dead after {g.dead_tokens:,} tokens, one with SAELens's AuxK (coefficient "
             f"{d.aux_coefficient:g}, the default), one with Gao et al.'s as their code sets it (`auxk=\"gao\"`, "
             f"{g.aux_k} dead latents, coefficient {g.aux_coefficient:g}). PCA-top{RECIPE.k} fitted on the first "
             f"{min(65536, info['train_rows']):,} training rows. Training CPU seconds: "
             + ", ".join(f"{k} {v}" for k, v in info["train_cpu_s"].items())
             + f"; whole run {info['cpu_s']} CPU s, one thread, niced on "
             "the shared 2-core machine.", "",
             "| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    for _, r in summ.iterrows():
        lines.append("| " + " | ".join(str(r[c]) if c == "dictionary" else f"{r[c]:.3f}" for c in cols) + " |")
    t = summ.set_index("dictionary")
    pca = t.loc[f"pca-top{RECIPE.k}"]
    for name in runs:
        r = t.loc[name]
        won = [m for m, ok in (("explained variance", r.explained_variance > pca.explained_variance),
                               ("spliced cosine", r.spliced_embedding_cosine > pca.spliced_embedding_cosine)) if ok]
        verdict = ("**beats PCA on both**" if len(won) == 2 else "**loses to PCA on both**" if not won
                   else f"beats PCA on {won[0]} only")
        lines.append("")
        lines.append(f"`{name}` against PCA-top{RECIPE.k}: explained variance {r.explained_variance:.3f} vs "
                     f"{pca.explained_variance:.3f}, spliced cosine {r.spliced_embedding_cosine:.3f} vs "
                     f"{pca.spliced_embedding_cosine:.3f}: {verdict}.")
    lines.append("")
    lines.append("The two AuxK conventions " + ("trained different dictionaries (some latents went dead, so AuxK "
                 "acted)." if info["auxk_acted"] else "trained identical dictionaries: no latent stayed silent for "
                 "the dead window, so AuxK never acted and this run does not compare them."))
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
