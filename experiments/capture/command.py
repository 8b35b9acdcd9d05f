"""``bertscope capture`` (and ``python -m`` / ``torchrun -m bertscope.experiments.capture``): the command's
body, the local multi-process launcher (``--nproc``), and the summary it prints."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .distributed import process_group
from .layout import INDEX, CaptureError
from .stream import capture

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
#: the signals torchrun's agent takes over (its default TORCHELASTIC_SIGNALS_TO_HANDLE), where the platform has them
_AGENT_SIGNALS = tuple(getattr(signal, s) for s in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT") if hasattr(signal, s))


def run_command(args: argparse.Namespace, options: Any, worker_argv: Sequence[str] = ()) -> int:
    """Body of ``bertscope capture``: ``args`` from its parser, ``options`` the shared ``RunOptions``,
    ``worker_argv`` the command-line arguments that reproduce ``args`` less ``--nproc`` (what ``--nproc``'s
    workers get; the CLI's ``worker_argv``).

    With ``--nproc N`` (outside torchrun) it launches N local worker processes with torchrun; under torchrun
    (``WORLD_SIZE`` set) it joins the process group (gloo on CPU, nccl on CUDA, one GPU per local rank).
    Only rank 0 prints; bad input raises ``UsageError`` there and exits 2 silently elsewhere.
    """
    from bertscope.experiments.options import UsageError

    worker = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    nproc = getattr(args, "nproc", None)
    if nproc and worker:
        raise UsageError("--nproc launches torchrun itself; under torchrun leave it out (use --nproc-per-node)")
    if nproc:
        return launch(args, nproc, worker_argv)
    rank = int(os.environ.get("RANK", "0")) if worker else 0
    try:
        with process_group(options.device) as device:
            return _capture_command(args, replace(options, device=device), quiet_rank=rank != 0)
    except (UsageError, CaptureError) as e:
        if rank == 0:
            raise UsageError(str(e)) from e
        return EXIT_USAGE


def launch(args: argparse.Namespace, nproc: int, worker_argv: Sequence[str] = ()) -> int:
    """Run this capture in ``nproc`` local processes: ``torchrun --standalone --nproc-per-node nproc -m
    bertscope.experiments.capture ...`` in-process (``torch.distributed.run``), so a worker's bad-input
    error stays one line. Each worker gets ``cores // nproc`` threads unless ``OMP_NUM_THREADS`` is set.
    Returns the exit status: 0, 2 (bad input, printed by rank 0), 130 (interrupted) or 1."""
    import logging

    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    argv = ["--standalone", "--nproc-per-node", str(nproc), "-m", "bertscope.experiments.capture",
            *worker_argv]  # fmt: skip
    saved_env = dict(os.environ)
    # torchrun's agent installs its own handlers for these (they raise SignalException) and leaves them behind;
    # restored below, or every later SIGTERM in this process, and in processes it forks, raises instead of ending
    saved_handlers = {sig: signal.getsignal(sig) for sig in _AGENT_SIGNALS}
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // nproc)))
    elastic = logging.getLogger("torch.distributed.elastic")
    level = elastic.level
    elastic.setLevel(logging.CRITICAL)  # workers report their own errors; no agent tracebacks
    try:
        torchrun.run(torchrun.parse_args(argv))
    except ChildFailedError as e:
        codes = {f.exitcode for f in e.failures.values()}
        if codes == {EXIT_USAGE}:
            return EXIT_USAGE
        if codes & {EXIT_INTERRUPTED, -2}:
            return EXIT_INTERRUPTED
        rank, failure = min(e.failures.items())
        print(f"bertscope: error: capture worker rank {rank} failed with exit code {failure.exitcode} "
              "(its traceback is above); rerun the same command to resume", file=sys.stderr)  # fmt: skip
        return EXIT_FAILED
    except SignalException:  # Ctrl-C or SIGTERM reached the launcher: the workers were stopped with it
        print("\nbertscope: interrupted; finished shards are kept, rerun the same command to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        elastic.setLevel(level)
        os.environ.clear()
        os.environ.update(saved_env)
        for sig, handler in saved_handlers.items():
            signal.signal(sig, handler)
    return EXIT_OK


def _capture_command(args: argparse.Namespace, options: Any, quiet_rank: bool) -> int:
    from bertscope.experiments.options import prepare_inputs
    from bertscope.experiments.runner import device_summary, package_versions

    if quiet_rank:
        options = replace(options, quiet=True)
    _check_hooks_or_for(args, options)
    inputs = prepare_inputs(options)
    info = {
        "model": inputs.model_info,
        "corpus": inputs.corpus_info,
        "options": options.to_dict() | {"hooks": args.hooks, "shard_size": args.shard_size},
        "device": device_summary(inputs.device),
        "packages": package_versions(),
    }
    target = getattr(args, "for_experiment", None)
    if target is not None:
        index = _capture_for(target, inputs, options, args, info)
    else:
        index = capture(
            inputs.model, inputs.corpus, args.hooks, options.out,
            max_length=options.max_length, batch_size=options.batch_size, shard_size=args.shard_size,
            force=options.force, quiet=options.quiet, info=info,
        )  # fmt: skip
    if quiet_rank:
        return EXIT_OK
    run = index["run"]
    n_bytes = sum(s["bytes"] for s in index["shards"])
    what = (f"{len(index['hooks'])} hook(s), {index['n_rows']:,} token rows from {index['n_sentences']:,} "
            f"sentences in {len(index['shards'])} shard(s), {n_bytes / 1e6:,.1f} MB")  # fmt: skip
    if run["already_complete"]:
        print(f"capture in {options.out} is already complete ({what}); nothing to do (--force recaptures)\n"
              f"index: {options.out / INDEX}")  # fmt: skip
        return EXIT_OK
    if index.get("n_truncated"):
        print(
            f"warning: {index['n_truncated']} sentences were longer than --max-length {options.max_length} "
            "and were truncated (see sentences.parquet, column truncated)",
            file=sys.stderr,
        )
    if warning := idle_warning(index):
        print(warning, file=sys.stderr)
    resumed = f" ({run['shards_reused']} already on disk)" if run["shards_reused"] else ""
    print(f"captured {what}; wrote {run['shards_written']} shard(s){resumed}")
    if not options.quiet:
        for r in run["ranks"]:
            rate = f"{r['tokens_per_s']:,.0f} tokens/s" if r["tokens_per_s"] else "idle"
            print(f"  rank {r['rank']}: {r['shards']} shard(s), {r['rows']:,} token rows run, {rate}")
    print(f"index: {options.out / INDEX}")
    return EXIT_OK


def _check_hooks_or_for(args: argparse.Namespace, options: Any) -> None:
    """``--hooks`` or ``--for``, one of them; ``--set`` only for the ``--for`` experiment (`UsageError`)."""
    from bertscope.experiments.options import UsageError

    target = getattr(args, "for_experiment", None)
    if target is None and not args.hooks:
        raise UsageError("capture needs --hooks (names or globs, see `bertscope info`) or --for EXPERIMENT")
    if target is not None and args.hooks:
        raise UsageError(f"--for {target} captures the sites {target} reads; drop --hooks")
    other = [name for name in options.settings if name != target]
    if other:
        raise UsageError(f"--set {other[0]}.*: capture uses settings only with --for {other[0]}")


def _capture_for(target: str, inputs: Any, options: Any, args: argparse.Namespace,
                 info: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """``--for TARGET``: the experiment's own capture (its registry member ``capture_inputs``) with its
    ``Settings`` and the typed ``--set`` values; a refusal of the inputs (`registry.CannotRun`) is a
    `UsageError`."""
    from bertscope.experiments.options import UsageError
    from bertscope.experiments.registry import CannotRun, load_experiment
    from bertscope.experiments.settings import apply_overrides

    module = load_experiment(target)
    settings = apply_overrides(target, module.Settings(), options.settings.get(target, {}))
    info = info | {"options": info["options"] | {"hooks": None, "for": target}}
    try:
        return module.capture_inputs(inputs, options, settings, shard_size=args.shard_size, info=info)
    except CannotRun as e:
        raise UsageError(f"{target}: {e}") from None


def idle_warning(index: dict[str, Any]) -> str | None:
    """The warning for a capture (``capture``'s result) in which some process had no shard to write, else
    ``None``: shards are what is dealt out, so fewer shards than processes leaves processes idle."""
    run = index["run"]
    idle = [r["rank"] for r in run["ranks"] if not r["shards"]]
    if not idle:
        return None
    n_bytes = sum(s["bytes"] for s in index["shards"])
    return (f"warning: {len(idle)} of {run['world_size']} processes had no shard to write ({len(index['shards'])} "
            f"shard(s) of --shard-size {index['shard_size']:,} bytes); a --shard-size of at most "
            f"{n_bytes // run['world_size']:,} gives every process one")  # fmt: skip
