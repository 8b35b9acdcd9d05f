"""Threads (issue 40 item 3): the CLI's ``--threads`` parses, is refused when bad, is recorded in the options
(manifest), and worker processes divide this process's thread budget instead of each taking every core."""

from __future__ import annotations

import pytest
import torch
from bertscope.experiments.cli import build_parser, main
from bertscope.experiments.cli.commands import options_from_args, start_threads
from bertscope.experiments.jobs import can_fork, imap_unordered, set_thread_budget, worker_threads
from bertscope.experiments.options import RunOptions, UsageError


def _torch_threads() -> int:
    return torch.get_num_threads()


def _blas_threads() -> int:
    import threadpoolctl

    return max((pool["num_threads"] for pool in threadpoolctl.threadpool_info()), default=1)


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_worker_threads_divide_the_budget():
    assert [worker_threads(n, budget=8) for n in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]


@pytest.mark.skipif(not can_fork(), reason="workers are forked")
@pytest.mark.parametrize("budget, workers, expected", [(4, 2, 2), (2, 2, 1), (1, 2, 1)])
def test_threads_inside_a_worker_obey_the_budget(restore_threads, budget, workers, expected):
    set_thread_budget(budget)
    fns = [_torch_threads, _torch_threads, _blas_threads, _blas_threads]
    seen = dict(imap_unordered(fns, workers=workers, threads=None))
    assert [seen[0], seen[1]] == [expected, expected]  # torch's intra-op threads
    assert max(seen[2], seen[3]) <= expected  # BLAS/OpenMP pools too
    assert dict(imap_unordered([_torch_threads] * 2, workers=workers, threads=1)) == {0: 1, 1: 1}  # explicit wins


def test_threads_option_parses_and_is_recorded(restore_threads, tmp_path):
    args = build_parser(["run", "heads"]).parse_args(["run", "heads", "--threads", "3", "--out", str(tmp_path)])
    options = options_from_args(args)
    start_threads(options)  # after the usage checks, which answer without torch
    assert options.threads == 3 and torch.get_num_threads() == 3 and options.to_dict()["threads"] == 3
    args = build_parser(["run", "heads"]).parse_args(["run", "heads", "--out", str(tmp_path)])
    options = options_from_args(args)
    start_threads(options)  # default: every core this process may use, recorded as the number set
    assert options.threads == torch.get_num_threads() >= 1 and options.to_dict()["threads"] == options.threads
    assert "threads" not in RunOptions().to_dict()  # library use without a choice: nothing recorded
    for command in (["capture", "--hooks", "x"], ["sae", "eval", "d"], ["circuits", "--task", "t", "--metric", "m"]):
        assert build_parser(command).parse_args([*command, "--threads", "2"]).threads == 2


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_bad_threads_are_refused_in_one_line(value, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "heads", "--threads", value, "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("bertscope run: error: argument --threads:")
    assert not (tmp_path / "out").exists()  # refused before any work
    with pytest.raises(UsageError, match="--threads"):
        RunOptions(threads=0)


def test_default_budget_honours_omp_num_threads(restore_threads, monkeypatch):
    """No --threads: OMP_NUM_THREADS when set (torchrun sets it for its workers), else every core we may use."""
    from bertscope.experiments.jobs import default_workers

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)  # what torch reads from OMP_NUM_THREADS at start
    assert set_thread_budget() == 1 == torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert set_thread_budget() == default_workers() == torch.get_num_threads()
    with pytest.raises(ValueError, match="threads"):
        set_thread_budget(0)
