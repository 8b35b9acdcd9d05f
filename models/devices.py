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
    """A device or dtype that does not exist here or is not supported (message names the fix).

    ``str(e)`` speaks the API's words (``device='cuda': CUDA is not available ...; use device='cpu' or
    device='auto'``); :meth:`cli_message` the command line's (``--device cuda: ...; use --device cpu or
    --device auto``)."""

    def __init__(self, option: str, value: object, reason: str, fixes: tuple[str, ...] = (), *,
                 quote: bool = False) -> None:  # fmt: skip
        self.option, self.value, self.reason, self.fixes = option, value, reason, fixes
        self.shown = repr(value) if quote else str(value)  # how the command line shows it
        fix = f"; use {' or '.join(f'{option}={v!r}' for v in fixes)}" if fixes else ""
        super().__init__(f"{option}={value!r}: {reason}{fix}")

    def cli_message(self) -> str:
        """The message with the command line's option name, e.g. ``--device cuda: ...; use --device cpu``."""
        fix = f"; use {' or '.join(f'--{self.option} {v}' for v in self.fixes)}" if self.fixes else ""
        return f"--{self.option} {self.shown}: {self.reason}{fix}"


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
        raise DeviceError("device", spec, "not one of auto, cpu, cuda, cuda:N", quote=True) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError("device", text, f"CUDA is not available (torch {torch.__version__}, built with CUDA "
                              f"{torch.version.cuda})", ("cpu", "auto"))  # fmt: skip
        if device.index is not None and device.index >= torch.cuda.device_count():
            n = torch.cuda.device_count()
            raise DeviceError("device", text, f"only {n} CUDA device(s) visible", tuple(f"cuda:{i}" for i in range(n)))
    elif device.type != "cpu":
        raise DeviceError("device", spec, "not one of auto, cpu, cuda, cuda:N", quote=True)
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
        raise DeviceError("dtype", spec, "not supported", ("float32", "float16", "bfloat16", "float64"), quote=True)
    return name


def resolve_dtype(spec: str | torch.dtype | None = None) -> torch.dtype:
    """``torch.dtype`` for a spec (see :func:`resolve_dtype_name`); ``None`` -> ``torch.float32``."""
    return getattr(torch, resolve_dtype_name(spec))
