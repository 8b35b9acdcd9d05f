"""STS-B dev anchor and speed of ``bertscope.similarity`` (issue 41, item 1 and the speed targets).

    python benchmarks/similarity_stsb.py [--pairs 1500] [--ij-pairs 3] [--docs docs/similarity.md]

1. The model's own embedding (last block, mean pooling, cosine) on ``../shared/data/stsb-en/stsb-en-dev.csv``:
   Spearman against the gold scores, beside transformers' ``BertModel`` with mean pooling over the attention mask,
   max length 256 (the README's anchor, 0.8672). The STS Benchmark test split is not in the shared data (on
   purpose), so MTEB's 0.8203 cannot be checked here; whoever holds it runs the same code on it with ``--file``
   (any pairs file the experiment reads: MTEB's ``test.jsonl.gz`` of ``mteb/stsbenchmark-sts``, the original
   ``sts-test.csv`` converted to sentence 1, sentence 2, score, ...), e.g.
   ``python benchmarks/similarity_stsb.py --file test.jsonl.gz --pairs 0 --ij-pairs 0 --skip-transformers``.
2. The ``benchmark`` computation: every site (each block's ``hook_resid_post``) x pooling (mean, cls, max), one
   forward pass per batch, timed (target < 60 s for 1,500 pairs on 2 cores).
3. Integrated Jacobians for one pair at 50 steps, timed (target < 1 s) on a seeded random sample of the pairs, at
   the default block and at block 0's input, and their completeness error.

Times depend on the machine's load: the load average is printed beside them, with the process's CPU seconds
(``time.process_time``, all threads). The run sets ``OMP_WAIT_POLICY=PASSIVE`` (unless set; OpenMP threads that
spin-wait for a descheduled partner made every small operation ~20x slower on the shared 2 cores) and glibc's
malloc to keep freed memory (``keep_freed_memory``, what the ``bertscope`` command does at start; each large tensor
otherwise faults fresh pages in). Integrated Jacobians are timed after one untimed warm-up call.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts its OpenMP threads

import argparse  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEV = ROOT.parent / "shared" / "data" / "stsb-en" / "stsb-en-dev.csv"


def read_pairs(path: Path, n: int) -> tuple[list[str], list[str], list[float]]:
    """The first ``n`` pairs of ``path`` (all when ``n`` is 0), read by the similarity experiment's pairs reader
    (CSV/TSV with or without a header, JSONL, gzip)."""
    from bertscope.experiments.corpus.pairs import read_pairs as read
    from bertscope.experiments.similarity.experiment import PAIRS

    frame = read(path, PAIRS, max_rows=n or None).frame
    return list(frame.a), list(frame.b), [float(x) for x in frame.score]


@torch.no_grad()
def transformers_spearman(a: list[str], b: list[str], gold: list[float]) -> float:
    """transformers ``BertModel``, mean pooling over the attention mask, max length 256, cosine."""
    from bertscope.models.loading import resolve_source
    from transformers import AutoTokenizer, BertModel

    folder = resolve_source(None)
    tok = AutoTokenizer.from_pretrained(folder)
    model = BertModel.from_pretrained(folder).eval()

    def emb(texts: list[str]) -> torch.Tensor:
        out = []
        for i in range(0, len(texts), 64):
            enc = tok(texts[i:i + 64], padding=True, truncation=True, max_length=256, return_tensors="pt")
            h = model(**enc).last_hidden_state
            m = enc["attention_mask"][..., None].float()
            out.append((h * m).sum(1) / m.sum(1).clamp_min(1e-9))
        return torch.cat(out)

    cos = torch.nn.functional.cosine_similarity(emb(a), emb(b), dim=-1)
    return float(spearmanr(cos.numpy(), gold).statistic)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, default=DEV, help="the pairs file (default STS-B dev)")
    parser.add_argument("--pairs", type=int, default=1500, help="the first N pairs (0: all)")
    parser.add_argument("--ij-pairs", type=int, default=3, help="pairs timed for integrated Jacobians (a seeded "
                        "random sample of the file's pairs, the same for both blocks)")
    parser.add_argument("--docs", type=Path, default=None, help="write the numbers into this markdown file")
    parser.add_argument("--skip-transformers", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    from bertscope.experiments.capture.allocator import keep_freed_memory

    import bertscope
    from bertscope import similarity as S

    keep_freed_memory()

    a, b, gold = read_pairs(args.file, args.pairs)
    model = bertscope.load().eval()
    name = "STS-B dev" if args.file == DEV else args.file.name
    lines = [f"{name}, {len(a)} pairs, {torch.get_num_threads()} threads, OMP_WAIT_POLICY="
             f"{os.environ['OMP_WAIT_POLICY']}, load average at start {os.getloadavg()[0]:.1f}", ""]  # fmt: skip

    sites = [f"blocks.{L}.hook_resid_post" for L in range(model.config.n_layers)]
    t0, c0, load0 = time.perf_counter(), time.process_time(), os.getloadavg()[0]
    texts = a + b
    embs = S.embed(model, texts, pooling=S.POOLINGS, sites=sites)
    rows = []
    for (site, how), e in embs.items():
        cos = S.score(e[: len(a)], e[len(a):])
        rows.append((site, how, float(spearmanr(cos.numpy(), gold).statistic)))
    t_bench, c_bench = time.perf_counter() - t0, time.process_time() - c0
    own = next(r[2] for r in rows if r[0] == S.final_site(model) and r[1] == "mean")
    lines.append(f"- bertscope, model's own embedding (last block, mean, cosine): Spearman **{own:.4f}**")
    if not args.skip_transformers:
        ref = transformers_spearman(a, b, gold)
        lines.append(f"- transformers BertModel, mean pooling, max length 256: Spearman {ref:.4f} "
                     f"(|difference| {abs(own - ref):.1e}; anchor 0.8672)")  # fmt: skip
    met = "met" if t_bench < 60 else "not met"
    lines.append(f"- every site x pooling ({len(rows)} rows, {len(set(texts))} distinct texts) in {t_bench:.1f} s "
                 f"wall, {c_bench:.1f} CPU-s (target < 60 s: {met}; load average {load0:.1f} before, "
                 f"{os.getloadavg()[0]:.1f} after)")  # fmt: skip
    lines += ["", "| site | mean | cls | max |", "|---|---|---|---|"]
    for site in sites:
        vals = {how: sp for s, how, sp in rows if s == site}
        lines.append(f"| {site} | {vals['mean']:.4f} | {vals['cls']:.4f} | {vals['max']:.4f} |")

    from bertscope.hooks.similarity.methods import xsbert_layer

    default = xsbert_layer(model.config.n_layers)
    sample = sorted(np.random.default_rng(0).choice(len(a), size=min(args.ij_pairs, len(a)), replace=False).tolist())
    if args.ij_pairs > 0:
        S.attribute(model, a[0], b[0], method="integrated-jacobians", steps=2)  # warm-up (first vmap call), untimed
        lines.append("")
    for layer, label in ((default, f"block {default}'s input (the default: xsbert's depth)"),
                         (0, "block 0's input (the embedding output)")) if args.ij_pairs > 0 else ():
        times, cpu, errors, pieces = [], [], [], []
        load1 = os.getloadavg()[0]
        for i in sample:
            t, c = time.perf_counter(), time.process_time()
            r = S.attribute(model, a[i], b[i], method="integrated-jacobians", steps=50, layer=layer)
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
            errors.append(abs(r.error) / max(abs(r.score), 1e-12))
            pieces.append(f"{len(r.tokens_a)}+{len(r.tokens_b)}")
        wall = sorted(times)[len(times) // 2]
        lines.append(f"- integrated Jacobians, one pair, 50 steps (Simpson), {label}, {len(times)} random "
                     f"pairs (pieces {', '.join(pieces)}): median {wall:.2f} s wall (slowest {max(times):.2f} s), "
                     f"{sorted(cpu)[len(cpu) // 2]:.2f} CPU-s (target < 1 s: {'met' if wall < 1 else 'not met'}; "
                     f"load average {load1:.1f} before, {os.getloadavg()[0]:.1f} after); |error| / |score| up to "
                     f"{max(errors):.1e}")  # fmt: skip
    text = "\n".join(lines)
    print(text)
    if args.docs:
        from benchutils import write_docs

        write_docs(args.docs, text, "stsb")


if __name__ == "__main__":
    main()
