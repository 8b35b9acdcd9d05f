"""Tokenisation with word alignment, length-sorted batching, and word-level views of piece-level tensors.

Words are tokenised by the model's fast tokenizer (`is_split_into_words=True`, alignment from `word_ids`), so
word boundaries are the corpus's words whatever the tokenizer marks them with (WordPiece `##` continuations,
SentencePiece `▁` word starts, byte-level BPE `Ġ` spaces). Byte-level BPE without `add_prefix_space`
(RoBERTa's default) would tokenise each word as if it began the text, without its `Ġ`; such words get their
leading space, as in running text. Sequences follow the tokenizer's own special-token template, read from the
tokenizer: `[CLS] a [SEP]` / `[CLS] a [SEP] b [SEP]` (token types 0/1) for BERT, `<s> a </s>` /
`<s> a </s></s> b </s>` (token types all 0) for RoBERTa. Sequences longer than `max_length` are cut at a word
boundary, counted in `Encoded.n_truncated`, and reported with a warning: never silently.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from einops import einsum

from .base import Corpus, CorpusError, Sentence


@dataclass
class Batch:
    """One padded batch. Row r holds corpus sentence `sentence_index[r]` (and, in pair mode, sentence
    `pair_index[r]` as segment b, whose words are numbered after segment a's: word j of b has word id
    `n_words_a[r] + j`). Word ids index the sentence's words (words cut off by truncation are absent)."""

    input_ids: torch.Tensor  # [batch, pos] long
    attention_mask: torch.Tensor  # [batch, pos] long: 1 real token, 0 padding
    token_type_ids: torch.Tensor  # [batch, pos] long: 0 segment a (and padding), 1 segment b
    word_ids: torch.Tensor  # [batch, pos] long: word index, -1 for special tokens ([CLS]/[SEP], <s>/</s>) and padding
    special_mask: torch.Tensor  # [batch, pos] bool: True at the special tokens
    sentence_index: list[int]
    n_words: list[int]  # words present in the row (both segments in pair mode)
    truncated: list[bool]
    pair_index: list[int] | None = None
    n_words_a: list[int] | None = None

    def __len__(self) -> int:
        return len(self.sentence_index)

    @property
    def lengths(self) -> torch.Tensor:
        """[batch] number of real tokens (special tokens included) per row."""
        return self.attention_mask.sum(-1)

    def to(self, device: torch.device | str) -> Batch:
        """A copy with every tensor on `device`."""
        tensors = ("input_ids", "attention_mask", "token_type_ids", "word_ids", "special_mask")
        return replace(self, **{name: getattr(self, name).to(device) for name in tensors})


@dataclass
class Encoded:
    """The batches of an encoded corpus; iterate over it for `Batch`es."""

    batches: list[Batch]
    n_truncated: int  # sequences cut to max_length
    n_sequences: int
    max_length: int
    pair: bool
    n_words_dropped: int = 0  # words lost to truncation, all sequences together
    truncated_ids: list[str] = field(default_factory=list)  # ids of truncated sentences (segment a in pairs)

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def encode(corpus: Corpus | Sequence[Sentence], tokenizer, *, max_length: int = 128, batch_size: int = 32,
           pair: bool = False, sort_by_length: bool = True) -> Encoded:
    """Tokenise a corpus into padded batches with word alignment.

    pair: put consecutive sentences (0, 1), (2, 3), ... in one sequence (`[CLS] a [SEP] b [SEP]` for BERT); an odd
        last sentence is left out, with a warning.
    sort_by_length: order sequences longest first before batching (less padding; the largest batch comes
        first, so memory problems show at once); `Batch.sentence_index` maps rows back to the corpus.
    Sequences longer than max_length lose their last whole words (in pair mode, from the longer segment
    first); they are counted in `n_truncated` and a warning says how many.
    """
    sentences = list(corpus)
    _check_arguments(tokenizer, sentences, max_length, batch_size, pair)
    pieces = _word_pieces(sentences, tokenizer)
    template = special_template(tokenizer, pair)
    if pair:
        if len(sentences) % 2:
            warnings.warn(f"pair=True: the last sentence ({sentences[-1].id!r}) has no partner and is left out",
                          stacklevel=2)
        units = [(i, i + 1) for i in range(0, len(sentences) - 1, 2)]
    else:
        units = [(i,) for i in range(len(sentences))]
    rows = [_assemble(template, [pieces[i] for i in unit], [sentences[i] for i in unit], max_length)
            for unit in units]
    order = list(range(len(rows)))
    if sort_by_length:
        order.sort(key=lambda r: -len(rows[r]["ids"]))
    batches = [
        _collate(tokenizer, [(units[r], rows[r]) for r in order[start : start + batch_size]], pair)
        for start in range(0, len(order), batch_size)
    ]
    truncated = [r for r in range(len(rows)) if rows[r]["dropped"]]
    encoded = Encoded(
        batches=batches,
        n_truncated=len(truncated),
        n_sequences=len(rows),
        max_length=max_length,
        pair=pair,
        n_words_dropped=sum(rows[r]["dropped"] for r in truncated),
        truncated_ids=[sentences[units[r][0]].id for r in truncated],
    )
    if truncated:
        warnings.warn(
            f"{len(truncated)} of {len(rows)} sequences were longer than max_length={max_length} and were "
            f"cut at a word boundary ({encoded.n_words_dropped} words dropped); raise max_length to keep them",
            stacklevel=2,
        )
    return encoded


