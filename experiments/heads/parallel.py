"""The heads experiment's worker processes: `map_sentences` is `experiments.workers.map_forked` (forked
one-thread workers, results in order), under the name the heads modules and their tests use."""

from __future__ import annotations

from bertscope.experiments.workers import map_forked as map_sentences

__all__ = ["map_sentences"]
