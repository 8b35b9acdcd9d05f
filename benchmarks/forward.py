"""Forward throughput of bertscope's encoder against transformers' BertModel (sdpa and eager), same run.

    python benchmarks/forward.py                      # bundled model, batch 16 x 128, CPU
    python benchmarks/forward.py --device cuda        # on a GPU (TF32 off)

Prints tokens/s for each and the ratio of ours to the faster transformers implementation.
"""

from __future__ import annotations

import argparse

import torch
from benchutils import make_batch, reference_model, time_interleaved

from bertscope import models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: bundled all-MiniLM-L6-v2)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args()

    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = getattr(torch, args.dtype)
    ours = models.load(args.model, device=device, dtype=dtype)
    folder = str(models.loading.resolve_source(args.model))
    sdpa = reference_model(folder, "sdpa", device).to(dtype)
    eager = reference_model(folder, "eager", device).to(dtype)
    batch = make_batch(args.batch, args.length, ours.tokenizer, device)

    with torch.inference_mode():
        check = (ours(**batch).float() - sdpa(**batch).last_hidden_state.float()).abs().max().item()
        seconds = time_interleaved(
            {
                "bertscope": lambda: ours(**batch),
                "transformers sdpa": lambda: sdpa(**batch),
                "transformers eager": lambda: eager(**batch),
            },
            device,
            args.repeats,
        )
    tokens = args.batch * args.length
    print(f"model: {ours.source}  device: {device}  dtype: {args.dtype}  threads: {torch.get_num_threads()}")
    print(f"batch {args.batch} x {args.length}, median of {args.repeats}; max |ours - sdpa| = {check:.2e}")
    print(f"{'implementation':<22}{'ms/batch':>10}{'tokens/s':>12}")
    for name, s in seconds.items():
        print(f"{name:<22}{s * 1e3:>10.1f}{tokens / s:>12.0f}")
    best = min(seconds["transformers sdpa"], seconds["transformers eager"])
    print(f"ratio bertscope / faster transformers (throughput): {best / seconds['bertscope']:.3f}")
    print(f"ratio bertscope / transformers sdpa: {seconds['transformers sdpa'] / seconds['bertscope']:.3f}")
    print(f"ratio bertscope / transformers eager: {seconds['transformers eager'] / seconds['bertscope']:.3f}")


if __name__ == "__main__":
    main()