def unencodable(corpus: Corpus | Sequence[Sentence], tokenizer, *, max_length: int = 128) -> dict[str, str]:
    """The sentences `encode` cannot take on their own at ``max_length``: ``{sentence id: why}``, for a first word
    longer than ``max_length`` leaves room for (a 300-character URL) or a word that gives no word pieces. Callers
    leave them out, count them and say so (`options.prepare_inputs` does it for every command's corpus)."""
    sentences = list(corpus)
    if not sentences:
        return {}
    problems: dict[str, str] = {}
    pieces = _word_pieces(sentences, tokenizer, problems)
    budget = max_length - sum(kind == "special" for kind, _, _ in special_template(tokenizer, False))
    for s, words in zip(sentences, pieces, strict=True):
        if words is not None and len(words[0]) > budget:
            problems[s.id] = (f"its first word is {len(words[0])} word pieces, more than max_length={max_length} "
                              "leaves room for")
    return problems


def word_attention(pattern: torch.Tensor, word_ids: torch.Tensor | Sequence[int], *,
                   include_special: bool = False, renormalize: bool = False) -> torch.Tensor:
    """Word-level attention map of ONE sequence.

    pattern: [..., query, key] attention of one sequence (e.g. [head, query, key]); word_ids: [pos] with
    pos == query == key, word index per piece and -1 for special tokens and padding.
    Attention TO a word is the sum over its pieces (keys); FROM a word, the mean over its pieces (queries).
    Returns [..., n_words, n_words]: each row sums to the attention mass the word put on real words
    (special tokens' columns are dropped, nothing is hidden).
    include_special: add a last column with the mass on non-word tokens ([CLS], [SEP], padding), giving
        [..., n_words, n_words + 1] whose rows sum to what the pattern's rows sum to (1 for softmax).
    renormalize: divide each row by its sum, so rows over the returned columns sum to 1.
    Computed in at least float32.
    """
    wids, counts = _check_word_ids(word_ids, pattern.shape[-1], pattern.device, "pattern")
    if pattern.shape[-2] != pattern.shape[-1]:
        raise ValueError(f"pattern must be [..., query, key] of one sequence, got shape {tuple(pattern.shape)}")
    dtype = torch.promote_types(pattern.dtype, torch.float32)
    pattern = pattern.to(dtype)
    assign, mean_from = _assignment(wids, counts, dtype)
    to_words = einsum(pattern, assign, "... q k, k w -> ... q w")
    maps = einsum(to_words, mean_from, "... q w, q v -> ... v w")
    if include_special:
        other = pattern[..., wids < 0].sum(-1)  # [..., q]
        maps = torch.cat([maps, einsum(other, mean_from, "... q, q v -> ... v")[..., None]], dim=-1)
    if renormalize:
        total = maps.sum(-1, keepdim=True)
        maps = torch.where(total > 0, maps / total.clamp_min(torch.finfo(dtype).tiny), 0.0)
    return maps


