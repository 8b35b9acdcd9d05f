"""Experiments, corpora and the ``bertscope`` command line (layers and data flow: docs/architecture.md).

- ``experiments.corpus``: corpora (builtin generator with gold syntax, readers), tokenisation, word alignment.
- the framework: ``options`` (``RunOptions``, ``UsageError``, ``prepare_inputs``), ``context`` (``Context``,
  the step cache), ``runner`` (``run_experiment``, manifests), ``registry`` (``EXPERIMENTS``, the
  ``Experiment`` protocol), ``report`` (the offline HTML report), ``cli`` (``bertscope`` itself).
- ``experiments.io``: atomic file writes; ``experiments.capture``: activations to safetensors shards.
- ``experiments.same_token`` / ``heads`` / ``positions``: one package per experiment (``NAME``, ``DIRNAME``,
  ``SUMMARY_TABLES``, ``Settings``, ``run``, ``plot``), imported lazily by the CLI.

Importing this package is cheap: nothing heavy (torch, pandas) is imported until a command needs it.
"""
