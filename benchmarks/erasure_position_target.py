"""Why erasure's position probe reads about 0.5 where the positions experiment reads 0.99 (issue 40.9): the same
EWT sentences and model, three targets at ``embed.hook_out``, each read by a logistic probe and by erasure's
ridge probe.

    python benchmarks/erasure_position_target.py [--n-train 150] [--n-eval 80]

Prints: word vectors (mean of each word's pieces, as erasure collects them) -> word index (erasure's target,
20+ pooled); the same word vectors -> the position of the word's first piece; piece vectors -> the piece's own
position (the positions experiment's target); the majority class; the share of words whose index is their
first piece's position - 1. Needs UD English EWT (`corpus.ewt.find_ewt`).
"""

from __future__ import annotations

import argparse
import warnings
from types import SimpleNamespace

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-train", type=int, default=150)
    ap.add_argument("--n-eval", type=int, default=80)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    from bertscope.experiments.corpus import encode
    from bertscope.experiments.erasure import data, measures
    from sklearn.linear_model import LogisticRegression

    import bertscope

    model = bertscope.load().eval()
    pair = data.ewt_pair(SimpleNamespace(n_train=args.n_train, n_eval=args.n_eval))
    if pair is None:
        print("UD English EWT not found")
        return 1
    train = data.usable(pair[0], 3, 40)[: args.n_train]
    evaluate = data.usable(pair[1], 3, 40)[: args.n_eval]

    def vectors(sents: list) -> tuple:
        enc = encode(sents, model.tokenizer, max_length=128, batch_size=32)
        acts = measures.collect(model, enc, ["embed.hook_out"], [len(s) for s in sents], pieces_at=["embed.hook_out"])
        offsets = np.concatenate([[0], np.cumsum([len(s) for s in sents])])
        first = np.zeros(int(offsets[-1]), int)
        piece_pos = []
        for batch in enc:
            for r, si in enumerate(batch.sentence_index):
                w = batch.word_ids[r].numpy()
                real = np.flatnonzero(w >= 0)
                piece_pos += real.tolist()
                for p in real[::-1]:  # the last write is the word's first piece
                    first[offsets[si] + w[p]] = p
        index = np.array([min(i, 20) for s in sents for i in range(len(s))])
        return acts.words["embed.hook_out"], acts.pieces["embed.hook_out"], index, first, np.array(piece_pos)

    wt, pt, it, ft, qt = vectors(train)
    we, pe, ie, fe, qe = vectors(evaluate)

    def both(xt: np.ndarray, yt: np.ndarray, xe: np.ndarray, ye: np.ndarray) -> str:
        mu, sd = xt.mean(0), xt.std(0) + 1e-6
        logistic = LogisticRegression(C=1.0, max_iter=2000).fit((xt - mu) / sd, yt).predict((xe - mu) / sd)
        ridge = measures.fit_probe(xt, yt, alpha=1e-2).predict(xe)
        return f"logistic {np.mean(logistic == ye):.3f}, ridge (erasure's probe) {np.mean(ridge == ye):.3f}"

    print(f"word vectors -> word index: {both(wt, it, we, ie)}")
    print(f"word vectors -> first-piece position: {both(wt, np.minimum(ft, 21), we, np.minimum(fe, 21))}")
    if len(pt) == len(qt) and len(pe) == len(qe):
        print(f"piece vectors -> piece position: {both(pt, np.minimum(qt, 21), pe, np.minimum(qe, 21))}")
    print(f"majority class of word index: {np.mean(ie == np.bincount(it).argmax()):.3f}")
    print(f"words whose index is their first piece's position - 1: {np.mean(ie == np.minimum(fe - 1, 20)):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
