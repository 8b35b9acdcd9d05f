"""Experiments, corpora and the ``bertscope`` command line.

- ``experiments.corpus``: corpora (builtin generator with gold syntax, readers), tokenisation, word alignment.
- ``experiments.common``: the framework (``RunOptions``, ``Context``, ``run_experiment``).
- ``experiments.io``: atomic file writes; ``experiments.capture``: activations to safetensors shards.
- ``experiments.report``: the offline HTML report; ``experiments.cli``: ``bertscope`` itself.
- ``experiments.positions`` / ``same_token`` / ``heads``: the experiments (``NAME``, ``DIRNAME``, ``run``,
  ``plot``), imported lazily by the CLI.

Importing this package is cheap: nothing heavy (torch, pandas) is imported until a command needs it.
"""
