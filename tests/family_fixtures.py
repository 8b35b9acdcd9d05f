"""Tiny random checkpoints of every BERT-family architecture, each with its own kind of tokenizer, built offline.

    from family_fixtures import save_tiny_family, FAMILIES
    hf_model = save_tiny_family("roberta", folder, head="mlm")   # RobertaForMaskedLM + a byte-level BPE tokenizer
    model = bertscope.models.load(folder)

Tokenizers (trained in a fraction of a second on ``TRAINING_TEXT``, nothing downloaded):
- ``bpe_tokenizer()``: byte-level BPE (``Ġ`` marks a preceding space) wrapped in ``RobertaTokenizer``.
- ``unigram_tokenizer("xlm-roberta" | "albert")``: a SentencePiece-style Unigram model (``▁`` starts a word)
  wrapped in ``XLMRobertaTokenizer`` (``<s>``/``</s>``, pad id 1) or ``AlbertTokenizer`` ([CLS]/[SEP], pad id 0).
- ``wordpiece_tokenizer()``: the bundled all-MiniLM-L6-v2 WordPiece tokenizer (``##`` continues a word).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import torch
import transformers
from helpers import BUNDLED

TRAINING_TEXT = [
    "The cat sat on the mat.",
    "Interpretability researchers probe attention heads, layer by layer, with linear classifiers.",
    "A dog!",
    "Tokenization splits unbelievably uncommon words into several pieces.",
    "Where is the station? It is two blocks north of the old cathedral.",
    "The keys to the cabinet are on the table.",
    "Researchers who study encoders compare models of many families.",
    "Colourless green ideas sleep furiously, said the linguist.",
]


@cache
def bpe_tokenizer(vocab_size: int = 400) -> transformers.PreTrainedTokenizerBase:
    """A byte-level BPE tokenizer trained on ``TRAINING_TEXT``, as ``RobertaTokenizer`` (``<s>`` 0, ``<pad>`` 1,
    ``</s>`` 2, ``<unk>`` 3, ``<mask>`` 4)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TRAINING_TEXT, trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return transformers.RobertaTokenizer(vocab=model["vocab"], merges=merges, model_max_length=64)


_UNIGRAM_SPECIALS = {
    "xlm-roberta": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
    "albert": ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"],
}


@cache
def unigram_tokenizer(kind: str, vocab_size: int = 200) -> transformers.PreTrainedTokenizerBase:
    """A SentencePiece-style Unigram tokenizer trained on ``TRAINING_TEXT``: ``XLMRobertaTokenizer``
    (``kind="xlm-roberta"``) or ``AlbertTokenizer`` (``kind="albert"``), special tokens first in the vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    specials = _UNIGRAM_SPECIALS[kind]
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>",
                                      show_progress=False)
    corpus = TRAINING_TEXT if kind == "xlm-roberta" else [t.lower() for t in TRAINING_TEXT]
    tok.train_from_iterator(corpus, trainer)
    vocab = [tuple(v) for v in json.loads(tok.to_str())["model"]["vocab"]]
    assert [v[0] for v in vocab[: len(specials)]] == specials
    if kind == "xlm-roberta":
        return transformers.XLMRobertaTokenizer(vocab=vocab, model_max_length=64)
    return transformers.AlbertTokenizer(vocab=vocab, model_max_length=64)


@cache
def wordpiece_tokenizer() -> transformers.PreTrainedTokenizerBase:
    """The bundled WordPiece tokenizer (BERT's uncased vocabulary, 30522 pieces)."""
    return transformers.AutoTokenizer.from_pretrained(str(BUNDLED), local_files_only=True)


@dataclass(frozen=True)
class FamilySpec:
    """A family's transformers classes, tiny shape and tokenizer."""

    config_cls: type
    heads: dict[str, type]  # "base" | "mlm" | "seqcls" (| "pretraining") -> transformers class
    shape: dict[str, Any]
    tokenizer: Any  # () -> tokenizer
    base_attr: str  # the base model's attribute in task models (e.g. "roberta")
    segments: bool = True  # has token types
    extra: dict[str, Any] = field(default_factory=dict)


_BERT_SHAPE = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64)

FAMILIES: dict[str, FamilySpec] = {
    "roberta": FamilySpec(
        transformers.RobertaConfig,
        {"base": transformers.RobertaModel, "mlm": transformers.RobertaForMaskedLM,
         "seqcls": transformers.RobertaForSequenceClassification},
        dict(_BERT_SHAPE, max_position_embeddings=66, type_vocab_size=1),
        bpe_tokenizer, "roberta", segments=False,
    ),
    "xlm-roberta": FamilySpec(
        transformers.XLMRobertaConfig,
        {"base": transformers.XLMRobertaModel, "mlm": transformers.XLMRobertaForMaskedLM,
         "seqcls": transformers.XLMRobertaForSequenceClassification},
        dict(_BERT_SHAPE, max_position_embeddings=66, type_vocab_size=1),
        lambda: unigram_tokenizer("xlm-roberta"), "roberta", segments=False,
    ),
    "distilbert": FamilySpec(
        transformers.DistilBertConfig,
        {"base": transformers.DistilBertModel, "mlm": transformers.DistilBertForMaskedLM,
         "seqcls": transformers.DistilBertForSequenceClassification},
        dict(dim=32, n_layers=3, n_heads=4, hidden_dim=64, max_position_embeddings=64),
        wordpiece_tokenizer, "distilbert", segments=False,
    ),
    "albert": FamilySpec(
        transformers.AlbertConfig,
        {"base": transformers.AlbertModel, "mlm": transformers.AlbertForMaskedLM,
         "seqcls": transformers.AlbertForSequenceClassification, "pretraining": transformers.AlbertForPreTraining},
        dict(_BERT_SHAPE, embedding_size=16, max_position_embeddings=64),
        lambda: unigram_tokenizer("albert"), "albert",
    ),
    "electra": FamilySpec(
        transformers.ElectraConfig,
        {"base": transformers.ElectraModel, "mlm": transformers.ElectraForMaskedLM,
         "seqcls": transformers.ElectraForSequenceClassification,
         "pretraining": transformers.ElectraForPreTraining},
        dict(_BERT_SHAPE, embedding_size=16, max_position_embeddings=64),
        wordpiece_tokenizer, "electra",
    ),
}


def tiny_config(family: str, **overrides: Any) -> Any:
    """The family's tiny transformers config, vocabulary and special-token ids matching its tokenizer."""
    spec = FAMILIES[family]
    tok = spec.tokenizer()
    ids = dict(vocab_size=len(tok), pad_token_id=tok.pad_token_id)
    if family in ("roberta", "xlm-roberta"):
        ids.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return spec.config_cls(**{**spec.shape, **ids, **overrides})


def save_tiny_family(family: str, folder: Path, head: str = "base", seed: int = 0,
                     **overrides: Any) -> torch.nn.Module:
    """Save a random tiny ``family`` model (``head``: "base", "mlm", "seqcls" or "pretraining") and its tokenizer to
    ``folder`` with ``save_pretrained``; returns the transformers model (eager attention, float32, eval mode)."""
    spec = FAMILIES[family]
    torch.manual_seed(seed)
    cls = spec.heads[head]
    model = cls._from_config(tiny_config(family, **overrides), attn_implementation="eager").eval()
    folder = Path(folder)
    model.save_pretrained(folder)
    spec.tokenizer().save_pretrained(folder)
    return model


def base_model(family: str, model: torch.nn.Module) -> torch.nn.Module:
    """The base encoder inside a transformers task model (the model itself if it is one)."""
    return getattr(model, FAMILIES[family].base_attr, model)
