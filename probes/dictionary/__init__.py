"""Sparse dictionaries for encoders: sparse autoencoders and transcoders, trained on streamed activations and
judged the way an encoder needs (``docs/dictionaries.md``).

- :class:`DictionaryConfig`, :class:`Dictionary`: ReLU (L1 weighted by decoder norms), TopK (AuxK), BatchTopK
  (inference threshold), JumpReLU (straight-through threshold); SAEs, MLP transcoders and skip transcoders.
- :func:`train_dictionaries` with :class:`TrainSettings`: streaming training over an iterable of
  :class:`ActivationBatch` (or tensors): shuffle buffer, normalisation folded back, dead-latent revival,
  checkpoints and resume, several sites in one pass.
- :func:`evaluate_dictionary`, :func:`splice_fidelity`, :func:`metrics_table`, :func:`saelens_metrics`: metrics
  overall and per token class, and the model's own objective with the dictionary spliced in.
- :func:`finetune_e2e` with :class:`E2ESettings`, :func:`e2e_loss`: end-to-end fine-tuning of a trained SAE
  against the model's own objective with the dictionary spliced in (Braun et al. 2024).
- :func:`save_dictionary`, :func:`load_dictionary`: SAELens's on-disk format (``cfg.json`` +
  ``sae_weights.safetensors``).
- :func:`pca_topk_dictionary`, :func:`neuron_topk_dictionary`: controls at the same L0.

The one entry point for a whole run (model + corpus in, dictionaries and their evaluation out) is
``bertscope.experiments.sae.train_sae`` / ``bertscope sae train``; this package holds the mechanics on plain
tensors.
"""

from .data import SPECIAL_CLASSES, ActivationBatch, EpochBuffer, RowReader, ShuffleBuffer
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
    reconstruct,
    splice_fidelity,
    spliced,
    token_classes,
)
from .metrics import latent_statistics, metrics_table, reconstruction_metrics, saelens_metrics
from .models import ARCHITECTURES, KINDS, Dictionary, DictionaryConfig, batch_topk_activation, topk_activation
from .saelens_format import DictionaryFormatError, is_dictionary, load_dictionary, save_dictionary
from .train import (
    TrainingInterrupted,
    TrainSettings,
    auxk_loss,
    dictionary_loss,
    geometric_median,
    norm_scaling_factor,
    train_dictionaries,
)

__all__ = [
    "DEFAULT_MSE_COEFFICIENT",
    "E2ESettings",
    "e2e_loss",
    "finetune_e2e",
    "site_variance",
    "ARCHITECTURES",
    "KINDS",
    "SPECIAL_CLASSES",
    "TOKEN_CLASSES",
    "ActivationBatch",
    "Dictionary",
    "DictionaryConfig",
    "DictionaryFormatError",
    "EpochBuffer",
    "RowReader",
    "ShuffleBuffer",
    "TrainSettings",
    "TrainingInterrupted",
    "auxk_loss",
    "basis_topk_dictionary",
    "batch_topk_activation",
    "collect_activations",
    "dictionary_loss",
    "evaluate_dictionary",
    "fraction_recovered",
    "geometric_median",
    "identity_dictionary",
    "is_dictionary",
    "latent_statistics",
    "load_dictionary",
    "metrics_table",
    "neuron_topk_dictionary",
    "norm_scaling_factor",
    "pca_topk_dictionary",
    "reconstruct",
    "reconstruction_metrics",
    "saelens_metrics",
    "save_dictionary",
    "splice_fidelity",
    "spliced",
    "token_classes",
    "topk_activation",
    "train_dictionaries",
]
