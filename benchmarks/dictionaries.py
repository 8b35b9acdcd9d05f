"""Targets of sparse dictionaries on the bundled model (docs/dictionaries.md): a TopK SAE at blocks.3.hook_resid_post
trained on UD English EWT train and scored on EWT dev, beside the same dictionary trained on a re-initialised model
and the PCA / neuron-basis controls at the same L0; optionally the other architectures (and an MLP transcoder) at
their own size.

    nice python benchmarks/dictionaries.py --tokens 2M --max-dev 1000 --out /tmp/dict-bench \\
        [--archs relu,batchtopk,jumprelu,transcoder --arch-width 1536 --arch-tokens 500k] [--markdown FILE]

Activations of the whole training corpus are computed once per model (one forward pass, kept in memory: about
0.35 GB for EWT train at one site) and every epoch reshuffles them (the trainer's in-memory mode); --cache DIR
keeps those rows between runs. Writes OUT/summary.csv, OUT/evaluation.csv, OUT/timing.json (wall and CPU seconds
of every stage) and, with --markdown, the tables docs/dictionaries.md shows (written from those numbers, with the
run's sizes). Needs
../shared/data/ud-english-ewt (or --train/--dev).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from benchutils import EWT, target_lines
from bertscope.experiments.corpus import load_corpus
from bertscope.experiments.dictionary import CorpusActivations, summary
from bertscope.probes.dictionary import (
    DictionaryConfig,
    TrainSettings,
    evaluate_dictionary,
    load_dictionary,
    neuron_topk_dictionary,
    pca_topk_dictionary,
    plain_rows,
    save_dictionary,
    train_dictionaries,
)

import bertscope

SITE = "blocks.3.hook_resid_post"
#: A transcoder reads block 3's MLP input (post-LN BERT: hook_resid_mid) and predicts its MLP output.
TRANSCODER_IN, TRANSCODER_OUT = "blocks.3.hook_resid_mid", "blocks.3.hook_mlp_out"
SPECIAL = ("special", "pad", "cls", "sep", "padding")
COLUMNS = ["dictionary", "l0", "explained_variance", "dead_fraction", "dense_fraction",
           "relative_reconstruction_bias", "spliced_embedding_cosine", "spliced_similarity_spearman",
           "recovered_vs_zero", "recovered_vs_mean"]


def _count(text: str) -> int:
    t = text.lower()
    return int(float(t[:-1]) * {"k": 1e3, "m": 1e6}[t[-1]]) if t[-1] in "km" else int(t)


class _Clock:
    """Wall and CPU seconds of named stages."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    def __call__(self, name: str):
        clock = self

        class _Stage:
            def __enter__(self):
                self.t, self.c = time.perf_counter(), time.process_time()

            def __exit__(self, *exc):
                clock.times[f"{name}_wall_s"] = round(time.perf_counter() - self.t, 1)
                clock.times[f"{name}_cpu_s"] = round(time.process_time() - self.c, 1)

        return _Stage()


def _kept(batch) -> torch.Tensor:
    return torch.from_numpy(~np.isin(np.asarray(batch.classes(), dtype=str), SPECIAL))


def _settings(args: argparse.Namespace, arch: str, tokens: int, main: bool) -> TrainSettings:
    return TrainSettings(tokens=tokens, batch_size=args.batch, buffer_rows=args.buffer,
                         lr=args.lr if main else (args.arch_lr or args.lr),
                         lr_warm_up_tokens=args.lr_warm_up, aux_coefficient=args.aux, exclude_classes=SPECIAL,
                         dead_tokens=200_000, l1_coefficient=args.l1, l1_warm_up_tokens=tokens // 20,
                         l0_coefficient=args.l0, l0_warm_up_tokens=tokens // 20, jumprelu_init_threshold=0.5,
                         seed=args.seed)


def _config(arch: str, width: int, k: int, model_name: str) -> DictionaryConfig:
    if arch == "transcoder":
        return DictionaryConfig(d_in=384, d_sae=width, arch="relu", kind="transcoder", site=TRANSCODER_IN,
                                site_out=TRANSCODER_OUT, metadata={"model": model_name})
    return DictionaryConfig(d_in=384, d_sae=width, arch=arch, k=k if arch in ("topk", "batchtopk") else None,
                            site=SITE, metadata={"model": model_name})


