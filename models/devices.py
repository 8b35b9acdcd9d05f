"""Device and dtype resolution: the one place that turns ``"auto"``, ``"cuda:1"``, ``"bf16"`` into torch objects.

Used by ``models.load`` and by the command line (which turns :class:`DeviceError` into a usage error).
"""

from __future__ import annotations

import torch

#: Accepted dtype spellings -> canonical name.
DTYPE_NAMES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float64": "float64", "fp64": "float64", "double": "float64",
}  # fmt: skip


class DeviceError(ValueError):
    """A device or dtype that does not exist here or is not supported (message names the fix)."""


def resolve_device(spec: str | torch.device | None = None) -> torch.device:
    """``None`` -> cpu; ``"auto"`` -> cuda if available else cpu; ``"cpu"``; ``"cuda"`` / ``"cuda:N"`` (must be
    available, N within the visible GPUs); a ``torch.device`` is checked the same way."""
    if spec is None:
        return torch.device("cpu")
    text = str(spec).strip().lower()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise DeviceError(f"--device {spec!r} is not one of auto, cpu, cuda, cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"--device {text}: CUDA is not available (torch {torch.__version__}, "
                f"built with CUDA {torch.version.cuda}); use --device cpu or --device auto"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(
                f"--device {text}: only {torch.cuda.device_count()} CUDA device(s) visible; use cuda:0 .. "
                f"cuda:{torch.cuda.device_count() - 1}"
            )
    elif device.type != "cpu":
        raise DeviceError(f"--device {spec!r} is not one of auto, cpu, cuda, cuda:N")
    return device


def resolve_dtype_name(spec: str | torch.dtype | None) -> str:
    """Canonical dtype name (``float32``, ``float16``, ``bfloat16``, ``float64``) for a spec or alias;
    ``None`` -> ``float32``."""
    if spec is None:
        return "float32"
    if isinstance(spec, torch.dtype):
        spec = str(spec).removeprefix("torch.")
    name = DTYPE_NAMES.get(str(spec).strip().lower())
    if name is None:
        raise DeviceError(f"--dtype {spec!r} is not supported; use one of float32, float16, bfloat16, float64")
    return name


def resolve_dtype(spec: str | torch.dtype | None = None) -> torch.dtype:
    """``torch.dtype`` for a spec (see :func:`resolve_dtype_name`); ``None`` -> ``torch.float32``."""
    return getattr(torch, resolve_dtype_name(spec))
