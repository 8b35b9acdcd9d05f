"""The old home of the dictionary entry points and commands, kept so that old imports work (aliases, listed in
``docs/dictionaries.md``): the entry points are in ``experiments.dictionary``, the command bodies in
``experiments.cli.sae_command``, site widths, transcoder sites, site folders and finding dictionaries in
``bertscope.probes.dictionary.placement``."""

from __future__ import annotations

import importlib
from typing import Any

from bertscope.experiments.dictionary import (
    CONTROL_ROWS,
    STAGE_SPECIAL,
    CorpusActivations,
    _piece_classes,
    corpus_tokens,
    describe,
    dictionary_classes,
    evaluate_sae,
    parse_width,
    save_dictionary,
    summary,
    train_sae,
    write_evaluation,
)
from bertscope.probes.dictionary.placement import find_dictionaries, site_folder, site_width, transcoder_sites

#: names whose home is the command layer (read when asked for: this module sits below ``experiments.cli``)
_COMMANDS = ("capture_sentences", "run_eval_command", "run_train_command")


def __getattr__(name: str) -> Any:
    """``run_train_command``, ``run_eval_command``, ``capture_sentences``: ``experiments.cli.sae_command``'s."""
    if name in _COMMANDS:
        return getattr(importlib.import_module("bertscope.experiments.cli.sae_command"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CONTROL_ROWS",
    "STAGE_SPECIAL",
    "CorpusActivations",
    "_piece_classes",
    "corpus_tokens",
    "describe",
    "dictionary_classes",
    "evaluate_sae",
    "find_dictionaries",
    "parse_width",
    "save_dictionary",
    "site_folder",
    "site_width",
    "summary",
    "train_sae",
    "transcoder_sites",
    "write_evaluation",
]  # and _COMMANDS, resolved on first use (not listed: the API reference would import the command layer)
