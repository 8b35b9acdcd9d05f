"""bertscope's dictionaries against SAELens (6.x), in two halves so that SAELens lives in a throwaway venv:

    # 1. in bertscope's venv: activations, dictionaries of every architecture, their outputs, bertscope's metrics,
    #    and bertscope's training throughput (TopK, the same config SAELens trains in step 2)
    nice .venv/bin/python benchmarks/dictionaries_saelens.py write /tmp/vs-saelens --tokens 200k
    # 2. in a venv with SAELens (python3 -m venv /tmp/saelens && /tmp/saelens/bin/pip install torch==2.13.0 &&
    #    /tmp/saelens/bin/pip install sae-lens): sae_lens.SAE.load_from_disk reads each folder; encode/decode and
    #    SAELens's evals formulas are compared; SAELens's SAETrainer trains the same TopK on the same activations
    nice /tmp/saelens/bin/python benchmarks/dictionaries_saelens.py check /tmp/vs-saelens

Step 2 imports only torch, safetensors and sae_lens (not bertscope) and writes FOLDER/throughput.json: tokens per
wall second and per CPU second of each trainer (both on the thread count of step 1; CPU seconds are the fairer
measure on a shared machine) and their ratios. bertscope's time includes its setup (normalisation estimate,
geometric median), SAELens's excludes its trainer's construction. Activations: random sparse combinations of
unit directions at d = 384 (what a residual-stream SAE sees is not needed to compare two implementations).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

D, WIDTH, K, BATCH = 384, 8 * 384, 32, 4096


def _count(text: str) -> int:
    t = text.lower()
    return int(float(t[:-1]) * {"k": 1e3, "m": 1e6}[t[-1]]) if t[-1] in "km" else int(t)


def activations(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    atoms = torch.nn.functional.normalize(torch.randn(4 * D, D, generator=g), dim=-1)
    idx = torch.randint(0, 4 * D, (n, 24), generator=g)
    return (torch.rand(n, 24, generator=g)[..., None] * atoms[idx]).sum(1) + 0.05 * torch.randn(n, D, generator=g)


def write(folder: Path, tokens: int) -> None:
    from bertscope.probes.dictionary import (
        DictionaryConfig,
        TrainSettings,
        saelens_metrics,
        save_dictionary,
        train_dictionaries,
    )

    folder.mkdir(parents=True, exist_ok=True)
    x = activations(max(tokens // 4, 65536))
    save_file({"x": x}, str(folder / "activations.safetensors"))
    timing = {}
    for arch in ("topk", "relu", "jumprelu", "batchtopk"):
        cfg = DictionaryConfig(d_in=D, d_sae=WIDTH, arch=arch, k=K if "topk" in arch else None, site="x")
        st = TrainSettings(tokens=tokens if arch == "topk" else min(tokens, 2 * BATCH), batch_size=BATCH,
                           buffer_rows=65536, normalise=False, b_dec_init="zeros", lr=3e-4, progress=False)
        t0, c0 = time.perf_counter(), time.process_time()
        d = train_dictionaries([x[i : i + 8192] for i in range(0, len(x), 8192)], cfg, st)["x"]
        if arch == "topk":
            n = d.config.metadata["tokens_trained"]
            timing["bertscope_topk_tokens_per_s"] = n / (time.perf_counter() - t0)
            timing["bertscope_topk_tokens_per_cpu_s"] = n / (time.process_time() - c0)
        save_dictionary(d, folder / arch)
        with torch.no_grad():
            f = d.encode(x[:4096])
            out = d.decode(f)
        save_file({"f": f, "out": out}, str(folder / arch / "bertscope_outputs.safetensors"))
        (folder / arch / "bertscope_metrics.json").write_text(json.dumps(saelens_metrics(x[:4096], out, f)))
    (folder / "timing.json").write_text(json.dumps({**timing, "tokens": tokens, "threads": torch.get_num_threads()}))
    print(json.dumps(timing))


def check(folder: Path) -> None:
    import sae_lens
    from sae_lens import SAE

    x = load_file(str(folder / "activations.safetensors"))["x"]
    worst = {}
    for arch in ("topk", "relu", "jumprelu", "batchtopk"):
        sae = SAE.load_from_disk(str(folder / arch))
        ours = load_file(str(folder / arch / "bertscope_outputs.safetensors"))
        with torch.no_grad():
            f = sae.encode(x[:4096])
            out = sae.decode(f)
        worst[arch] = {"architecture": type(sae).__name__, "max_abs_diff_acts": float((f - ours["f"]).abs().max()),
                       "max_abs_diff_out": float((out - ours["out"]).abs().max())}
    print(json.dumps({"sae_lens": sae_lens.__version__, "load_from_disk": worst}, indent=2))
    timing = json.loads((folder / "timing.json").read_text())
    torch.set_num_threads(timing["threads"])
    wall, cpu = _saelens_throughput(x, timing["tokens"])
    result = {"saelens_topk_tokens_per_s": wall, "bertscope_topk_tokens_per_s": timing["bertscope_topk_tokens_per_s"],
              "ratio_wall": timing["bertscope_topk_tokens_per_s"] / wall, "saelens_topk_tokens_per_cpu_s": cpu,
              "bertscope_topk_tokens_per_cpu_s": timing["bertscope_topk_tokens_per_cpu_s"],
              "ratio_cpu": timing["bertscope_topk_tokens_per_cpu_s"] / cpu, "threads": timing["threads"],
              "tokens": timing["tokens"]}
    (folder / "throughput.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


def _saelens_throughput(x: torch.Tensor, tokens: int) -> tuple[float, float]:
    """SAELens's ``SAETrainer`` on the same rows and TopK config: (tokens per wall second, per CPU second)."""
    from sae_lens.config import LoggingConfig, SAETrainerConfig
    from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.training.sae_trainer import SAETrainer

    sae = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=D, d_sae=WIDTH, k=K))

    def provider():
        while True:
            for i in range(0, len(x) - BATCH + 1, BATCH):
                yield x[i : i + BATCH]

    cfg = SAETrainerConfig(n_checkpoints=0, checkpoint_path=None, save_final_checkpoint=False,
                           total_training_samples=tokens, device="cpu", autocast=False, lr=3e-4, lr_end=3e-5,
                           lr_scheduler_name="constant", lr_warm_up_steps=0, adam_beta1=0.9, adam_beta2=0.999,
                           lr_decay_steps=0, n_restart_cycles=1, train_batch_size_samples=BATCH,
                           dead_feature_window=1000, feature_sampling_window=2000,
                           logger=LoggingConfig(log_to_wandb=False))
    trainer = SAETrainer(cfg, sae, provider())
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.fit()
    n = tokens // BATCH * BATCH
    return n / (time.perf_counter() - t0), n / (time.process_time() - c0)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["write", "check"])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--tokens", type=_count, default=200_000)
    a = ap.parse_args()
    write(a.folder, a.tokens) if a.mode == "write" else check(a.folder)
    sys.exit(0)
