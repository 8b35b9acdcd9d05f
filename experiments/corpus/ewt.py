"""Where UD English EWT is: the treebank is not bundled (CC BY-SA 4.0, about 15 MB); bertscope looks for it.

Search order: the `BERTSCOPE_UD_EWT` environment variable (a folder holding `en_ewt-ud-train.conllu` and
`en_ewt-ud-dev.conllu`), then `shared/data/ud-english-ewt/` beside the repository or any folder above it (the
layout of bertscope's CI). Get the treebank from https://universaldependencies.org (UD_English-EWT).
"""

from __future__ import annotations

import os
from pathlib import Path

EWT_ENV = "BERTSCOPE_UD_EWT"
EWT_FILES = {"train": "en_ewt-ud-train.conllu", "dev": "en_ewt-ud-dev.conllu"}


def find_ewt(split: str = "dev") -> Path | None:
    """The path of EWT's `split` ("train" or "dev") CoNLL-U file, or None when it is not on this machine."""
    if split not in EWT_FILES:
        raise ValueError(f"split must be one of {sorted(EWT_FILES)}, got {split!r}")
    folders = [Path(os.environ[EWT_ENV])] if os.environ.get(EWT_ENV) else []
    here = Path(__file__).resolve()
    folders += [parent / "shared" / "data" / "ud-english-ewt" for parent in here.parents]
    for folder in folders:
        path = folder / EWT_FILES[split]
        if path.is_file():
            return path
    return None
