"""Work in a forked copy of this process, beside this one: the second core draws while the first goes on.

A forked copy starts with everything this process holds (a laid-out matplotlib figure, say) without pickling
it; it runs one callable and leaves with ``os._exit``, so it never returns into the caller's code, flushes no
inherited buffer and runs no exit handler. An exception in the copy comes back through a pipe (pickled; as a
``RuntimeError`` with its text if it does not pickle) and is raised by :meth:`Copy.wait`. Where the platform
has no ``fork`` or this process may use one core only, :func:`available` is false and callers run the work
themselves.

>>> copy = start(lambda: fig.savefig("a.pdf"))   # the copy draws the PDF ...
>>> fig.savefig("a.png")                           # ... while this process draws the PNG
>>> copy.wait()                                    # raises what the copy raised
"""

from __future__ import annotations

import contextlib
import os
import pickle
import warnings
from collections.abc import Callable, Iterator
from typing import Any


def available() -> bool:
    """Whether work can run beside this process: ``os.fork`` exists and this process may use two cores."""
    if not hasattr(os, "fork"):
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return cores > 1


class Copy:
    """A forked copy running one callable; :meth:`wait` reaps it and raises its error."""

    def __init__(self, pid: int, read_fd: int) -> None:
        self.pid = pid
        self._read_fd: int | None = read_fd

    def wait(self) -> None:
        """Wait for the copy to end; raise the exception it raised (or a ``RuntimeError`` if it died)."""
        if self._read_fd is None:
            return
        with os.fdopen(self._read_fd, "rb") as f:
            self._read_fd = None
            report = f.read()
        _, status = os.waitpid(self.pid, 0)
        if report:
            raise pickle.loads(report)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            raise RuntimeError(f"the forked process {self.pid} ended with status {code} and no report")


def start(fn: Callable[[], Any]) -> Copy:
    """Run ``fn()`` in a forked copy of this process; returns at once. Call ``wait()`` on the result."""
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():  # Python >= 3.12 warns on fork with threads running (tqdm's monitor): the
        warnings.simplefilter("ignore", DeprecationWarning)  # copy only runs fn, which takes none of their locks
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the copy (coverage cannot see it)
        _run_in_copy(fn, read_fd, write_fd)
    os.close(write_fd)
    return Copy(pid, read_fd)


def beside(child: Callable[[], Any], parent: Callable[[], Any]) -> None:
    """Run ``child()`` in a forked copy while this process runs ``parent()``; wait for both.

    The copy is waited for whatever ``parent()`` raises; ``parent()``'s error wins over the copy's.
    """
    copy = start(child)
    try:
        parent()
    except BaseException:
        with contextlib.suppress(BaseException):
            copy.wait()
        raise
    copy.wait()


class Pipeline:
    """At most one copy at a time: :meth:`submit` waits for the previous copy, then starts the next.

    This process prepares item k + 1 while a copy finishes item k; :meth:`close` waits for the last one.
    """

    def __init__(self) -> None:
        self._running: Copy | None = None

    def submit(self, fn: Callable[[], Any]) -> None:
        """Wait for the running copy (raising its error), then run ``fn()`` in a new one."""
        self.drain()
        self._running = start(fn)

    def drain(self) -> None:
        """Wait for the running copy, if any, and raise its error."""
        running, self._running = self._running, None
        if running is not None:
            running.wait()

    @contextlib.contextmanager
    def open(self) -> Iterator[Pipeline]:
        """Yield the pipeline; on exit wait for the last copy (its error is raised unless another one is)."""
        try:
            yield self
        except BaseException:
            with contextlib.suppress(BaseException):
                self.drain()
            raise
        self.drain()


def _run_in_copy(fn: Callable[[], Any], read_fd: int, write_fd: int) -> None:  # pragma: no cover - in the copy
    code = 1
    try:
        import gc

        gc.disable()  # a full collection would walk (and so copy) every page of the parent's heap
        os.close(read_fd)
        fn()
        code = 0
    except BaseException as e:  # noqa: BLE001 - every error goes back to the parent
        try:
            report = pickle.dumps(e)
        except Exception:  # noqa: BLE001
            report = pickle.dumps(RuntimeError(f"{type(e).__name__}: {e}"))
        with contextlib.suppress(BaseException), os.fdopen(write_fd, "wb") as f:
            f.write(report)
    finally:
        os._exit(code)
