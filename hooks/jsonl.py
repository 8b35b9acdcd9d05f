"""JSON Lines: the one reader of a file of JSON objects, one per line, that corpora (``experiments/corpus``) and
circuit task files (``hooks/circuits/tasks.py``) both use; each caller turns a problem into its own exception, so
errors keep the caller's wording and always carry the line number."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any


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
