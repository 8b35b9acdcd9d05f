"""Data-parallel dictionary training (2 CPU processes, gloo) equals one process within float tolerance."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from bertscope.probes.dictionary import DictionaryConfig, TrainSettings, train_dictionaries


def _data():
    g = torch.Generator().manual_seed(0)
    atoms = torch.nn.functional.normalize(torch.randn(12, 8, generator=g), dim=-1)
    idx = torch.randint(0, 12, (4000, 2), generator=g)
    x = (torch.rand(4000, 2, 1, generator=g) * atoms[idx]).sum(1)
    return [x[i : i + 500] for i in range(0, 4000, 500)]


def _settings(arch):
    return TrainSettings(tokens=4000, batch_size=200, buffer_rows=1200, lr=3e-3, progress=False, dead_tokens=800,
                         l1_coefficient=0.3)


def _config(arch):
    return DictionaryConfig(d_in=8, d_sae=16, arch=arch, k=2 if arch == "topk" else None, site="x")


ARCHS = ("topk", "relu")  # AuxK and resampling both happen within these 20 steps (dead_tokens=800)


def _worker(rank, world, init, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        for arch in ARCHS:
            d = train_dictionaries(_data(), _config(arch), _settings(arch))["x"]
            torch.save({k: v.detach().clone() for k, v in d.state_dict().items()}, f"{out}.{arch}.{rank}")
        dist.barrier()  # neither rank tears the group down while the other may still be using it
    finally:
        dist.destroy_process_group()


def test_two_processes_train_the_dictionary_one_process_trains(tmp_path):
    torch.set_num_threads(1)
    out = str(tmp_path / "weights")
    mp.start_processes(_worker, args=(2, f"file://{tmp_path / 'store'}", out), nprocs=2, join=True,
                       start_method="spawn")
    for arch in ARCHS:
        single = train_dictionaries(_data(), _config(arch), _settings(arch))["x"].state_dict()
        w0, w1 = torch.load(f"{out}.{arch}.0"), torch.load(f"{out}.{arch}.1")
        for name, value in single.items():
            assert torch.equal(w0[name], w1[name]), f"{arch} {name}: the ranks disagree"
            torch.testing.assert_close(w0[name], value, atol=1e-4, rtol=1e-4, msg=f"{arch} {name}")
