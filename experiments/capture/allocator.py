"""Keep freed memory in the process: glibc's malloc set so that a full capture reuses pages instead of faulting
fresh ones in on every call.

By default glibc serves every block above its mmap threshold (128 KiB, adapting up to 32 MiB) with a fresh
``mmap`` and hands it back to the system on ``free``; it also trims the top of the heap once 128 KiB of it is free.
A full capture of the bundled model allocates 717 MiB of tensors per call (a layer's per-head results alone are
36 MiB at 16 x 128 tokens), so each call faults about 176k pages in again: kernel time a plain forward, reusing its few
buffers, does not pay. ``keep_freed_memory`` sets, in this process (``mallopt``) and for the processes it starts
(the ``MALLOC_*_`` environment variables glibc reads at start-up):

    M_MMAP_THRESHOLD  2 GiB - 1   blocks up to 2 GiB come from the heap, not from a fresh mmap
    M_TRIM_THRESHOLD  2 GiB - 1   free memory at the top of the heap is kept up to 2 GiB
    M_TOP_PAD         1 GiB       the heap grows in steps of 1 GiB (address space; pages are faulted on first use)

Cost: the process keeps the memory it freed (its resident size stays near its peak instead of shrinking between
captures); nothing is computed differently. The ``bertscope`` command applies it at start (``experiments.cli``);
a Python user calls ``keep_freed_memory()`` once, or starts Python with the three variables set. It does nothing
off glibc (macOS, Windows, musl), when ``BERTSCOPE_MALLOC=system`` is set, and for any variable the user has
already set (glibc applied the user's value at start-up; it is left alone).
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Callable

# mallopt's parameter numbers (glibc <malloc.h>) and the values set; mallopt takes a C int.
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
SETTINGS: dict[str, tuple[int, int]] = {
    "MALLOC_MMAP_THRESHOLD_": (M_MMAP_THRESHOLD, 2**31 - 1),
    "MALLOC_TRIM_THRESHOLD_": (M_TRIM_THRESHOLD, 2**31 - 1),
    "MALLOC_TOP_PAD_": (M_TOP_PAD, 2**30),
}
OPT_OUT = "BERTSCOPE_MALLOC"  # "system": leave glibc's defaults

_applied: dict[str, bool] | None = None


def is_glibc() -> bool:
    """True when this Python runs on glibc (the only C library whose ``mallopt`` is set here)."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def _glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``int mallopt(int param, int value)``, or None when it cannot be found."""
    try:
        fn = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


def keep_freed_memory(
    mallopt: Callable[[int, int], int] | None = None, environ: dict[str, str] | None = None
) -> dict[str, bool]:
    """Set glibc's malloc to keep freed memory (see the module docstring), once per process.

    Returns ``{variable: applied}`` for the three settings: True where ``mallopt`` accepted the value in this
    process, False where the user's own variable stands or ``mallopt`` refused it; ``{}`` off glibc or with
    ``BERTSCOPE_MALLOC=system``. Later calls return the first call's answer and change nothing. Variables not set
    by the user are also put into ``environ`` (``os.environ``) so that processes started from here (spawned
    workers, ``torchrun`` ranks) start with the same setting. ``mallopt``/``environ`` replace the real ones in
    tests.
    """
    global _applied
    if _applied is not None:
        return _applied
    env = os.environ if environ is None else environ
    if env.get(OPT_OUT, "").lower() == "system" or (mallopt is None and not is_glibc()):
        _applied = {}
        return _applied
    call = mallopt if mallopt is not None else _glibc_mallopt()
    if call is None:
        _applied = {}
        return _applied
    applied = {}
    for var, (param, value) in SETTINGS.items():
        if var in env:  # the user's value, already applied by glibc at start-up
            applied[var] = False
            continue
        applied[var] = bool(call(param, value))
        env[var] = str(value)
    _applied = applied
    return _applied
