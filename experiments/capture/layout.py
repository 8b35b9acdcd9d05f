"""What a capture folder holds (file names, the format tag, the row fields), the capture error, and hook
selection by name or glob; shared by the writer, the loader and the command line."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bertscope.hooks.sites import ATTENTION_SUFFIXES  # noqa: F401 (re-exported: capture.ATTENTION_SUFFIXES, the one list)

FORMAT = "bertscope-capture/1"
INDEX = "index.json"
SENTENCES = "sentences.parquet"
SHARD_GLOB = "shard-*.safetensors"
ROW_FIELDS = ("sentence_index", "position", "word_index", "token_id", "token_type", "seq_length")
DEFAULT_SHARD_SIZE = 256 * 2**20  # the largest shard the automatic size picks
AUTO_SHARDS = 64  # the automatic size aims at this many shards (work to deal out among processes) ...
MIN_AUTO_SHARD_SIZE = 32 * 2**20  # ... but no smaller shards than this, unless the whole capture is smaller


class CaptureError(ValueError):
    """Bad capture request (no hook matches, a different capture in the folder, an incomplete capture)."""


def shard_file(number: int) -> str:
    """The file name of shard ``number``: ``shard-00000.safetensors``."""
    return f"shard-{number:05d}.safetensors"


def patterns(hooks: str | Sequence[str] | None) -> list[str]:
    """Hook names or globs from a comma-separated string or a list, stripped, empty ones dropped."""
    if hooks is None:
        return []
    parts = hooks.split(",") if isinstance(hooks, str) else [str(h) for h in hooks]
    return [p.strip() for p in parts if p.strip()]


def select_hooks(model: Any, hooks: str | Sequence[str], *, option: str | None = "--hooks") -> list[str]:
    """The model's hook names matching any of ``hooks`` (names or globs; a string may be comma-separated),
    in forward order, resolved by ``HookedModule.select_hooks``; a pattern matching nothing is a
    ``CaptureError`` that names close matches. ``option``: the command-line option the names came from, named in
    the errors (``None`` for a library call: the activations stage's ``resolve_sites``)."""
    wanted = patterns(hooks)
    if not wanted:
        how = f"pass {option} with" if option else "give"
        raise CaptureError(f"no hook given; {how} a name or glob such as 'blocks.*.hook_resid_post'")
    try:
        return model.select_hooks(wanted)
    except KeyError as e:
        where = f"{option}: " if option else ""
        raise CaptureError(f"{where}{e.args[0]} `bertscope info` lists every name.") from None
