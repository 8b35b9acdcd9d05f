"""The default dictionary recipe (``bertscope.probes.dictionary.RECIPE``) on EWT dev against its PCA control, beside
SAELens's defaults (lr 3e-4, batch 4096) and the default with Gao et al.'s AuxK at the same tokens, and any saved
dictionaries (``--load``, e.g. the README command's ``sae train`` output), scored on all 2,001 EWT dev sentences
with sentence-bootstrap intervals and on STS-B dev (docs/dictionaries.md, "The default recipe").

    nice python benchmarks/dictionaries_default.py --tokens 200k --max-train 6000 \\
        --load "sae train 2M"=results/sae --doc docs/dictionaries.md

Bundled model, ``blocks.3.hook_resid_post``; the training rows of the first ``--max-train`` EWT train sentences are
computed once (special tokens left out, as ``sae train`` does) and every epoch reshuffles them. The default
dictionary is ``TrainSettings(tokens=N)`` with every other setting at its default and the default architecture,
``k`` and width (what ``bertscope sae train --tokens N`` trains); the PCA control keeps the same L0 and is fitted on
the first 65,536 training rows (``sae train``'s controls). ``--load NAME=FOLDER`` adds every dictionary of a folder
(a ``sae train`` output: the dictionary and its controls).

Each is scored on the first ``--max-dev`` EWT dev sentences (default all 2,001): reconstruction (explained
variance, L0, dead latents) on their non-special tokens, and spliced into the model at those tokens
(``spliced_embeddings``): the mean over sentences of the embedding cosine to the clean embedding, the fraction of
embedding loss recovered against mean ablation ``1 - (L_spliced - L_clean) / (L_mean - L_clean)`` with ``L`` the
embedding loss ``1 - cos`` the library's eval uses, and the Spearman correlation of all pairwise sentence cosines
with the clean ones. Intervals: 95% percentile bootstrap over sentences (``--boot`` resamples of the dev sentences
with replacement, the same resamples for every dictionary, so differences against PCA are paired); training is not
resampled. STS-B dev (``--stsb``): the Spearman correlation of each pair's cosine with the gold score, clean, with
the dictionary spliced in and with the site mean-ablated, bootstrapped over pairs. Writes OUT/summary.csv,
OUT/stsb.csv, OUT/run.json and, with ``--doc``, the generated block ``default`` of that file.
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from benchutils import EWT, write_docs
from bertscope.experiments.corpus import load_corpus
from bertscope.experiments.dictionary import CorpusActivations, parse_width
from bertscope.probes.bootstrap import group_bootstrap
from bertscope.probes.dictionary import (
    RECIPE,
    DictionaryConfig,
    TrainSettings,
    architectures,
    collect_activations,
    find_dictionaries,
    load_dictionary,
    pca_topk_dictionary,
    plain_rows,
    reconstruct,
    spliced_embeddings,
    train_dictionaries,
)
from bertscope.probes.dictionary.architectures.kernels import GAO_AUX_COEFFICIENT, GAO_AUX_K
from bertscope.probes.dictionary.data import SPECIAL_CLASSES
from scipy.stats import spearmanr

import bertscope

SITE = "blocks.3.hook_resid_post"
#: SAELens's own defaults (its LanguageModelSAERunnerConfig: lr 3e-4, train_batch_size_tokens 4096)
SAELENS = {"lr": 3e-4, "batch_size": 4096}
#: Gao et al.'s AuxK as their code sets it (openai/sparse_autoencoder train.py: auxk 256, auxk_coef 1/32)
GAO = {"auxk": "gao", "aux_k": GAO_AUX_K, "aux_coefficient": GAO_AUX_COEFFICIENT}
STSB = EWT.parent / "stsb-en" / "stsb-en-dev.csv"
#: the bootstrapped measures: column -> what the doc calls it
MEASURES = {"l0": "L0", "explained_variance": "explained variance", "spliced_embedding_cosine": "spliced cosine",
            "recovered_vs_mean": "loss recovered vs mean ablation", "recovered_vs_zero": "vs zero ablation"}


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


def dev_rows(model, texts: list[str]):
    """The non-special rows of ``texts`` at SITE, one plain-rows batch with each row's sentence index."""
    xs, classes, sentence = [], [], []
    for b in collect_activations(model, texts, [SITE], batch_size=32):
        keep = ~np.isin(b.classes(), list(SPECIAL_CLASSES))
        xs.append(b.acts[SITE][torch.from_numpy(keep)])
        classes.append(np.asarray(b.classes())[keep])
        sentence.append(np.asarray(b.sentence)[keep])
    return plain_rows({SITE: torch.cat(xs)}, np.concatenate(classes), np.concatenate(sentence))


