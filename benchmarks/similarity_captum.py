"""Integrated Jacobians: ``bertscope.similarity`` against Captum's ``LayerIntegratedGradients`` driven by hand
(issue 41's comparison script).

    python benchmarks/similarity_captum.py [--pairs 2] [--steps 50]

By hand with Captum: for each side and each embedding dimension d, ``LayerIntegratedGradients`` of ``phi_d`` (the
normalised mean-pooled embedding) at the embedding output, from the xsbert reference ids, with Captum's
``riemann_right`` points (the same ``1/N, ..., 1`` as xsbert's), summed over d_model: that is row d of ``P``; the
pair matrix is ``P_a^T P_b``. ``d_embedding`` Captum calls per side (384 for the bundled model), each ``steps``
forward and backward passes, against bertscope's forward-mode ``tokens x steps`` passes. Prints both times
(pairs per second), the largest difference between the two matrices, and the load average.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from similarity_stsb import DEV, read_pairs


def captum_matrix(model, text_a: str, text_b: str, steps: int) -> torch.Tensor:
    from bertscope.hooks.similarity import pairs
    from bertscope.hooks.similarity.pooling import normalise, pool
    from captum.attr import LayerIntegratedGradients

    ps = []
    for text in (text_a, text_b):
        s = pairs.side(model, [text])
        ref = pairs.reference_ids(model, s)

        def forward(ids, mask=s.mask):
            m = mask.expand(ids.shape[0], -1)
            return normalise(pool(model(ids, m), m, "mean"), "cosine")

        lig = LayerIntegratedGradients(forward, model.embed)
        dims = forward(s.ids).shape[-1]
        rows = [lig.attribute(s.ids, baselines=ref, target=d, n_steps=steps, method="riemann_right",
                              internal_batch_size=steps)[0].sum(-1) for d in range(dims)]  # fmt: skip
        ps.append(torch.stack(rows))  # [e, p]
    return (ps[0].T @ ps[1]).double()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default=None, help="a checkpoint folder (default: the bundled model)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import bertscope
    from bertscope import similarity as S

    model = bertscope.load(args.model).eval()
    a, b, _ = read_pairs(DEV, args.pairs)
    ours, theirs, diff = 0.0, 0.0, 0.0
    for i in range(len(a)):
        t = time.perf_counter()
        r = S.attribute(model, a[i], b[i], steps=args.steps, rule="xsbert")
        ours += time.perf_counter() - t
        t = time.perf_counter()
        m = captum_matrix(model, a[i], b[i], args.steps)
        theirs += time.perf_counter() - t
        diff = max(diff, float((m - r.matrix).abs().max()))
    print(f"{len(a)} pairs, {args.steps} steps, {args.threads} threads, load average {os.getloadavg()[0]:.1f}")
    print(f"bertscope integrated Jacobians: {len(a) / ours:.3f} pairs/s; Captum LayerIntegratedGradients by hand: "
          f"{len(a) / theirs:.4f} pairs/s ({theirs / ours:.1f}x); largest |difference| {diff:.1e}")


if __name__ == "__main__":
    main()
