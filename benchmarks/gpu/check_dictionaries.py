"""GPU check for sparse dictionaries (issue 28): capture one site of a bert-base-shaped random model to disk once,
then train a TopK and a JumpReLU SAE from that capture on the device; prints tokens/s and peak device memory.

    python benchmarks/gpu/check_dictionaries.py --device cuda --out results/gpu
    python benchmarks/gpu/check_dictionaries.py --device cpu --small        # smoke test (seconds)

The issue also asks for a 2-process ``torchrun`` data-parallel check; it needs two GPUs and runs only when the
device has them (the lent machine has one: the output says so). The CPU equivalent (gloo, 2 processes) is
``tests/probes/test_dictionary_distributed.py``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Timer, parser, random_bert, write_result  # noqa: E402


def main() -> int:
    """Capture, train TopK and JumpReLU from the capture, write ``dictionaries.json``."""
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=None, help="training tokens per dictionary (default 1M; --small 8k)")
    args = p.parse_args()

    import torch
    from bertscope.experiments.activations import open_capture
    from bertscope.experiments.cli import main as cli
    from bertscope.experiments.dictionary import STAGE_SPECIAL, CorpusActivations
    from bertscope.experiments.options import load_corpus_spec
    from bertscope.models import load
    from bertscope.probes.dictionary import DictionaryConfig, TrainSettings, train_dictionaries

    device = torch.device(args.device)
    small = args.small
    tokens = args.tokens or (8_192 if small else 1_000_000)
    sentences = 60 if small else 4_000
    batch = 512 if small else 4096
    work = Path(tempfile.mkdtemp(prefix="check_dictionaries_"))
    folder = random_bert(small=small)
    site = "blocks.1.hook_resid_post" if small else "blocks.6.hook_resid_post"
    capture = work / "capture"
    with Timer(device) as t_cap:
        rc = cli(["capture", "--model", str(folder), "--hooks", site, "--corpus", "builtin", "--max-sentences",
                  str(sentences), "--device", str(device), "--out", str(capture), "--quiet"])
    if rc != 0:
        print(f"capture failed (rc {rc})")
        return 1
    model = load(str(folder), device=device)
    corpus = load_corpus_spec("builtin", model.tokenizer, sentences, 0)
    source = CorpusActivations(model, list(corpus), [site], capture=open_capture(capture, model))
    d = int(model.config.d_model)
    results = {"device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
               else "cpu", "model": "random bert-base shape" if not small else "random small BERT", "site": site,
               "d_in": d, "width": 8 * d, "sentences_captured": sentences, "capture_seconds": t_cap.seconds,
               "runs": []}
    for arch, k in (("topk", 32), ("jumprelu", None)):
        cfg = DictionaryConfig(d_in=d, d_sae=8 * d, arch=arch, k=k, site=site)
        settings = TrainSettings(tokens=tokens, batch_size=batch, buffer_rows=16 * batch, device=str(device),
                                 progress=False, exclude_classes=(*TrainSettings().exclude_classes, *STAGE_SPECIAL))
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with Timer(device) as t:
            dicts = train_dictionaries(source, {arch: cfg}, settings)
        peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
        trained = dicts[arch].config.metadata["tokens_trained"]
        run = {"arch": arch, "k": k, "tokens": trained, "batch": batch, "seconds": t.seconds,
               "tokens_per_s": trained / t.seconds, "peak_mib": peak,
               "passes_over_capture": dicts[arch].config.metadata["epochs_read"]}
        results["runs"].append(run)
        mem = f"{peak:.0f} MiB peak" if peak is not None else "peak memory: CUDA only"
        print(f"{arch:9s} {trained:,} tokens from the capture in {t.seconds:.1f} s: {run['tokens_per_s']:,.0f} "
              f"tokens/s, {mem} ({d}x{8 * d}, batch {batch}, {run['passes_over_capture']} passes)")
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    results["torchrun_2_process"] = ("not run: this machine has "
                                     f"{n_gpu} GPU(s); the 2-process nccl check needs 2 (CPU gloo equivalent: "
                                     "tests/probes/test_dictionary_distributed.py)")
    print(f"torchrun 2-process check: {results['torchrun_2_process']}")
    shutil.rmtree(work, ignore_errors=True)
    path = write_result(args.out, "dictionaries", results)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
