"""Cost of the context-mixing methods against one forward pass, and the LayerNorm-divisor check, same run.

    python benchmarks/mixing.py                       # bundled model, batch 16 x 128, CPU
    python benchmarks/mixing.py --device cuda
    python benchmarks/mixing.py --slow                # also value_zeroing and loo (O(tokens) forwards), once

Prints median seconds per call (round-robin timing, the order rotating each round) and each method's ratio to
one forward pass. The target is attention_norm, residual_norm and alti <= 3x a forward pass. On a shared,
oversubscribed CPU pass ``--threads 1``: with more threads than free cores, small kernels spin and the
ratios become noise.

``--ln-check`` prints what the public implementations' LayerNorm divisor changes on real sentences: the max
abs reconstruction error of the attention block's output from its per-token parts, and the max abs change of
alti / residual_norm, for the exact divisor sqrt(var + eps), ``torch.std(unbiased=False)`` without eps (the
ALTI code) and ``torch.std`` (unbiased, no eps).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from benchutils import make_batch, time_interleaved

from bertscope import contributions, hooks, models

LN_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention weights alone can mislead, as several papers have shown.",
    "She said that the keys to the cabinet were on the table.",
    "In 1998, the committee approved a budget of 3.5 million dollars!",
    "Why would anyone leave a perfectly good umbrella at the station?",
    "Colourless green ideas sleep furiously.",
    "The results, however, did not replicate in the second experiment.",
    "He plays the piano, she plays the violin, and they both sing.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (on a shared, oversubscribed machine 1 gives stable ratios)")
    parser.add_argument("--slow", action="store_true", help="also time value_zeroing and loo once")
    parser.add_argument("--ln-check", action="store_true", help="measure the torch.std divisor's effect")
    args = parser.parse_args()

    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    model = models.load(device=device)
    if args.ln_check:
        ln_check(model)
        return
    batch = make_batch(args.batch, args.length, model.tokenizer, device)
    with torch.inference_mode():
        fns = {"forward": lambda: model(**batch)}
        for method in ("attention", "attention_norm", "residual_norm", "alti"):
            fns[method] = lambda method=method: contributions(model, batch, method)
        seconds = time_interleaved(fns, device, args.repeats, warmup=1)
    print(f"model: {model.source}  device: {device}  threads: {torch.get_num_threads()}  load: {os.getloadavg()}")
    print(f"batch {args.batch} x {args.length}, median of {args.repeats} interleaved rounds")
    print(f"{'method':<18}{'s/batch':>10}{'x forward':>11}")
    for name, s in seconds.items():
        print(f"{name:<18}{s:>10.3f}{s / seconds['forward']:>11.2f}")
    if args.slow:
        for method in ("value_zeroing", "loo"):
            start = time.perf_counter()
            contributions(model, batch, method)
            s = time.perf_counter() - start
            print(f"{method:<18}{s:>10.3f}{s / seconds['forward']:>11.2f}   (once)")


def ln_check(model: models.Encoder) -> None:
    inputs = model.tokenize(LN_SENTENCES)
    real = inputs["attention_mask"].bool()
    recon = {"exact": 0.0, "reference": 0.0, "unbiased": 0.0}
    for layer in range(model.config.n_layers):
        for mode in recon:
            parts, rest, out = hooks.token_decomposition(model, inputs, layer, layer_norm=mode)
            recon[mode] = max(recon[mode], (parts.sum(2) + rest - out)[real].abs().max().item())
    print(f"{len(LN_SENTENCES)} sentences, {int(real.sum())} tokens, {model.config.n_layers} layers")
    print("max |sum_j T_i(x_j) + rest - LN1 output| (reconstruction of hook_resid_mid):")
    for mode, err in recon.items():
        print(f"  {mode:<10} {err:.2e}")
    for method in ("alti", "residual_norm"):
        exact = contributions(model, inputs, method)
        for mode in ("reference", "unbiased"):
            other = contributions(model, inputs, method, layer_norm=mode)
            diff = (other - exact).abs()
            rel = (diff / exact.abs().clamp_min(1e-12))[exact > 1e-6]
            print(f"{method} {mode} vs exact: max abs diff {diff.max().item():.2e}, "
                  f"max rel diff {rel.max().item():.2e}")


if __name__ == "__main__":
    main()
