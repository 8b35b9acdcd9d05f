"""Integrated Jacobians: ``bertscope.similarity`` against Captum's ``LayerIntegratedGradients`` driven by hand
(issue 41's comparison script).

    python benchmarks/similarity_captum.py [--pairs 2] [--steps 50] [--model FOLDER]

By hand with Captum: for each side and each embedding dimension d, ``LayerIntegratedGradients`` of ``phi_d`` (the
normalised mean-pooled embedding) at the embedding output, from the xsbert reference ids, with Captum's
``riemann_right`` points (the same ``1/N, ..., 1`` as xsbert's), summed over d_model: that is row d of ``P``; the
pair matrix is ``P_a^T P_b``. ``d_embedding`` Captum calls per side (384 for the bundled model), each ``steps``
forward and backward passes, against bertscope's forward-mode passes (one primal pass per point carrying one
tangent per token). Both run in one process on the same model, pairs and points, bertscope timed after an
untimed warm-up pair (Captum's first-call cost is spread over its 2 x d_embedding calls per pair); prints both
rates (pairs per second, wall and CPU), their ratio, the largest difference between the two matrices, and the
load average. Same process settings as ``similarity_stsb.py`` (``OMP_WAIT_POLICY=PASSIVE``,
glibc keeping freed memory).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts its OpenMP threads

import argparse  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from similarity_stsb import DEV, read_pairs  # noqa: E402


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
    from bertscope.experiments.capture.allocator import keep_freed_memory

    import bertscope
    from bertscope import similarity as S

    keep_freed_memory()
    model = bertscope.load(args.model).eval()
    a, b, _ = read_pairs(DEV, args.pairs + 1)
    S.attribute(model, a[-1], b[-1], steps=args.steps, rule="xsbert", layer=0)  # warm-up (the first vmap call), untimed
    a, b = a[:-1], b[:-1]
    wall, cpu, diff = {"ours": 0.0, "captum": 0.0}, {"ours": 0.0, "captum": 0.0}, 0.0
    load = [os.getloadavg()[0]]
    for i in range(len(a)):
        t, c = time.perf_counter(), time.process_time()
        r = S.attribute(model, a[i], b[i], steps=args.steps, rule="xsbert", layer=0)
        wall["ours"] += time.perf_counter() - t
        cpu["ours"] += time.process_time() - c
        t, c = time.perf_counter(), time.process_time()
        m = captum_matrix(model, a[i], b[i], args.steps)
        wall["captum"] += time.perf_counter() - t
        cpu["captum"] += time.process_time() - c
        diff = max(diff, float((m - r.matrix).abs().max()))
        load.append(os.getloadavg()[0])
    n = len(a)
    print(f"{n} STS-B dev pairs, {args.steps} steps (xsbert's points = Captum's riemann_right), "
          f"{model.config.n_layers} x {model.config.d_model} model, {args.threads} threads, load average "
          f"{min(load):.1f} to {max(load):.1f}")  # fmt: skip
    print(f"bertscope integrated Jacobians: {n / wall['ours']:.3f} pairs/s ({cpu['ours'] / n:.2f} CPU-s per pair); "
          f"Captum LayerIntegratedGradients by hand: {n / wall['captum']:.4f} pairs/s ({cpu['captum'] / n:.1f} CPU-s "
          f"per pair); bertscope {wall['captum'] / wall['ours']:.1f}x faster in wall time, "
          f"{cpu['captum'] / cpu['ours']:.1f}x in CPU time; largest |difference| {diff:.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
