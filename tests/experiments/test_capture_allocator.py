"""``keep_freed_memory``: glibc set once to reuse freed pages, a no-op off glibc, the user's variables left alone,
and a full capture's numbers unchanged bit for bit by it (experiments/capture/allocator.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bertscope.experiments.capture import allocator
from bertscope.experiments.capture.allocator import (
    M_MMAP_THRESHOLD,
    M_TOP_PAD,
    M_TRIM_THRESHOLD,
    OPT_OUT,
    SETTINGS,
    keep_freed_memory,
)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a process that has not applied the setting yet."""
    monkeypatch.setattr(allocator, "_applied", None)


class FakeMallopt:
    """Records ``mallopt(param, value)`` calls; accepts every value but ``refuse``."""

    def __init__(self, refuse: int | None = None) -> None:
        self.calls: list[tuple[int, int]] = []
        self.refuse = refuse

    def __call__(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 0 if param == self.refuse else 1


def test_applied_once_with_the_documented_values() -> None:
    fake, env = FakeMallopt(), {}
    first = keep_freed_memory(fake, env)
    assert first == dict.fromkeys(SETTINGS, True)
    assert sorted(fake.calls) == sorted([(M_MMAP_THRESHOLD, 2**31 - 1), (M_TRIM_THRESHOLD, 2**31 - 1),
                                         (M_TOP_PAD, 2**30)])  # fmt: skip
    # processes started from here get the same setting through glibc's start-up variables
    assert env == {"MALLOC_MMAP_THRESHOLD_": str(2**31 - 1), "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1),
                   "MALLOC_TOP_PAD_": str(2**30)}  # fmt: skip
    again = FakeMallopt()
    assert keep_freed_memory(again, {}) == first and again.calls == []  # once per process


def test_the_users_own_variable_stands_and_a_refusal_is_reported() -> None:
    fake, env = FakeMallopt(refuse=M_TOP_PAD), {"MALLOC_TRIM_THRESHOLD_": "123"}
    applied = keep_freed_memory(fake, env)
    assert applied == {"MALLOC_MMAP_THRESHOLD_": True, "MALLOC_TRIM_THRESHOLD_": False, "MALLOC_TOP_PAD_": False}
    assert M_TRIM_THRESHOLD not in [p for p, _ in fake.calls]
    assert env["MALLOC_TRIM_THRESHOLD_"] == "123"


def test_a_no_op_off_glibc_and_when_opted_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "is_glibc", lambda: False)
    monkeypatch.setattr(allocator, "_glibc_mallopt", lambda: pytest.fail("mallopt looked up off glibc"))
    env: dict[str, str] = {}
    assert keep_freed_memory(environ=env) == {} and env == {}
    monkeypatch.setattr(allocator, "_applied", None)
    fake, env = FakeMallopt(), {OPT_OUT: "system"}
    assert keep_freed_memory(fake, env) == {} and fake.calls == [] and env == {OPT_OUT: "system"}


# In a fresh process: a full capture's bytes, then the minor page faults of allocating a 64 MiB block after a
# 128 MiB one was freed (both above glibc's largest adaptive mmap threshold, 32 MiB: by default each is a fresh mmap,
# returned on free), with or without the setting.
SCRIPT = r"""
import hashlib, json, resource, sys
import torch
from bertscope import models
from bertscope.experiments.capture import keep_freed_memory
applied = keep_freed_memory() if sys.argv[2] == "keep" else {}
model = models.load(sys.argv[1])
ids = torch.randint(5, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    digests = []
    for _ in range(3):  # later calls run on memory earlier ones freed
        _, cache = model.run_with_cache(ids, attention_mask=torch.ones_like(ids))
        digests.append({k: hashlib.sha256(v.contiguous().numpy().tobytes()).hexdigest() for k, v in cache.items()})
        del cache
    torch.ones(32 * 2**20)  # 128 MiB written and freed: memory a later, smaller block can reuse
    faults = []
    for _ in range(4):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = torch.ones(16 * 2**20)  # 64 MiB, every page written
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        del block
print(json.dumps({"applied": applied, "digests": digests, "faults": faults}))
"""


def _run(model_dir: Path, mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(model_dir), mode], capture_output=True, text=True,
                         timeout=300, env={k: v for k, v in __import__("os").environ.items()
                                           if not k.startswith("MALLOC_")})  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not allocator.is_glibc(), reason="the setting is glibc's")
def test_capture_numbers_unchanged_and_freed_pages_reused(tiny_model_dir: Path) -> None:
    default, kept = _run(tiny_model_dir, "system"), _run(tiny_model_dir, "keep")
    assert kept["applied"] == dict.fromkeys(SETTINGS, True) and default["applied"] == {}
    assert len(default["digests"][0]) > 20  # every hook point of the tiny model
    for d, k in zip(default["digests"], kept["digests"], strict=True):
        assert d == k  # bit for bit, on fresh and on reused memory
    assert default["digests"][0] == default["digests"][-1] == kept["digests"][-1]
    # glibc's default: every 64 MiB block is a fresh mmap, faulted in page by page (16384 pages of 4 KiB);
    # with the setting the later blocks reuse the heap pages the first one faulted in.
    assert min(default["faults"]) > 10_000, default["faults"]
    assert max(kept["faults"][1:]) < 1_000, kept["faults"]