def word_pool(x: torch.Tensor, word_ids: torch.Tensor | Sequence[int], *, reduce: str = "mean") -> torch.Tensor:
    """Word-level vectors from piece-level ones for ONE sequence.

    x: [..., pos, d]; word_ids: [pos] (-1 = not a word). reduce: "mean" | "sum" | "first" (first piece).
    Returns [..., n_words, d].
    """
    wids, counts = _check_word_ids(word_ids, x.shape[-2], x.device, "x")
    if reduce == "first":
        first = torch.stack([torch.nonzero(wids == w)[0, 0] for w in range(len(counts))])
        return x[..., first, :]
    if reduce not in ("mean", "sum"):
        raise ValueError(f"reduce must be 'mean', 'sum' or 'first', got {reduce!r}")
    dtype = torch.promote_types(x.dtype, torch.float32)
    assign, mean_from = _assignment(wids, counts, dtype)
    return einsum(x.to(dtype), mean_from if reduce == "mean" else assign, "... p d, p w -> ... w d")


# ----------------------------------------------------------------------------------------------------------


def _check_arguments(tokenizer, sentences: list[Sentence], max_length: int, batch_size: int, pair: bool) -> None:
    if tokenizer is None or not getattr(tokenizer, "is_fast", False):
        raise CorpusError("encode needs a fast (Rust) tokenizer for word alignment, e.g. model.tokenizer or "
                          "transformers.AutoTokenizer.from_pretrained(path, use_fast=True)")
    if getattr(tokenizer, "pad_token_id", None) is None:
        raise CorpusError("the tokenizer has no pad_token_id; encode pads batches with it")
    minimum = tokenizer.num_special_tokens_to_add(pair=pair) + (2 if pair else 1)
    if not isinstance(max_length, int) or max_length < minimum:
        raise ValueError(f"max_length must be an integer >= {minimum} (special tokens plus one word piece"
                         f"{' per segment' if pair else ''}), got {max_length!r}")
    if max_length > tokenizer.model_max_length:
        raise ValueError(f"max_length={max_length} exceeds the tokenizer's model_max_length="
                         f"{tokenizer.model_max_length} (the model's position table); lower it")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if len(sentences) < (2 if pair else 1):
        raise CorpusError(f"nothing to encode: {len(sentences)} sentence(s){' (pair=True needs 2)' if pair else ''}")


def special_template(tokenizer, pair: bool) -> list[tuple[str, int, int]]:
    """The tokenizer's sequence layout as ``(kind, value, token_type)`` items: ``("special", token_id, type)`` or
    ``("segment", index, type)``; e.g. BERT pair: [CLS] a [SEP] b [SEP] with types 0 0 0 1 1. Read from the
    tokenizer by encoding one-word segments, so it is whatever the tokenizer's post-processor builds."""
    probe = [["a"], ["b"]] if pair else [["a"]]
    enc = tokenizer(*probe, is_split_into_words=True, add_special_tokens=True, return_token_type_ids=True)
    types = enc.get("token_type_ids") or [0] * len(enc["input_ids"])
    items: list[tuple[str, int, int]] = []
    for token, segment, kind in zip(enc["input_ids"], enc.sequence_ids(), types, strict=True):
        if segment is None:
            items.append(("special", token, kind))
        elif not items or items[-1][:2] != ("segment", segment):
            items.append(("segment", segment, kind))
    if [v for k, v, _ in items if k == "segment"] != list(range(len(probe))):
        raise CorpusError(f"cannot read the tokenizer's special-token template from {items}")
    return items


