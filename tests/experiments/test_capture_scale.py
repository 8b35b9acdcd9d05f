"""Capture at scale: two gloo processes write the one-process bytes and resume per rank; memory stays bounded
by the shard size, not the corpus."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from bertscope.experiments import capture as capture_mod
from bertscope.experiments import cli

HOOKS = "embed.hook_out,blocks.*.hook_resid_post,blocks.1.attn.hook_pattern"
TESTS = Path(__file__).resolve().parent


def capture_args(model: Path, out: Path, *extra: str) -> list[str]:
    return ["capture", "--hooks", HOOKS, "--model", str(model), "--max-sentences", "24", "--batch-size", "3",
            "--shard-size", "30000", "--out", str(out), "--device", "cpu", *extra]  # fmt: skip


def shard_hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("shard-*.safetensors"))}


@pytest.mark.slow
def test_two_gloo_processes_write_the_one_process_bytes_and_resume_per_rank(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # CPU kernels may sum in another order with another thread count (the last bit of a float can change), so
    # the reference and each worker use one thread: the processes then see the same batches and the same kernels.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    one = tmp_path / "one"
    try:
        assert cli.main(capture_args(tiny_model_dir, one, "--quiet")) == 0
    finally:
        torch.set_num_threads(threads)
    # The workers run `python -m bertscope.experiments.capture`: start them outside the source checkout, so
    # they import the package the way an installed one is imported.
    monkeypatch.chdir(tmp_path)
    two = tmp_path / "two"
    capfd.readouterr()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    assert cli.main(capture_args(tiny_model_dir, two, "--nproc", "2")) == 0
    out = capfd.readouterr().out
    # torchrun's agent installed its own handlers; the launcher puts this process's back
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    ranks = [line for line in out.splitlines() if line.strip().startswith("rank ")]
    assert len(ranks) == 2 and all(" 0 shard(s)" not in r for r in ranks), out  # both ranks wrote shards

    hashes = shard_hashes(one)
    assert len(hashes) > 4 and shard_hashes(two) == hashes  # every shard byte for byte
    index_one, index_two = (json.loads((d / "index.json").read_text()) for d in (one, two))
    assert index_two["world_size"] == 2 and index_one["world_size"] == 1
    for key in ("fingerprint", "hooks", "n_rows", "key_width", "shards"):
        assert index_two[key] == index_one[key], key
    tensors_one, rows_one = capture_mod.load_capture(one)
    tensors_two, rows_two = capture_mod.load_capture(two)
    assert rows_two.equals(rows_one)
    assert all(torch.equal(tensors_two[n], tensors_one[n]) for n in tensors_one)  # token for token, bit for bit

    # Interrupted run: the index and one shard of each rank are gone; each rank redoes only its own.
    files = sorted(hashes)
    lost = [files[0], files[-1]]  # rank 0 writes the first shards, rank 1 the last
    (two / "index.json").unlink()
    for name in lost:
        (two / name).unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in two.glob("shard-*.safetensors")}
    assert cli.main(capture_args(tiny_model_dir, two, "--nproc", "2")) == 0
    out = capfd.readouterr().out
    assert f"wrote 2 shard(s) ({len(files) - 2} already on disk)" in out, out
    assert {name: (two / name).stat().st_mtime_ns for name in kept} == kept
    assert shard_hashes(two) == hashes

    # The plan does not depend on the number of processes: one process finishes what two started.
    (two / "index.json").unlink()
    (two / files[len(files) // 2]).unlink()
    torch.set_num_threads(1)
    try:
        assert cli.main(capture_args(tiny_model_dir, two, "--quiet")) == 0
    finally:
        torch.set_num_threads(threads)
    assert "wrote 1 shard(s)" in capfd.readouterr().out and shard_hashes(two) == hashes


def test_nproc_is_checked_before_any_worker_starts(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["capture", "--hooks", "embed.hook_out", "--nproc", "0"])
    assert exc.value.code == 2 and "--nproc" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")  # already a torchrun worker: --nproc would launch workers of workers
    monkeypatch.setenv("RANK", "0")
    assert cli.main(capture_args(tiny_model_dir, tmp_path / "o", "--nproc", "2")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "under torchrun leave it out" in err and not (tmp_path / "o").exists()


def test_worker_argv_reproduces_the_command_without_the_launcher_option(tiny_model_dir: Path, tmp_path: Path) -> None:
    args = cli.build_parser().parse_args(capture_args(tiny_model_dir, tmp_path, "--nproc", "2", "--force"))
    argv = cli.parser.worker_argv(args)
    assert "--nproc" not in argv and "--force" in argv and "--quiet" not in argv
    again = cli.build_parser().parse_args(["capture", *argv])
    assert {k: v for k, v in vars(again).items() if k != "nproc"} == {
        k: v for k, v in vars(args).items() if k != "nproc"
    }


MEMORY_SCRIPT = textwrap.dedent(
    """
    import json, resource, sys
    from pathlib import Path
    from bertscope import models
    from bertscope.experiments.capture import capture
    from bertscope.experiments.corpus import load_corpus

    model_dir, out, shard_size = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    model = models.load(model_dir)

    def peak():
        # VmHWM belongs to this process image: ru_maxrss would carry the parent's peak across fork and exec,
        # which inside a large pytest run hides every growth of this process.
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # bytes (reported in kB)
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    # A first capture of the same corpus brings every code path, buffer and allocator arena to its working size.
    corpus = load_corpus("builtin", max_sentences=400)
    loaded = peak()
    capture(model, corpus, "*", out / "warm", shard_size=shard_size, batch_size=8, quiet=True)
    first_growth = peak() - loaded
    before = peak()
    index = capture(model, corpus, "*", out / "big", shard_size=shard_size, batch_size=8, quiet=True)
    growth = peak() - before
    # Control: the same capture in one shard holds everything until the end, as a non-streaming one would.
    capture(model, corpus, "*", out / "one", shard_size=10**12, batch_size=8, quiet=True)
    print(json.dumps({"growth": growth, "control_growth": peak() - before, "first_growth": first_growth,
                      "shards": len(index["shards"]),
                      "total": sum(s["bytes"] for s in index["shards"])}))
    """
)


@pytest.mark.slow
def test_capture_memory_is_bounded_by_the_shard_size_not_the_corpus(tiny_model_dir: Path, tmp_path: Path) -> None:
    shard_size = 1_000_000
    result = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, str(tiny_model_dir), str(tmp_path), str(shard_size)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
        # a fixed mmap threshold: glibc then returns every large freed buffer at once, so the peak RSS follows
        # the memory in use (its default adapts the threshold and may keep freed buffers in the heap)
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    m = json.loads(result.stdout.strip().splitlines()[-1])
    assert m["shards"] > 20 and m["total"] > 40e6  # all hooks: tens of MB, far more than one shard
    # Holding the capture (as a non-streaming implementation must, then concatenating it) would raise the peak
    # by at least `total`; streaming keeps the growth to a few shards and batches.
    assert m["growth"] < m["total"] / 4, m
    assert m["control_growth"] > m["total"], m  # the measurement does see a capture held in memory