def run_model(args: argparse.Namespace, mname: str, model, train, dev_texts, clock: _Clock) -> list[pd.DataFrame]:
    """Train (or reload) and evaluate every dictionary of one model; returns their evaluation tables."""
    archs = ([] if args.no_main else ["topk"]) + ([a for a in args.archs.split(",") if a and a != "topk"]
                                                  if mname == "bundled" else [])
    sites = [SITE] + ([TRANSCODER_IN, TRANSCODER_OUT] if "transcoder" in archs else [])
    cached = args.cache / f"{mname}-train.pt" if args.cache is not None else None
    with clock(f"{mname}_forward"):
        if args.reuse:
            source = []
        elif cached is not None and cached.exists() and sites == [SITE]:  # rows of an earlier run's forward
            saved = torch.load(cached)
            source = [plain_rows({SITE: saved["x"]}, np.asarray(saved["classes"], dtype=object))]
        else:
            source = list(CorpusActivations(model, train, sites, batch_size=64))
            if cached is not None and not cached.exists():
                cached.parent.mkdir(parents=True, exist_ok=True)
                torch.save({"x": torch.cat([b.acts[SITE][_kept(b)] for b in source]),
                            "classes": [c for b in source for c in np.asarray(b.classes())[_kept(b).numpy()]]},
                           cached)
    clock.times[f"{mname}_train_tokens_unique"] = sum(int(_kept(b).sum()) for b in source)
    tables = []
    for arch in archs:
        main = arch == "topk"
        width = args.width if main else args.arch_width
        tokens = args.tokens if main else args.arch_tokens
        cfg = _config(arch, width, args.k, mname)
        name = f"{mname}/{arch}" if main else f"{mname}/{arch}-{width}"
        folder = args.out / name.replace("/", "-")
        if args.reuse:
            d = load_dictionary(folder)
        else:
            with clock(f"{mname}_{arch}_train"):
                d = train_dictionaries(source, cfg, _settings(args, cfg.arch, tokens, main))[cfg.site]
            cpu = clock.times[f"{mname}_{arch}_train_cpu_s"]
            clock.times[f"{mname}_{arch}_tokens"] = d.config.metadata["tokens_trained"]
            clock.times[f"{mname}_{arch}_epochs"] = d.config.metadata["epochs"]
            clock.times[f"{mname}_{arch}_tokens_per_cpu_s"] = round(d.config.metadata["tokens_trained"] / cpu)
            save_dictionary(d, folder)
        with clock(f"{mname}_{arch}_eval"):
            ev = evaluate_dictionary(model, d, dev_texts, objective="sentence")
        ev.insert(0, "dictionary", name)
        tables.append(ev)
        if main and not args.no_controls:
            x = torch.cat([b.acts[SITE][_kept(b)] for b in source])[:65536] if source else None
            for cname, make in (("pca", pca_topk_dictionary), ("neurons", neuron_topk_dictionary)):
                cfolder = args.out / f"{mname}-{cname}-top{args.k}"
                ctl = load_dictionary(cfolder) if args.reuse else make(x, args.k, site=SITE)
                if not args.reuse:
                    save_dictionary(ctl, cfolder)
                with clock(f"{mname}_{cname}_eval"):
                    ev = evaluate_dictionary(model, ctl, dev_texts, objective="sentence")
                ev.insert(0, "dictionary", f"{mname}/{cname}-top{args.k}")
                tables.append(ev)
    return tables


def markdown(summ: pd.DataFrame, table: pd.DataFrame, timing: dict, args: argparse.Namespace, n_dev: int) -> str:
    """The tables of docs/dictionaries.md, written from the numbers, with the run's sizes."""
    def fmt(v):
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    cols = [c for c in COLUMNS if c in summ]
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for _, r in summ.iterrows()]
    rec = table[(table.section == "reconstruction") & table.metric.isin(["explained_variance", "n_tokens"])]
    per = rec.pivot_table(index=["dictionary", "token_class"], columns="metric", values="value").reset_index()
    lines += ["", "| dictionary | token class | tokens | explained variance |", "| --- | --- | --- | --- |"]
    lines += [f"| {r.dictionary} | {r.token_class} | {int(r.n_tokens)} | {r.explained_variance:.3f} |"
              for r in per.itertuples()]
    flat = dict(timing)
    for part in timing.values():
        if isinstance(part, dict):
            flat = {**part, **flat}
    unique = flat.get("bundled_train_tokens_unique")
    trained = []
    for part in [timing] + [v for v in timing.values() if isinstance(v, dict)]:
        for key, value in part.items():
            if key.endswith("_epochs"):
                trained.append(f"{key[:-7].replace('_', '/', 1)} {part[key[:-7] + '_tokens']} tokens "
                               f"({value:.2f} epochs over {part[key.split('_')[0] + '_train_tokens_unique']} "
                               f"unique tokens, {part[key[:-7] + '_tokens_per_cpu_s']} tokens per CPU second)")
    sizes = [f"Sizes: training corpus {args.train_name} ({unique} non-special tokens on the bundled model)",
             "trained: " + ", ".join(sorted(set(trained))),
             f"TopK k = {args.k}, width {args.width}, batch {args.batch}, lr {args.lr}, "
             f"lr warm-up {args.lr_warm_up} tokens, AuxK coefficient {args.aux}, seed {args.seed}",
             f"scored on the first {n_dev} EWT dev sentences; controls fitted on the first 65,536 training tokens"]
    if args.archs != "topk":
        sizes.append(f"other architectures: width {args.arch_width}, lr {args.arch_lr or args.lr}, ReLU L1 {args.l1}, "
                     f"JumpReLU L0 {args.l0} (both warmed up over 5% of the tokens), the transcoder a ReLU one from "
                     f"{TRANSCODER_IN} to {TRANSCODER_OUT}")
    return "\n".join(lines) + "\n\n" + "; ".join(sizes) + ".\n\n" + targets(summ, args.k) + "\n"


