"""CPU profile of one TopK training step (docs/dictionaries.md, "The TopK step"): the whole step as
``train_dictionaries`` runs it, and three of its parts timed alone on the same tensors (the encoder matmul, the
``topk``, Adam's update).

    nice python benchmarks/dictionaries_step_profile.py --doc docs/dictionaries.md

Random Gaussian rows (batch ``--batch``, d = 384), a TopK dictionary of ``--width`` latents and ``k`` = 32 built as
training builds it; ``--steps`` steps after ``--warm-up`` untimed ones, process CPU seconds (``time.process_time``),
``--threads`` torch threads. No latent is dead within so few steps (the dead window is 200k tokens), so AuxK never
runs here. Prints one markdown line; ``--doc FILE`` writes it, with this command, into the generated block
``step-profile`` of FILE.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import torch
from benchutils import write_docs
from bertscope.probes.dictionary import DictionaryConfig, TrainSettings
from bertscope.probes.dictionary.train import _new_state, _train_step


def _per_call(fn, repeats: int) -> float:
    """CPU seconds per call of ``fn`` over ``repeats`` calls (after one untimed call)."""
    fn()
    c0 = time.process_time()
    for _ in range(repeats):
        fn()
    return (time.process_time() - c0) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--width", type=int, default=3072)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warm-up", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--doc", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    d_in = 384
    cfg = DictionaryConfig(d_in=d_in, d_sae=args.width, arch="topk", k=args.k, site="x")
    settings = TrainSettings(tokens=args.batch * (args.steps + args.warm_up), batch_size=args.batch, progress=False)
    state = _new_state(cfg, settings, gen, torch.device("cpu"), torch.float32)
    x = torch.randn(args.batch, d_in, generator=gen)
    total = args.steps + args.warm_up
    for step in range(args.warm_up):
        _train_step(state, {"x": x}, step, total, settings, torch.device("cpu"), torch.float32)
    c0 = time.process_time()
    for step in range(args.warm_up, total):
        _train_step(state, {"x": x}, step, total, settings, torch.device("cpu"), torch.float32)
    step_s = (time.process_time() - c0) / args.steps
    d = state.dictionary
    with torch.no_grad():
        h = (x - d.b_dec) @ d.W_enc + d.b_enc
        matmul_s = _per_call(lambda: (x - d.b_dec) @ d.W_enc + d.b_enc, args.steps)
        topk_s = _per_call(lambda: torch.topk(h, args.k, dim=-1), args.steps)
    adam_s = _per_call(state.optimizer.step, args.steps)  # the last step's gradients, applied again
    command = "nice python benchmarks/dictionaries_step_profile.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    line = (f"Profile of one step (`{command}`: batch {args.batch:,}, d = {d_in}, width {args.width:,}, k = {args.k}, "
            f"no dead latents, {args.threads} thread, mean of {args.steps} steps, CPU seconds on the shared 2-core "
            f"machine): **{step_s:.2f} s a step** (about {args.batch / step_s:,.0f} tokens per CPU second), of which "
            f"the encoder matmul {matmul_s:.3f} s, the `topk` {topk_s:.3f} s and Adam's update {adam_s:.3f} s "
            "(each timed alone on the same tensors); the rest is the sparse decoder, the backward and the "
            "decoder-norm upkeep.")
    print(line)
    if args.doc is not None:
        write_docs(args.doc, line, name="step-profile")


if __name__ == "__main__":
    main()