def per_sentence(d, rows, n_sentences: int, emb: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Per-sentence sufficient statistics ``[n_sentences, ...]`` of one dictionary: token count, squared error,
    ``sum ||x||^2``, ``sum x``, active latents, and the embedding loss ``1 - cos(e_c, e_clean)`` per condition."""
    y, y_hat, f, _ = reconstruct(d, [rows])
    idx = torch.as_tensor(np.asarray(rows.sentence), dtype=torch.long)
    y, y_hat = y.double(), y_hat.double()

    def add(v: torch.Tensor) -> np.ndarray:
        out = torch.zeros((n_sentences, *v.shape[1:]), dtype=torch.float64)
        return out.index_add_(0, idx, v.double()).numpy()

    stats = {"n": add(torch.ones(len(y))), "sse": add((y - y_hat).pow(2).sum(-1)), "sq": add(y.pow(2).sum(-1)),
             "sum": add(y), "active": add((f > 0).sum(-1))}
    for c, e in emb.items():
        stats[f"loss_{c}"] = (1 - torch.nn.functional.cosine_similarity(e, emb["clean"], dim=-1)).numpy()
    stats["fires"] = ((f > 0).sum(0) > 0).numpy()
    return stats


def measures(st: dict[str, np.ndarray], counts: np.ndarray) -> np.ndarray:
    """``[m, len(MEASURES)]``: each measure under each row of sentence counts ``[m, n_sentences]``."""
    n = counts @ st["n"]
    mean_sq = (counts @ st["sum"]) ** 2
    total = counts @ st["sq"] - mean_sq.sum(-1) / n
    ev = 1 - (counts @ st["sse"]) / total
    sentences = counts.sum(-1)
    loss = {c: counts @ st[f"loss_{c}"] for c in ("clean", "dictionary", "zero", "mean")}
    cos = 1 - loss["dictionary"] / sentences
    rec = {a: 1 - (loss["dictionary"] - loss["clean"]) / (loss[a] - loss["clean"]) for a in ("mean", "zero")}
    return np.stack([(counts @ st["active"]) / n, ev, cos, rec["mean"], rec["zero"]], axis=-1)


def pair_spearman(emb: dict[str, torch.Tensor]) -> float:
    """Spearman of all pairwise sentence cosines with the dictionary spliced in against the clean ones."""
    unit = {c: torch.nn.functional.normalize(emb[c], dim=-1) for c in ("clean", "dictionary")}
    iu = torch.triu_indices(len(unit["clean"]), len(unit["clean"]), offset=1)
    sims = {c: (u @ u.T)[iu[0], iu[1]].numpy() for c, u in unit.items()}
    return float(spearmanr(sims["clean"], sims["dictionary"]).statistic)


def read_stsb(path: Path) -> tuple[list[str], list[str], np.ndarray]:
    """STS-B pairs ``(a, b, gold)`` from its header-less ``sentence1,sentence2,score`` csv."""
    with path.open(newline="") as fh:
        rows = [r for r in csv.reader(fh) if len(r) == 3]
    return [r[0] for r in rows], [r[1] for r in rows], np.array([float(r[2]) for r in rows])


def stsb_scores(model, d, a: list[str], b: list[str], conditions: tuple[str, ...], mean) -> dict[str, np.ndarray]:
    """Each STS-B pair's cosine per condition ``{condition: [pairs]}``, the site spliced at non-special tokens."""
    ea = spliced_embeddings(model, d, a, conditions=conditions, mean=mean)
    eb = spliced_embeddings(model, d, b, conditions=conditions, mean=mean)
    return {c: torch.nn.functional.cosine_similarity(ea[c], eb[c], dim=-1).numpy() for c in conditions}


def spearman_interval(score: np.ndarray, gold: np.ndarray, n_boot: int, seed: int = 0):
    """Spearman of ``score`` with ``gold`` and its percentile interval over pairs resampled with replacement."""
    def stat(counts: np.ndarray) -> np.ndarray:
        out = []
        for c in counts.astype(int):
            i = np.repeat(np.arange(len(gold)), c)
            out.append(spearmanr(score[i], gold[i]).statistic)
        return np.asarray(out)[:, None]

    return group_bootstrap(stat, len(gold), n_boot=n_boot, seed=seed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=_count, default=200_000)
    ap.add_argument("--max-train", type=int, default=6000, help="the first N EWT train sentences")
    ap.add_argument("--max-dev", type=int, default=0, help="the first N EWT dev sentences (0: all 2,001)")
    ap.add_argument("--train", default=str(EWT / "en_ewt-ud-train.conllu"))
    ap.add_argument("--dev", default=str(EWT / "en_ewt-ud-dev.conllu"))
    ap.add_argument("--stsb", default=str(STSB), help="STS-B dev csv ('' to skip)")
    ap.add_argument("--max-pairs", type=int, default=0, help="the first N STS-B pairs (0: all)")
    ap.add_argument("--load", action="append", default=[], metavar="NAME=FOLDER",
                    help="also score the dictionaries saved under FOLDER (a sae train output), named NAME/...")
    ap.add_argument("--boot", type=int, default=1000, help="bootstrap resamples (sentences; STS-B pairs)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("/tmp/dict-default"))
    ap.add_argument("--doc", type=Path, default=None, help="write the generated block into this markdown file")
    args = ap.parse_args()
    loads = [item.split("=", 1) for item in args.load]
    for p in [args.train, args.dev, *([args.stsb] if args.stsb else []), *(f for _, f in loads)]:
        if not Path(p).exists():
            raise SystemExit(f"dictionaries_default: {p} not found (UD English EWT / STS-B / --load)")
    if any(len(item) != 2 for item in loads):
        raise SystemExit("dictionaries_default: --load takes NAME=FOLDER")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    t0, c0 = time.perf_counter(), _cpu()
    model = bertscope.load().eval()
    train = list(load_corpus(args.train))[: args.max_train]
    dev = [s.text for s in list(load_corpus(args.dev))]
    dev = dev[: args.max_dev] if args.max_dev else dev
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
    a, b = dicts["default, dead after N/4, SAELens AuxK"], dicts["default, dead after N/4, Gao AuxK"]
    auxk_acted = not torch.equal(a.W_enc, b.W_enc)
    c_eval = _cpu()
    dev_batch = dev_rows(model, dev)
    stsb_a, stsb_b, gold = read_stsb(Path(args.stsb)) if args.stsb else ([], [], np.zeros(0))
    if args.max_pairs:
        stsb_a, stsb_b, gold = stsb_a[: args.max_pairs], stsb_b[: args.max_pairs], gold[: args.max_pairs]
    # the site's mean over the dev tokens: the same mean ablation for every dictionary
    mean = dev_batch.acts[SITE].double().mean(0).float()
    stats, spear, stsb, fixed, loaded = {}, {}, {}, {}, {}

    def scored():
        """The trained dictionaries, then the saved ones (read only now, after the others are scored)."""
        yield from list(dicts.items())
        for name, folder in loads:
            if (Path(folder) / "manifest.json").is_file() and not (Path(folder) / "training.json").is_file():
                raise SystemExit(f"dictionaries_default: {folder} is a sae train that has not finished")
            for sub, path in find_dictionaries(folder).items():
                d = load_dictionary(path)
                if d.config.site == SITE and not d.config.site_out:
                    dicts[f"{name}: {sub}"] = loaded[f"{name}: {sub}"] = d
                    yield f"{name}: {sub}", d

    for i, (name, d) in enumerate(scored()):
        # clean and the ablations do not depend on the dictionary: computed once, with the first one
        emb = spliced_embeddings(model, d, dev, conditions=("dictionary",) if fixed else
                                 ("clean", "dictionary", "zero", "mean"), mean=mean)
        fixed = fixed or {c: e for c, e in emb.items() if c != "dictionary"}
        emb |= fixed
        stats[name] = per_sentence(d, dev_batch, len(dev), emb)
        spear[name] = pair_spearman(emb)
        if len(gold):
            stsb[name] = stsb_scores(model, d, stsb_a, stsb_b, ("clean", "dictionary", "mean") if i == 0
                                     else ("dictionary",), mean)
    summ, paired = summarise(stats, spear, args.boot, f"pca-top{RECIPE.k}")
    stsb_rows = []
    if len(gold):
        first = next(iter(stsb.values()))
        base = {"clean (no splice)": first["clean"], "site mean-ablated": first["mean"]}
        for label, score in [*base.items(), *((n, v["dictionary"]) for n, v in stsb.items())]:
            iv = spearman_interval(score, gold, args.boot)
            stsb_rows.append({"condition": label, "stsb_spearman": float(iv.value[0]), "low": float(iv.low[0]),
                              "high": float(iv.high[0])})
    args.out.mkdir(parents=True, exist_ok=True)
    summ.to_csv(args.out / "summary.csv", index=False)
    pd.DataFrame(stsb_rows).to_csv(args.out / "stsb.csv", index=False)
    info = {"auxk_acted": auxk_acted, "tokens": args.tokens, "train_sentences": len(train), "train_rows": n_rows,
            "dev_sentences": len(dev), "dev_tokens": int(len(dev_batch.acts[SITE])), "stsb_pairs": int(len(gold)),
            "boot": args.boot, "train_cpu_s": cpu, "eval_cpu_s": round(_cpu() - c_eval),
            "wall_s": round(time.perf_counter() - t0), "cpu_s": round(_cpu() - c0),
            "loaded": {n: {k: d.config.metadata.get(k) for k in ("tokens_trained", "epochs")}
                       for n, d in loaded.items()},
            "tokens_trained": {k: dicts[k].config.metadata.get("tokens_trained") for k in runs}}
    (args.out / "run.json").write_text(json.dumps(info, indent=1))
    text = block(summ, paired, stsb_rows, info, runs, loads)
    print(text)
    if args.doc is not None:
        write_docs(args.doc, text, name="default")


def summarise(stats: dict, spear: dict, n_boot: int, pca: str) -> tuple[pd.DataFrame, dict]:
    """One row per dictionary (each measure with its interval, dead latents on all dev tokens, the pairwise
    Spearman), and per dictionary the paired differences against ``pca`` (explained variance, spliced cosine)."""
    out, paired = [], {}
    n_sent = len(next(iter(stats.values()))["n"])
    for name, st in stats.items():
        iv = group_bootstrap(lambda c, st=st: measures(st, c), n_sent, n_boot=n_boot, seed=0)
        row = {"dictionary": name}
        for j, m in enumerate(MEASURES):
            row |= {m: iv.value[j], f"{m}_low": iv.low[j], f"{m}_high": iv.high[j]}
        row |= {"dead_fraction": float(1 - st["fires"].mean()), "similarity_spearman": spear[name]}
        out.append(row)
        if name != pca:
            diff = group_bootstrap(lambda c, st=st: measures(st, c)[:, 1:3] - measures(stats[pca], c)[:, 1:3],
                                   n_sent, n_boot=n_boot, seed=0)  # the same resamples: a paired difference
            paired[name] = diff
    return pd.DataFrame(out), paired


def _iv(r, m: str) -> str:
    return f"{r[m]:.3f} [{r[m + '_low']:.3f}, {r[m + '_high']:.3f}]"


def block(summ: pd.DataFrame, paired: dict, stsb_rows: list[dict], info: dict, runs: dict[str, TrainSettings],
          loads: list) -> str:
    """The generated markdown: sizes, the tables, and whether each dictionary beats PCA on both headline numbers."""
    d, s, g = runs["default"], runs["saelens-defaults"], runs["default, dead after N/4, Gao AuxK"]
    pca_name = f"pca-top{RECIPE.k}"
    loaded = "".join(f"; `{n}: ...`: the dictionaries saved under `{f}` (loaded, not trained here: "
                     + ", ".join(f"`{k}` {v['tokens_trained']:,} tokens ({v['epochs'] or 0:.2f} epochs)"
                                 for k, v in info["loaded"].items() if k.startswith(f"{n}: ") and v["tokens_trained"])
                     + ")" for n, f in loads)
    lines = ["", f"Written by `benchmarks/dictionaries_default.py` (bundled model, `{SITE}`): trained on "
             f"{info['tokens']:,} tokens ({info['tokens'] / info['train_rows']:.2f} epochs over the "
             f"{info['train_rows']:,} non-special tokens of the first {info['train_sentences']:,} EWT train "
             f"sentences), scored on **all {info['dev_sentences']:,} EWT dev sentences** ({info['dev_tokens']:,} "
             f"non-special tokens). `default`: `TrainSettings(tokens={info['tokens']})` with the default architecture, "
             f"k = {RECIPE.k}, width {RECIPE.width}, lr {d.lr:g}, batch {d.batch_size} (`RECIPE`); `saelens-defaults`: "
             f"the same with lr {s.lr:g}, batch {s.batch_size}. AuxK acts only on latents silent for `dead_tokens` "
             f"({d.dead_tokens:,} by default, so never within the default run here); the two `dead after N/4` rows "
             f"count a latent dead after {g.dead_tokens:,} tokens, one with SAELens's AuxK (coefficient "
             f"{d.aux_coefficient:g}, the default), one with Gao et al.'s as their code sets it (`auxk=\"gao\"`, "
             f"{g.aux_k} dead latents, coefficient {g.aux_coefficient:g}). `{pca_name}` fitted on the first "
             f"{min(65536, info['train_rows']):,} training rows{loaded}. Training CPU seconds: "
             + ", ".join(f"{k} {v}" for k, v in info["train_cpu_s"].items())
             + f"; scoring {info['eval_cpu_s']} CPU s; whole run {info['cpu_s']} CPU s ({info['wall_s']} s wall), "
             "one thread, niced on the shared 2-core machine.", "",
             f"Brackets: 95% percentile intervals over {info['boot']:,} bootstrap resamples of the dev sentences "
             "(sentences drawn with replacement, every token of a drawn sentence kept; the same resamples for "
             "every row; training is not resampled). `recovered vs mean` is the fraction of embedding loss "
             "recovered against mean ablation, `1 - (L_spliced - L_clean) / (L_mean - L_clean)`, with `L` the "
             "embedding loss `1 - cos(e, e_clean)` of each sentence's mean-pooled embedding averaged over "
             "sentences (the `embedding_loss` of `sae eval`; `L_clean` = 0) and `L_mean` that of the site replaced "
             "by its mean over the dev tokens at the same positions; `vs zero` the same against zero ablation. "
             "`dead` counts latents that never fire on all the dev tokens; `pairwise Spearman` is the Spearman "
             "correlation of all pairwise dev-sentence cosines, spliced against clean (no interval).", "",
             "| dictionary | L0 | explained variance | dead | spliced cosine | recovered vs mean | vs zero | "
             "pairwise Spearman |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for _, r in summ.iterrows():
        lines.append(f"| {r.dictionary} | {r.l0:.1f} | {_iv(r, 'explained_variance')} | {r.dead_fraction:.3f} | "
                     f"{_iv(r, 'spliced_embedding_cosine')} | {_iv(r, 'recovered_vs_mean')} | "
                     f"{r.recovered_vs_zero:.3f} | {r.similarity_spearman:.3f} |")
    t = summ.set_index("dictionary")
    pca = t.loc[pca_name]
    lines.append("")
    for name, diff in paired.items():
        r = t.loc[name]
        won = [m for j, m in enumerate(("explained variance", "spliced cosine")) if diff.low[j] > 0]
        lost = [m for j, m in enumerate(("explained variance", "spliced cosine")) if diff.high[j] < 0]
        verdict = ("**beats PCA on both**" if len(won) == 2 else "**loses to PCA on both**" if len(lost) == 2
                   else "beats PCA on " + " and ".join(won) if won else "no clear difference from PCA")
        lines.append(f"- `{name}` against `{pca_name}`: explained variance {r.explained_variance:.3f} vs "
                     f"{pca.explained_variance:.3f} (difference {diff.value[0]:+.3f} [{diff.low[0]:+.3f}, "
                     f"{diff.high[0]:+.3f}]), spliced cosine {r.spliced_embedding_cosine:.3f} vs "
                     f"{pca.spliced_embedding_cosine:.3f} ({diff.value[1]:+.3f} [{diff.low[1]:+.3f}, "
                     f"{diff.high[1]:+.3f}]): {verdict}.")
    lines.append("")
    lines.append("Differences are paired (the same sentence resamples for both rows); \"beats\" means the whole "
                 "interval of the difference lies above 0.")
    if stsb_rows:
        lines += ["", f"STS-B dev ({info['stsb_pairs']:,} pairs, `../shared/data/stsb-en/stsb-en-dev.csv`): "
                  "the Spearman correlation of each pair's cosine (`bertscope.similarity`'s mean-pooled embedding, "
                  "the site spliced at the non-special tokens of both sentences) with the gold score; brackets: "
                  f"95% intervals over {info['boot']:,} resamples of the pairs.", "",
                  "| condition | STS-B Spearman |", "| --- | --- |"]
        for r in stsb_rows:
            lines.append(f"| {r['condition']} | {r['stsb_spearman']:.3f} [{r['low']:.3f}, {r['high']:.3f}] |")
    lines.append("")
    lines.append("The two AuxK conventions " + ("trained different dictionaries (some latents went dead, so AuxK "
                 "acted)." if info["auxk_acted"] else "trained identical dictionaries: no latent stayed silent for "
                 "the dead window, so AuxK never acted and this run does not compare them."))
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
