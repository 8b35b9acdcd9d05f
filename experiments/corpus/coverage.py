"""How much of a corpus a model's vocabulary covers: the share of word pieces that are the unknown token.

A model whose vocabulary lacks a script turns its words into ``[UNK]``; every measurement on such a corpus
reads one token over and over. ``unk_warning`` says so (the share, the scripts of the unknown words, a model
whose vocabulary covers them) when at least ``UNK_WARN_SHARE`` of the pieces are unknown.
"""

from __future__ import annotations

import unicodedata
import warnings
from collections import Counter
from collections.abc import Sequence
from typing import Any

#: Warn when at least this share of a corpus's word pieces (special tokens aside) is the unknown token.
UNK_WARN_SHARE = 0.5
#: Sentences read to estimate the share (the first ones, in corpus order).
SAMPLE_SENTENCES = 500

_MULTILINGUAL = "bert-base-multilingual-cased or xlm-roberta-base"
#: Models whose vocabularies cover a script, by the script's Unicode name prefix.
SUGGESTIONS = {
    "HANGUL": "klue/bert-base (Korean), or " + _MULTILINGUAL,
    "CJK": "bert-base-chinese (Chinese), cl-tohoku/bert-base-japanese (Japanese), or " + _MULTILINGUAL,
    "HIRAGANA": "cl-tohoku/bert-base-japanese (Japanese), or " + _MULTILINGUAL,
    "KATAKANA": "cl-tohoku/bert-base-japanese (Japanese), or " + _MULTILINGUAL,
    "ARABIC": "aubmindlab/bert-base-arabertv2 (Arabic), or " + _MULTILINGUAL,
}


class UnknownTokensWarning(UserWarning):
    """Most of a corpus is the unknown token for this model's vocabulary."""


def unk_share(tokenizer: Any, texts: Sequence[str]) -> tuple[float, int, Counter]:
    """``(share, pieces, scripts)``: the share of the texts' word pieces (special tokens aside) that are the
    tokenizer's unknown token, how many pieces were read, and the scripts of the words that became unknown
    (``Counter`` of Unicode script names). ``share`` is 0 for a tokenizer without an unknown token."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or not texts:
        return 0.0, 0, Counter()
    specials = set(getattr(tokenizer, "all_special_ids", [])) - {unk}
    words = [w for text in texts[:SAMPLE_SENTENCES] for w in text.split()]
    if not words:
        return 0.0, 0, Counter()
    pieces = unknown = 0
    scripts: Counter = Counter()
    for word, ids in zip(words, tokenizer(words, add_special_tokens=False)["input_ids"], strict=True):
        ids = [i for i in ids if i not in specials]
        pieces += len(ids)
        n_unk = sum(i == unk for i in ids)
        if n_unk:
            unknown += n_unk
            scripts.update(_script(c) for c in word if c.isalpha() or unicodedata.category(c).startswith("S"))
    return (unknown / pieces if pieces else 0.0), pieces, scripts


def unk_warning(tokenizer: Any, texts: Sequence[str], model_name: str = "the model") -> str | None:
    """One line saying that at least ``UNK_WARN_SHARE`` of the corpus is ``[UNK]`` for this vocabulary (what
    share, which scripts, a model whose vocabulary covers them), or None."""
    share, pieces, scripts = unk_share(tokenizer, texts)
    if pieces == 0 or share < UNK_WARN_SHARE:
        return None
    unk = getattr(tokenizer, "unk_token", "[UNK]")
    top = [s for s, _ in scripts.most_common(3)]
    suggestion = next((SUGGESTIONS[s] for s in top if s in SUGGESTIONS), _MULTILINGUAL)
    where = f" (the unknown words are in {', '.join(_readable(s) for s in top)} script)" if top else ""
    return (f"{share:.0%} of the corpus's {pieces:,} word pieces are {unk} for {model_name}'s vocabulary{where}: "
            f"its results would describe one token over and over. Use a model whose vocabulary covers the text, "
            f"e.g. {suggestion} (--model with a local folder or a hub id in the local cache).")


def warn_if_mostly_unknown(tokenizer: Any, texts: Sequence[str], model_name: str = "the model") -> str | None:
    """``unk_warning``, emitted as an ``UnknownTokensWarning`` when there is one; returns it."""
    message = unk_warning(tokenizer, texts, model_name)
    if message is not None:
        warnings.warn(message, UnknownTokensWarning, stacklevel=2)
    return message


def _script(c: str) -> str:
    name = unicodedata.name(c, "UNKNOWN")
    if name.startswith("CJK"):
        return "CJK"
    return name.split(" ")[0]


def _readable(script: str) -> str:
    return {"CJK": "Chinese/Japanese (CJK)"}.get(script, script.capitalize())
