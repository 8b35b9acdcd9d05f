"""JSON Lines: the one reader of a file of JSON objects, one per line, that corpora (``experiments/corpus``) and
circuit task files (``hooks/circuits/tasks.py``) both use, and the one UTF-8 decoding of their bytes; each caller
turns a problem into its own exception, so errors keep the caller's wording and always carry the line number."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any


def utf8_lines(data: bytes, path: Any, fail: Callable[[str], Exception]) -> list[str]:
    """The lines of ``data`` (a file's bytes: UTF-8, optional BOM, ``\\n`` or ``\\r\\n``); bytes that are not
    UTF-8 raise ``fail(message)``, the message naming ``path``, the line, the byte and how to re-encode."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise fail(f"{path}:{line}: not valid UTF-8 (byte 0x{data[err.start]:02x} at offset {err.start}); "
                   "re-encode the file as UTF-8, e.g. `iconv -f latin1 -t utf-8`") from None
    return [line.removesuffix("\r") for line in text.split("\n")]


def json_objects(lines: Iterable[str], fail: Callable[[int, str], Exception], *,
                 expected: str = "a JSON object") -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line of ``lines`` (numbered from 1, blank lines counted).
    A line that is not JSON, or not a JSON object, raises ``fail(line number, problem)``; ``expected`` names
    what an object must be in that message (``"a JSON object with a 'text' field"``)."""
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise fail(lineno, f"not valid JSON ({err.msg}, column {err.colno})") from None
        if not isinstance(record, dict):
            raise fail(lineno, f"expected {expected}, got {type(record).__name__}")
        yield lineno, record
