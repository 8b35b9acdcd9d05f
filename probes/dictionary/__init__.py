"""Sparse dictionaries for encoders: sparse autoencoders and transcoders, trained on streamed activations and
judged the way an encoder needs (``docs/dictionaries.md``).

- :class:`DictionaryConfig`, :class:`Dictionary`: every registered architecture (built in: ReLU, TopK, BatchTopK,
  JumpReLU); SAEs, MLP transcoders and skip transcoders.
- :func:`train_dictionaries` with :class:`TrainSettings`: streaming training over an iterable of
  batch-like objects (the activations stage's batches, :func:`plain_rows`, dicts or tensors): shuffle buffer,
  normalisation folded back, dead-latent revival, checkpoints and resume, several sites in one pass.
- :func:`evaluate_dictionary`, :func:`splice_fidelity`, :func:`metrics_table`, :func:`saelens_metrics`: metrics
  overall and per token class, and the model's own objective with the dictionary spliced in.
- :func:`finetune_e2e` with :class:`E2ESettings`, :func:`e2e_loss`: end-to-end fine-tuning of a trained SAE
  against the model's own objective with the dictionary spliced in (Braun et al. 2024).
- :func:`save_dictionary`, :func:`load_dictionary`: SAELens's on-disk format (``cfg.json`` +
  ``sae_weights.safetensors``).
- :func:`pca_topk_dictionary`, :func:`neuron_topk_dictionary`: controls at the same L0.
- :func:`spliced`: a dictionary in place of its site (SAELens's ``run_with_saes``), its latents hook points
  (``<site>.hook_sae_acts_post``); :func:`latent_samples`: each latent's top rows and quantile samples.
- :data:`RECIPE`: the one default training recipe (``TrainSettings``, ``sae train``, ``run features``).

- :mod:`.architectures`: one file per architecture, registered in one table (``register(Architecture(...))``).
- :func:`load_for_model`, :func:`site_width`, :func:`transcoder_sites`, :func:`site_folder`,
  :func:`find_dictionaries`: placing dictionaries on a model (site, widths, the weights they were trained on).

The one entry point for a whole run (model + corpus in, dictionaries and their evaluation out) is
``bertscope.experiments.dictionary.train_sae`` / ``bertscope sae train``; this package holds the mechanics on plain
tensors.
"""

from . import architectures
from .architectures import Architecture, register
from .contexts import latent_samples
from .data import SPECIAL_CLASSES, ActivationBatch, EpochBuffer, RowReader, ShuffleBuffer, plain_rows
from .e2e import DEFAULT_MSE_COEFFICIENT, E2ESettings, e2e_loss, finetune_e2e, site_variance
from .evaluate import (
    TOKEN_CLASSES,
    basis_topk_dictionary,
    collect_activations,
    evaluate_dictionary,
    fraction_recovered,
    identity_dictionary,
    neuron_topk_dictionary,
    pca_topk_dictionary,
    piece_classes,
    reconstruct,
    splice_fidelity,
    spliced,
    spliced_embeddings,
    token_classes,
)
from .metrics import latent_statistics, metrics_table, reconstruction_metrics, saelens_metrics
from .models import KINDS, Dictionary, DictionaryConfig, batch_topk_activation, topk_activation
from .placement import find_dictionaries, load_for_model, site_folder, site_width, transcoder_sites
from .saelens_format import DictionaryFormatError, is_dictionary, load_dictionary, save_dictionary
from .settings import RECIPE, Recipe
from .train import (
    TrainingInterrupted,
    TrainSettings,
    auxk_loss,
    dictionary_loss,
    geometric_median,
    norm_scaling_factor,
    train_dictionaries,
)


def __getattr__(name: str) -> object:
    """``ARCHITECTURES``: every registered architecture's name, read from the table when asked for."""
    if name == "ARCHITECTURES":
        return architectures.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_MSE_COEFFICIENT",
    "E2ESettings",
    "e2e_loss",
    "finetune_e2e",
    "site_variance",
    "ARCHITECTURES",
    "Architecture",
    "architectures",
    "register",
    "KINDS",
    "SPECIAL_CLASSES",
    "TOKEN_CLASSES",
    "ActivationBatch",
    "plain_rows",
    "Dictionary",
    "DictionaryConfig",
    "DictionaryFormatError",
    "EpochBuffer",
    "RowReader",
    "ShuffleBuffer",
    "TrainSettings",
    "RECIPE",
    "Recipe",
    "TrainingInterrupted",
    "auxk_loss",
    "basis_topk_dictionary",
    "batch_topk_activation",
    "collect_activations",
    "dictionary_loss",
    "evaluate_dictionary",
    "find_dictionaries",
    "fraction_recovered",
    "geometric_median",
    "identity_dictionary",
    "is_dictionary",
    "latent_statistics",
    "load_dictionary",
    "load_for_model",
    "metrics_table",
    "neuron_topk_dictionary",
    "norm_scaling_factor",
    "pca_topk_dictionary",
    "piece_classes",
    "reconstruct",
    "reconstruction_metrics",
    "saelens_metrics",
    "site_folder",
    "site_width",
    "transcoder_sites",
    "save_dictionary",
    "splice_fidelity",
    "spliced",
    "spliced_embeddings",
    "latent_samples",
    "token_classes",
    "topk_activation",
    "train_dictionaries",
]
