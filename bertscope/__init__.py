"""bertscope: mechanistic interpretability for BERT-family encoders.

The installed namespace. Its subpackages live at the repository's top level and are mapped here by
``pyproject.toml``: ``bertscope.models`` (encoders and checkpoint loading), ``bertscope.hooks`` (hook points,
caches, interventions), ``bertscope.probes`` (linear probes with controls) and ``bertscope.experiments``
(corpora, experiments, the ``bertscope`` command line).

Eight families (``models.FAMILIES``, by ``model_type``): BERT (``bert``), RoBERTa (``roberta``), XLM-R
(``xlm-roberta``), DistilBERT (``distilbert``), ALBERT (``albert``), ELECTRA (``electra``), DeBERTa-v2/v3
(``deberta-v2``) and ModernBERT (``modernbert``).
Ten experiments (``experiments.registry.EXPERIMENTS``, by CLI name): ``same-token`` (raw vs learned attention on
identical tokens), ``heads`` (what each head does, how much it matters), ``positions`` (position information per
layer), ``mixing`` (context mixing and its faithfulness), ``structure`` (structural probes), ``erasure`` (amnesic
probing), ``circuits`` (a bi-encoder's term-frequency circuit), ``features`` (sparse-dictionary latents),
``similarity`` (what makes two texts similar to an embedding model) and ``minimal-pairs`` (which sentence of a
minimal pair the masked-LM head prefers, per layer).

>>> import bertscope
>>> model = bertscope.load()                      # the bundled all-MiniLM-L6-v2
>>> last, cache = model.run_with_cache(["The cat sat.", "Dogs bark."])   # text, or token ids with a mask
>>> cache["pattern", 0].shape                     # [batch, head, query, key]; TransformerLens short names
>>> model.to_str_tokens("The cat sat.")           # ['[CLS]', 'the', 'cat', 'sat', '.', '[SEP]']

Interventions take the model first (``ablate_heads(model, heads)``, ``patch_heads(model, heads, source)``,
``patch_activation(model, names, source)``). A walk-through: ``docs/tutorial.md``; the hook reference:
``docs/hooks.md``.

>>> bertscope.explore(model, ["The cat sat."]).save("explore.html")   # interactive attention views
"""

from __future__ import annotations

from importlib import import_module as _import_module
from importlib import metadata as _metadata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bertscope.experiments.dictionary import evaluate_sae, train_sae
    from bertscope.hooks import (
        ActivationCache,
        HookedModule,
        HookPoint,
        ablate_heads,
        contributions,
        mean_z,
        mixing_ratio,
        patch_activation,
        patch_heads,
    )
    from bertscope.models import CheckpointError, Encoder, EncoderConfig, load, random_encoder
    from bertscope.probes import LinearProbe, StructuralProbe, evaluate
    from bertscope.probes.dictionary import load_dictionary

# Every public name is imported on first use (PEP 562), so `import bertscope` and the `bertscope` command line
# start without torch (a usage error answers in well under a second); the probes bring in scikit-learn and SciPy,
# which the encoders, the hooks and `bertscope capture` do without.
_LAZY = {
    **dict.fromkeys(("ActivationCache", "HookedModule", "HookPoint", "ablate_heads", "contributions", "mean_z",
                     "mixing_ratio", "patch_activation", "patch_heads"), "bertscope.hooks"),
    **dict.fromkeys(("CheckpointError", "Encoder", "EncoderConfig", "load", "random_encoder"), "bertscope.models"),
    **dict.fromkeys(("LinearProbe", "StructuralProbe", "evaluate"), "bertscope.probes"),
    "load_dictionary": "bertscope.probes.dictionary",
    **dict.fromkeys(("train_sae", "evaluate_sae"), "bertscope.experiments.dictionary"),
}  # fmt: skip

try:
    __version__ = _metadata.version("bertscope")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"


def __getattr__(name: str):
    """The public names (``load``, ``ActivationCache``, ``LinearProbe`` ...) and the subpackages, imported when
    first asked for."""
    if name in ("models", "hooks", "probes", "experiments", "similarity"):
        return _import_module(f"bertscope.{name}")
    if name in _LAZY:
        value = getattr(_import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bertscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names and subpackages (not the module's own imports)."""
    own = {n for n in globals() if not n.startswith("_") and n not in ("TYPE_CHECKING", "annotations")}
    return sorted({*own, *_LAZY, "models", "hooks", "probes", "experiments", "similarity"})


def load_capture(out_dir, hooks=None, *, as_frame=False, order="corpus"):
    """Load activations written by ``bertscope capture`` from folder ``out_dir``: ``(tensors, rows)`` (or one
    DataFrame with ``as_frame=True``). ``hooks``: names or globs to load (default all); ``order``: ``"corpus"`` or
    ``"shard"``. Full description: ``bertscope.experiments.capture.load_capture`` (imported on first call, so
    ``import bertscope`` stays light)."""
    from bertscope.experiments.capture import load_capture as _load_capture

    return _load_capture(out_dir, hooks, as_frame=as_frame, order=order)


def explore(model, texts, *, maps=None, labels=None, mixing=None, qk="auto", attention=True,
            title="bertscope explorer", batch_size=8, pairs=None, sentence_b_start=None, dictionary=None,
            latents=None):  # fmt: skip
    """Interactive attention explorer for a few texts (an object Jupyter shows and ``.save(path)`` writes as one
    offline HTML page). ``maps``: extra views ``{name: [batch, layer, query, key]}``; ``mixing``: context-mixing
    methods to compute for the menu (e.g. ``"alti,attention_norm"``); ``qk``: which sentences get the query-key
    view; ``pairs``: a second segment per text (sentence-pair view). bertviz-style:
    ``explore(outputs.attentions, tokens, sentence_b_start=...)`` takes transformers' ``output_attentions``;
    ``dictionary`` (a saved dictionary folder) with ``latents`` colours each token by those latents' activations.
    Full description: ``bertscope.experiments.explorer.explore`` (imported on first call)."""
    from bertscope.experiments.explorer import explore as _explore

    return _explore(model, texts, maps=maps, labels=labels, mixing=mixing, qk=qk, attention=attention, title=title,
                    batch_size=batch_size, pairs=pairs, sentence_b_start=sentence_b_start, dictionary=dictionary,
                    latents=latents)


__all__ = [
    "ActivationCache",
    "CheckpointError",
    "Encoder",
    "EncoderConfig",
    "HookPoint",
    "HookedModule",
    "LinearProbe",
    "StructuralProbe",
    "__version__",
    "ablate_heads",
    "contributions",
    "evaluate",
    "evaluate_sae",
    "explore",
    "load",
    "load_capture",
    "load_dictionary",
    "mean_z",
    "mixing_ratio",
    "patch_activation",
    "patch_heads",
    "random_encoder",
    "train_sae",
]