def _word_prefix(tokenizer) -> str:
    """" " when the tokenizer drops a word's leading-space marker on pre-split words (byte-level BPE without
    add_prefix_space: "cat" alone gives `cat`, inside a sentence `Ġcat`) and a leading space restores it; else ""."""
    def last_word(words: list[str]) -> list[int]:
        enc = tokenizer(words, is_split_into_words=True, add_special_tokens=False)
        return [t for t, w in zip(enc["input_ids"], enc.word_ids(), strict=True) if w == len(words) - 1]

    in_text = tokenizer(" cat", add_special_tokens=False)["input_ids"]
    if last_word(["the", "cat"]) == in_text or last_word(["the", " cat"]) != in_text:
        return ""
    return " "


def _word_pieces(sentences: list[Sentence], tokenizer,
                 problems: dict[str, str] | None = None) -> list[list[list[int]]]:
    """Piece ids per word per sentence; every word must give at least one piece.

    A sentence with multiword tokens (`Sentence.multiword`, e.g. `don't` = `do` + `n't`) is tokenised from its
    surface tokens; the pieces of a multiword token go to its syntactic words by character offset (the piece
    starting at a character of `do` belongs to `do`; boundaries from the words' forms when they spell the
    surface form, else in proportion to their lengths). Where the surface form gives fewer pieces than it has
    words (`its` = `it` + `s` as one piece), that token falls back to its syntactic words' own pieces.
    ``problems`` given: a sentence with a word that gives no pieces is recorded there (id -> why) and gets ``None``
    instead of raising `CorpusError`."""
    prefix = _word_prefix(tokenizer)
    units = [[(form, idx) for form, idx in s.surface_tokens()] for s in sentences]
    enc = tokenizer([[prefix + form for form, _ in u] for u in units], is_split_into_words=True,
                    add_special_tokens=False, verbose=False, return_offsets_mapping=True)
    out = []
    for i, s in enumerate(sentences):
        words: list[list[int]] = [[] for _ in s.words]
        by_unit: list[list[tuple[int, int]]] = [[] for _ in units[i]]
        for piece, u, (start, _) in zip(enc["input_ids"][i], enc.word_ids(i), enc["offset_mapping"][i], strict=True):
            by_unit[u].append((piece, max(start - len(prefix), 0)))
        for (form, idx), pieces in zip(units[i], by_unit, strict=True):
            if len(idx) == 1:
                words[idx[0]] += [p for p, _ in pieces]
                continue
            split = _split_multiword(form, [s.words[j] for j in idx], pieces)
            if split is None:  # fewer pieces than words: read the syntactic words themselves
                sub = tokenizer([prefix + s.words[j] for j in idx], is_split_into_words=True,
                                add_special_tokens=False)
                split = [[] for _ in idx]
                for piece, w in zip(sub["input_ids"], sub.word_ids(), strict=True):
                    split[w].append(piece)
            for j, part in zip(idx, split, strict=True):
                words[j] += part
        empty = [j for j, p in enumerate(words) if not p]
        if empty and problems is not None:
            problems[s.id] = f"word {empty[0] + 1} ({s.words[empty[0]]!r}) gives no word pieces"
            out.append(None)  # type: ignore[arg-type]
            continue
        if empty:
            raise CorpusError(f"sentence {s.id!r}: word {empty[0] + 1} ({s.words[empty[0]]!r}) gives no word "
                              "pieces with this tokenizer (e.g. only control or zero-width characters); "
                              "remove it from the corpus")
        out.append(words)
    return out


def _split_multiword(form: str, words: list[str], pieces: list[tuple[int, int]]) -> list[list[int]] | None:
    """The pieces (id, start character in `form`) of one multiword token shared among its syntactic `words`;
    None when some word would get no piece."""
    lengths = [len(w) for w in words]
    if "".join(words).casefold() == form.casefold():
        bounds = [sum(lengths[: j + 1]) for j in range(len(words))]
    else:
        total = sum(lengths)
        bounds = [round(sum(lengths[: j + 1]) * len(form) / total) for j in range(len(words))]
    parts: list[list[int]] = [[] for _ in words]
    for piece, start in pieces:
        parts[next((j for j, b in enumerate(bounds) if start < b), len(words) - 1)].append(piece)
    return parts if all(parts) else None


