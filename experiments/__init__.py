"""Experiments, corpora and the ``bertscope`` command line (layers and data flow: docs/architecture.md).

- ``experiments.corpus``: corpora (builtin generator with gold syntax, readers), tokenisation, word alignment.
- the framework: ``options`` (``RunOptions``, ``UsageError``, ``prepare_inputs``), ``context`` (``Context``,
  the step cache), ``runner`` (``run_experiment``, manifests), ``registry`` (``EXPERIMENTS``, the
  ``Experiment`` protocol), ``report`` (the offline HTML report), ``cli`` (``bertscope`` itself).
- ``experiments.io``: atomic file writes; ``experiments.capture``: activations to safetensors shards.
- one package per experiment (``NAME``, ``DIRNAME``, ``SUMMARY_TABLES``, ``Settings``, ``run``, ``plot``;
  computation in ``data``, ``measures`` and ``steps``), imported lazily by the CLI: ``same_token``, ``heads``,
  ``positions``, ``mixing``, ``structure``, ``erasure``, ``circuits``, ``features``, ``similarity``,
  ``minimal_pairs``.

Ten experiments (``experiments.registry.EXPERIMENTS``, by CLI name): ``same-token`` (raw vs learned attention on
identical tokens), ``heads`` (what each head does, how much it matters), ``positions`` (position information per
layer), ``mixing`` (context mixing and its faithfulness), ``structure`` (structural probes), ``erasure`` (amnesic
probing), ``circuits`` (a bi-encoder's term-frequency circuit), ``features`` (sparse-dictionary latents),
``similarity`` (what makes two texts similar to an embedding model) and ``minimal-pairs`` (which sentence of a
minimal pair the masked-LM head prefers, per layer).

Importing this package is cheap: nothing heavy (torch, pandas) is imported until a command needs it.
"""
