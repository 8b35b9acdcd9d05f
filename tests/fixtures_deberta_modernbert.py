"""Offline tokenizers and tiny random DeBERTa-v2/v3 and ModernBERT checkpoints for tests (and benchmarks).

Importable from tests (pytest puts tests/ on sys.path). Nothing here touches a model hub.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

TEXTS = [
    "the cat sat on the mat while the other cat slept",
    "dogs bark at night",
    "a short one, with a comma.",
    "the quick brown fox jumps over the lazy dog",
]
PAIRS = ["cats sleep a lot", "the mat is red"]
WORDS = sorted({w.strip(".,") for t in TEXTS + PAIRS for w in t.split()} - {""})
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def unigram_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A SentencePiece-style Unigram tokenizer (``▁`` word starts) in ``DebertaV2TokenizerFast``: [PAD]=0,
    [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4, then whole words, single letters and punctuation."""
    pieces = [(s, 0.0) for s in SPECIALS]
    pieces += [("▁" + w, -2.0) for w in WORDS]
    pieces += [(c, -6.0) for c in "abcdefghijklmnopqrstuvwxyz.,"]
    pieces += [("▁", -4.0)]
    return transformers.DebertaV2TokenizerFast(vocab=pieces, unk_id=1)


def bpe_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A tiny byte-level BPE (``Ġ`` word starts, as ModernBERT's OLMo-style tokenizer) trained on ``TEXTS``,
    with [CLS] text [SEP] templates; [PAD], [UNK], [CLS], [SEP], [MASK] are ids 0-4."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS + PAIRS, trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]",
        unk_token="[UNK]", model_input_names=["input_ids", "attention_mask"],
    )


DEBERTA_V3_TINY = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
    relative_attention=True, position_buckets=8, max_relative_positions=64, pos_att_type=["p2c", "c2p"],
    share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0,
    hidden_act="gelu", layer_norm_eps=1e-7, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
)

MODERNBERT_TINY = dict(
    hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=48, max_position_embeddings=128,
    global_attn_every_n_layers=3, local_attention=8, global_rope_theta=160000.0, local_rope_theta=10000.0,
    pad_token_id=0, cls_token_id=2, sep_token_id=3, bos_token_id=2, eos_token_id=3,
)


def save_tiny(folder: Path, cls: type, config: Any, tokenizer: Any, seed: int = 0) -> torch.nn.Module:
    """Randomly initialise ``cls`` (a transformers class) from ``config`` with eager attention, perturb every
    parameter a little (so zero biases and unit LayerNorms are not special), save it with ``tokenizer`` to
    ``folder``; returns the model in eval mode."""
    torch.manual_seed(seed)
    model = cls._from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 1)
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def save_tiny_deberta(folder: Path, cls: type = transformers.DebertaV2Model, seed: int = 0, **overrides: Any):
    """A tiny DeBERTa-v3-shaped checkpoint (``DEBERTA_V3_TINY`` + ``overrides``) with the Unigram tokenizer."""
    tok = unigram_tokenizer()
    params = dict(DEBERTA_V3_TINY, vocab_size=len(tok), pad_token_id=0)
    params.update(overrides)
    return save_tiny(folder, cls, transformers.DebertaV2Config(**params), tok, seed)


def save_tiny_modernbert(folder: Path, cls: type = transformers.ModernBertModel, seed: int = 0, **overrides: Any):
    """A tiny ModernBERT checkpoint (``MODERNBERT_TINY`` + ``overrides``) with the byte-level BPE tokenizer."""
    tok = bpe_tokenizer()
    params = dict(MODERNBERT_TINY, vocab_size=len(tok))
    params.update(overrides)
    return save_tiny(folder, cls, transformers.ModernBertConfig(**params), tok, seed)


def assert_parity(ours, hf_model, batch: dict[str, torch.Tensor], *, hf_base=None, atol_hidden=1e-5,
                  atol_pattern=1e-6, final_norm: bool = False) -> dict[str, float]:
    """Every layer's hidden state (within ``atol_hidden``) and every attention probability (``atol_pattern``)
    over real tokens: bertscope's cache vs transformers' ``hidden_states``/``attentions`` (``hf_base`` is the
    encoder inside a task model, if the hidden states come from there). Returns the largest differences."""
    hf_base = hf_base if hf_base is not None else hf_model
    with torch.no_grad():
        out, cache = ours.run_with_cache(**batch)
        ref = hf_base(**{k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")},
                      output_hidden_states=True, output_attentions=True)
    real = batch["attention_mask"].bool()
    n = ours.config.n_layers
    worst = {"hidden": 0.0, "pattern": 0.0}
    assert len(ref.attentions) == n
    hidden = [cache["embed.hook_out"]] + [cache[f"blocks.{i}.hook_resid_post"] for i in range(n)]
    assert len(ref.hidden_states) == n + 1
    for i, (got, want) in enumerate(zip(hidden, ref.hidden_states, strict=True)):
        if final_norm and i == n:
            got = out
        torch.testing.assert_close(got[real], want[real], atol=atol_hidden, rtol=0, msg=f"hidden state {i}")
        worst["hidden"] = max(worst["hidden"], float((got[real] - want[real]).abs().max()))
    torch.testing.assert_close(out[real], ref.last_hidden_state[real], atol=atol_hidden, rtol=0)
    for layer in range(n):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
        keys = real[:, None, None, :].expand_as(pattern)
        queries = real[:, None, :, None].expand_as(pattern)
        both = keys & queries
        torch.testing.assert_close(pattern[both], ref.attentions[layer][both], atol=atol_pattern, rtol=0,
                                   msg=f"pattern {layer}")
        worst["pattern"] = max(worst["pattern"], float((pattern[both] - ref.attentions[layer][both]).abs().max()))
        assert (pattern[queries & ~keys] == 0).all()
    return worst