def _assemble(template: list[tuple[str, int, int]], segments: list[list[list[int]]], sentences: list[Sentence],
              max_length: int) -> dict:
    """One sequence laid out as the tokenizer's ``template`` (e.g. [CLS] a [SEP] (b [SEP])); whole words dropped
    from the end of the longest segment until it fits. Returns ids, types, wids (per position), n_words per
    segment, words dropped."""
    kept = [len(words) for words in segments]
    sizes = [[len(p) for p in words] for words in segments]
    budget = max_length - sum(kind == "special" for kind, _, _ in template)
    while sum(sum(s[:k]) for s, k in zip(sizes, kept, strict=True)) > budget:
        longest = max(range(len(segments)), key=lambda g: sum(sizes[g][: kept[g]]))
        kept[longest] -= 1
        if kept[longest] == 0:
            raise CorpusError(f"sentence {sentences[longest].id!r}: max_length={max_length} leaves no room for "
                              f"even its first word ({sizes[longest][0]} pieces); raise max_length")
    ids: list[int] = []
    types: list[int] = []
    wids: list[int] = []
    first_word = [sum(kept[:g]) for g in range(len(segments))]
    for kind, value, token_type in template:
        if kind == "special":
            ids.append(value)
            wids.append(-1)
            types.append(token_type)
            continue
        for j, word_pieces in enumerate(segments[value][: kept[value]]):
            ids += word_pieces
            wids += [first_word[value] + j] * len(word_pieces)
            types += [token_type] * len(word_pieces)
    return {"ids": ids, "types": types, "wids": wids, "kept": kept,
            "dropped": sum(len(words) for words in segments) - sum(kept)}


def _collate(tokenizer, rows: list[tuple[tuple[int, ...], dict]], pair: bool) -> Batch:
    width = max(len(row["ids"]) for _, row in rows)

    def pad(key: str, value: int) -> torch.Tensor:
        return torch.tensor([row[key] + [value] * (width - len(row[key])) for _, row in rows], dtype=torch.long)

    input_ids = pad("ids", tokenizer.pad_token_id)
    attention_mask = torch.tensor([[1] * len(row["ids"]) + [0] * (width - len(row["ids"])) for _, row in rows])
    word_ids = pad("wids", -1)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        token_type_ids=pad("types", 0),
        word_ids=word_ids,
        special_mask=(word_ids < 0) & attention_mask.bool(),
        sentence_index=[unit[0] for unit, _ in rows],
        n_words=[sum(row["kept"]) for _, row in rows],
        truncated=[row["dropped"] > 0 for _, row in rows],
        pair_index=[unit[1] for unit, _ in rows] if pair else None,
        n_words_a=[row["kept"][0] for _, row in rows] if pair else None,
    )


def _check_word_ids(word_ids, pos: int, device: torch.device, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """word_ids as a long tensor [pos] and piece counts per word [n_words]; words must be 0..n-1, all present."""
    wids = torch.as_tensor(word_ids, dtype=torch.long, device=device)
    if wids.ndim != 1 or wids.shape[0] != pos:
        raise ValueError(f"word_ids must be [pos] with pos={pos} to match {what}; got shape {tuple(wids.shape)} "
                         "(pass one sequence's row, e.g. batch.word_ids[b])")
    if (wids < -1).any():
        raise ValueError("word_ids must be -1 (not a word) or a word index >= 0")
    if not (wids >= 0).any():
        raise ValueError("word_ids contain no words (all -1)")
    counts = torch.bincount(wids[wids >= 0])
    if (counts == 0).any():
        missing = int(torch.nonzero(counts == 0)[0, 0])
        raise ValueError(f"word_ids skip word {missing}; words must be numbered 0..n-1 with no gaps")
    return wids, counts


def _assignment(wids: torch.Tensor, counts: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """[pos, n_words] one-hot piece->word matrix, and the same divided by each word's piece count."""
    assign = F.one_hot(wids.clamp_min(0), len(counts)).to(dtype) * (wids >= 0)[:, None].to(dtype)
    return assign, assign / counts.to(dtype)