def targets(summ: pd.DataFrame, k: int) -> str:
    """The issue's targets for the TopK dictionary of each model, met or not, from the summary's numbers."""
    out = ["| model | target | value | met |", "| --- | --- | --- | --- |"]
    rows = summ.set_index("dictionary")
    for mname in ("bundled", "reinitialised"):
        if f"{mname}/topk" not in rows.index:
            continue
        r = rows.loc[f"{mname}/topk"]
        pca = rows.loc[f"{mname}/pca-top{k}"] if f"{mname}/pca-top{k}" in rows.index else None
        out += target_lines(mname, r, pca, k, dead=("dead latents < 10%", "dead_fraction"))
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=_count, default=2_000_000)
    ap.add_argument("--archs", default="topk", help="comma list: relu,batchtopk,jumprelu,transcoder (bundled model)")
    ap.add_argument("--arch-width", type=int, default=1536)
    ap.add_argument("--arch-tokens", type=_count, default=500_000)
    ap.add_argument("--arch-lr", type=float, default=None, help="learning rate of the other architectures")
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--width", type=int, default=8 * 384)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--buffer", type=_count, default=262_144)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--lr-warm-up", type=_count, default=0)
    ap.add_argument("--aux", type=float, default=1.0)
    ap.add_argument("--l1", type=float, default=1.0)
    ap.add_argument("--l0", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train", default=str(EWT / "en_ewt-ud-train.conllu"))
    ap.add_argument("--dev", default=str(EWT / "en_ewt-ud-dev.conllu"))
    ap.add_argument("--max-dev", type=int, default=1000)
    ap.add_argument("--max-train", type=int, default=None, help="use the first N training sentences")
    ap.add_argument("--no-reinit", action="store_true")
    ap.add_argument("--only-reinit", action="store_true", help="just the re-initialised model")
    ap.add_argument("--no-controls", action="store_true")
    ap.add_argument("--no-main", action="store_true", help="only the other architectures (--archs)")
    ap.add_argument("--merge", nargs="+", default=None, metavar="OUT", help="no training: merge the tables of "
                    "earlier runs' OUT folders (give the same sizes options for --markdown)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reuse", action="store_true", help="evaluate dictionaries already saved in OUT (no training)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/dict-bench"))
    ap.add_argument("--markdown", type=Path, default=None, help="write the docs tables here")
    ap.add_argument("--cache", type=Path, default=None, help="keep (and reuse) each model's training rows here "
                    "(MODEL-train.pt: the non-special rows of one forward over --train)")
    args = ap.parse_args()
    args.train_name = Path(args.train).name
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    clock = _Clock()
    model = bertscope.load()
    if args.merge:
        args.no_reinit, args.only_reinit = True, True
    train = list(load_corpus(args.train, tokenizer=model.tokenizer))[: args.max_train]
    dev_texts = [s.text for s in load_corpus(args.dev, tokenizer=model.tokenizer)][: args.max_dev]
    models = {} if args.only_reinit else {"bundled": model}
    if not args.no_reinit:
        models["reinitialised"] = bertscope.random_encoder(model.config, seed=0, tokenizer=model.tokenizer)
    if args.merge:  # tables of several runs (e.g. the two models and the architectures run side by side)
        parts = []
        for d in args.merge:
            part, timing = pd.read_csv(Path(d) / "evaluation.csv"), json.loads((Path(d) / "timing.json").read_text())
            seen = set().union(*(set(p.dictionary) for p in parts)) if parts else set()
            for name in sorted(set(part.dictionary) & seen):  # the same dictionary at another size: name its tokens
                mname, arch = name.split("/")
                tag = timing.get(f"{mname}_{arch.split('-')[0]}_tokens", Path(d).name)
                part.loc[part.dictionary == name, "dictionary"] = f"{name}@{tag}"
            parts.append(part)
            clock.times[str(d)] = timing
        table = pd.concat(parts, ignore_index=True)
        models = {}
    tables = [table] if args.merge else []
    for mname, m in models.items():
        tables += run_model(args, mname, m, train, dev_texts, clock)
        (args.out / "timing.json").write_text(json.dumps(clock.times, indent=2))
    table = pd.concat(tables, ignore_index=True)
    table.to_csv(args.out / "evaluation.csv", index=False)
    summ = summary(table)
    summ.to_csv(args.out / "summary.csv", index=False)
    if not args.merge:
        clock.times["total_cpu_s"] = round(time.process_time(), 1)
    (args.out / "timing.json").write_text(json.dumps(clock.times, indent=2))
    print(summ[[c for c in COLUMNS if c in summ]].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(json.dumps(clock.times, indent=2))
    if args.markdown is not None:
        args.markdown.write_text(markdown(summ[[c for c in COLUMNS if c in summ]], table, clock.times, args,
                                          len(dev_texts)))


if __name__ == "__main__":
    main()
