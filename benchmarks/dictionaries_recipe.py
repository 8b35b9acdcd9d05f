"""Recipe levers of a TopK SAE on cached rows (docs/dictionaries.md): learning rate, batch, warm-up, AuxK, width, k,
each trained on the bundled model's EWT-train rows at blocks.3.hook_resid_post and scored by explained variance and
dead latents on all EWT dev tokens (no splicing: cheap enough to sweep).

    nice python benchmarks/dictionaries_recipe.py --tokens 400k '{"lr": 3e-3, "batch_size": 1024}' '{"lr": 1e-3}'

Each JSON argument is one run: ``TrainSettings`` fields plus ``arch``, ``width``, ``k``. Rows come from
CACHE/MODEL-{train,dev}.pt (``{"x": [rows, 384], "classes": [...]}``, special tokens left out; the train file is the
one ``benchmarks/dictionaries.py --cache`` writes), computed once with a forward over EWT when missing. Prints one
JSON line per run (dev EV, L0, dead fraction on dev, CPU seconds, tokens per CPU second) and, with --markdown, a
table of them; ``--doc FILE`` writes that table, with the command that made it, into the generated block
``recipe-levers`` of FILE (docs/dictionaries.md's "Recipe levers"):

    nice python benchmarks/dictionaries_recipe.py --tokens 400k --doc docs/dictionaries.md \\
        '{"lr": 3e-4, "batch_size": 4096}' '{"lr": 1e-3, "batch_size": 1024}' '{"lr": 1e-3, "batch_size": 512}' \\
        '{"lr": 3e-3, "batch_size": 1024}' '{"lr": 5e-3, "batch_size": 1024}' \\
        '{"lr": 3e-3, "batch_size": 1024, "lr_warm_up_tokens": 40000}' '{"lr": 3e-3, "batch_size": 1024, "k": 64}'
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch
from benchutils import EWT, write_docs
from bertscope.probes.dictionary import DictionaryConfig, TrainSettings, train_dictionaries

SITE = "blocks.3.hook_resid_post"
SPECIAL = ("special", "pad", "cls", "sep", "padding")


def _count(text: str) -> int:
    t = text.lower()
    return int(float(t[:-1]) * {"k": 1e3, "m": 1e6}[t[-1]]) if t[-1] in "km" else int(t)


def rows(cache: Path, model_name: str, split: str) -> dict:
    """The non-special rows of one forward over EWT ``split`` (cached)."""
    path = cache / f"{model_name}-{split}.pt"
    if path.exists():
        return torch.load(path)
    from bertscope.experiments.corpus import load_corpus
    from bertscope.experiments.dictionary import CorpusActivations

    import bertscope

    model = bertscope.load()
    if model_name != "bundled":
        model = bertscope.random_encoder(model.config, seed=0, tokenizer=model.tokenizer)
    sentences = list(load_corpus(EWT / f"en_ewt-ud-{split}.conllu", tokenizer=model.tokenizer))
    xs, classes = [], []
    for b in CorpusActivations(model, sentences, [SITE], batch_size=64):
        keep = ~np.isin(np.asarray(b.classes(), dtype=str), SPECIAL)
        xs.append(b.acts[SITE][torch.from_numpy(keep)])
        classes.extend(np.asarray(b.classes())[keep].tolist())
    out = {"x": torch.cat(xs), "classes": classes}
    cache.mkdir(parents=True, exist_ok=True)
    torch.save(out, path)
    return out


def run(x: torch.Tensor, x_dev: torch.Tensor, tokens: int, spec: dict) -> dict:
    """Train one dictionary on ``x`` and score it on ``x_dev``."""
    spec = dict(spec)
    arch, width, k = spec.pop("arch", "topk"), spec.pop("width", 3072), spec.pop("k", 32)
    cfg = DictionaryConfig(x.shape[1], width, arch, k=k if "topk" in arch else None, site="x")
    c0 = time.process_time()
    d = train_dictionaries([x[i : i + 8192] for i in range(0, len(x), 8192)], cfg,
                           TrainSettings(tokens=tokens, progress=False, **spec))["x"]
    cpu = time.process_time() - c0
    with torch.no_grad():
        f = d.encode(x_dev)
        x_hat = d.decode(f, x_dev)
    ev = 1 - (x_dev - x_hat).pow(2).sum() / (x_dev - x_dev.mean(0)).pow(2).sum()
    return {"arch": arch, "width": width, "k": k, **spec, "tokens": tokens, "unique": len(x),
            "dev_ev": round(float(ev), 4), "dev_l0": round(float((f > 0).sum(-1).float().mean()), 2),
            "dead": round(float(((f > 0).sum(0) == 0).float().mean()), 4), "cpu_s": round(cpu, 1),
            "tok_per_cpu_s": round(tokens / cpu)}


def score(folders: list[Path], cache: Path) -> None:
    """Explained variance, L0 and dead latents of saved dictionaries (``benchmarks/dictionaries.py`` OUT folders:
    MODEL-ARCH sub-folders) on all EWT dev tokens of their model, as a markdown table."""
    from bertscope.probes.dictionary import is_dictionary, load_dictionary

    print("| dictionary | dev tokens | L0 | explained variance | dead on dev |\n| --- | --- | --- | --- | --- |")
    for folder in folders:
        for sub in sorted(p for p in folder.iterdir() if p.is_dir() and is_dictionary(p)):
            d = load_dictionary(sub)
            if d.config.site != SITE:
                continue  # transcoders read another site
            model_name = sub.name.split("-")[0]
            x_dev = rows(cache, model_name, "dev")["x"]
            with torch.no_grad():
                f = d.encode(x_dev)
                x_hat = d.decode(f, x_dev)
            ev = 1 - (x_dev - x_hat).pow(2).sum() / (x_dev - x_dev.mean(0)).pow(2).sum()
            tokens = d.config.metadata.get("tokens_trained")
            print(f"| {folder.name}/{sub.name}{f' ({tokens} tokens)' if tokens else ''} | {len(x_dev)} | "
                  f"{float((f > 0).sum(-1).float().mean()):.1f} | {float(ev):.3f} | "
                  f"{float(((f > 0).sum(0) == 0).float().mean()):.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", help="JSON: TrainSettings fields plus arch, width, k")
    ap.add_argument("--score", nargs="+", type=Path, default=None, metavar="OUT",
                    help="no training: score the dictionaries saved in benchmarks/dictionaries.py OUT folders")
    ap.add_argument("--tokens", type=_count, default=400_000)
    ap.add_argument("--model", default="bundled", choices=["bundled", "reinitialised"])
    ap.add_argument("--cache", type=Path, default=Path("/tmp/saefit"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--doc", type=Path, default=None, help="write the table into this file's recipe-levers block")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.score:
        score(args.score, args.cache)
        return
    x, x_dev = rows(args.cache, args.model, "train")["x"], rows(args.cache, args.model, "dev")["x"]
    results = []
    for spec in args.runs:
        results.append(run(x, x_dev, args.tokens, json.loads(spec)))
        print(json.dumps(results[-1]), flush=True)
    table = markdown(results)
    if args.markdown:
        print(table)
    if args.doc is not None:
        command = "nice python benchmarks/dictionaries_recipe.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        cpu = sum(r["cpu_s"] for r in results)
        text = (f"\nWritten by `{command}` ({args.model} model, {results[0]['unique']:,} EWT-train rows, "
                f"{len(x_dev):,} EWT dev rows; {cpu:.0f} CPU s of training, one thread, niced on the shared 2-core "
                f"machine). `settings`: each run's JSON (`TrainSettings` fields, `k`); everything else is TopK, "
                f"k = 32, width 3072 and `TrainSettings`' defaults; dev numbers on every non-special dev token, no "
                f"splice:\n\n{table}\n")
        write_docs(args.doc, text, name="recipe-levers")


#: the fields every run shares unless its JSON says otherwise (left out of the table's settings column)
FIXED = {"arch": "topk", "width": 3072, "k": 32}


def markdown(results: list[dict]) -> str:
    """The runs as a markdown table: settings, tokens (epochs), dev EV, dev L0, dead on dev, tokens per CPU s."""
    lines = ["| settings | tokens (epochs) | dev EV | dev L0 | dead on dev | tokens / CPU s |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        keys = {k: v for k, v in r.items() if k not in ("tokens", "unique", "dev_ev", "dev_l0", "dead", "cpu_s",
                                                        "tok_per_cpu_s") and FIXED.get(k) != v}
        lines.append(f"| `{json.dumps(keys)}` | {r['tokens']} ({r['tokens'] / r['unique']:.2f}) | {r['dev_ev']:.3f} | "
                     f"{r['dev_l0']:.1f} | {r['dead']:.3f} | {r['tok_per_cpu_s']} |")
    return "\n".join(lines)

if __name__ == "__main__":
    main()
