"""What the explorer page shows, as arrays: per sentence, its real tokens and ``[layer, head, query, key]`` maps.

Two steps, both pure apart from the model's forward pass:

1. ``capture`` runs the model once per chunk of texts and returns, per sentence, the attention pattern and
   the queries and keys, restricted to the sentence's real tokens (padding dropped).
2. ``encode_map`` / ``encode_qk`` quantise those arrays for the page (uint8 / int8, zlib, base64); the page's
   script reverses them (``explorer.js``: ``decodeMap`` and ``decodeQK``). ``decode_map`` and ``decode_qk``
   are the same decoding in Python, so that tests can pin the format from both sides.

A *map* is anything shaped ``[layer, head, query, key]`` over one sentence's real tokens: attention
probabilities, or a context-mixing method's contributions (one "head" when the method is per layer only).
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from einops import rearrange

#: Levels of the uint8 map code: value = lo + byte / MAP_LEVELS * (hi - lo).
MAP_LEVELS = 255
#: Levels of the int8 query/key code: value = byte * scale, |byte| <= QK_LEVELS.
QK_LEVELS = 127


@dataclass
class SentenceData:
    """One sentence as the explorer shows it.

    ``tokens``: its real tokens (no padding), ``n`` of them. ``maps``: method id -> ``[layer, head, n, n]``
    float array (``head`` is 1 for per-layer methods). ``q`` and ``k``: ``[layer, n, head, d_head]`` float
    arrays for the query-key view, or None when not embedded. ``segments``: for a sentence pair, each token's
    segment (0 = A, 1 = B; a separator belongs to the segment it closes), else None. ``latents``: ``[latent,
    n]`` activations of a dictionary's chosen latents at each token (the latent view), else None.
    """

    text: str
    tokens: list[str]
    maps: dict[str, np.ndarray] = field(default_factory=dict)
    q: np.ndarray | None = None
    k: np.ndarray | None = None
    segments: list[int] | None = None
    latents: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if self.latents is not None:
            self.latents = np.asarray(self.latents, dtype=np.float32)
            if self.latents.ndim != 2 or self.latents.shape[1] != n or not np.isfinite(self.latents).all():
                raise ValueError(f"latents must be finite [latent, {n}] activations, got {self.latents.shape}")
        if self.segments is not None:
            self.segments = [int(x) for x in self.segments]
            if len(self.segments) != n or not set(self.segments) <= {0, 1}:
                raise ValueError(f"segments must give 0 (A) or 1 (B) for each of the {n} tokens, got {self.segments}")
        for method, m in self.maps.items():
            if m.ndim != 4 or m.shape[2:] != (n, n):
                raise ValueError(f"map {method!r} must be [layer, head, {n}, {n}], got {tuple(m.shape)}")
            if not np.isfinite(m).all():
                raise ValueError(f"map {method!r} has non-finite values")
        if (self.q is None) != (self.k is None):
            raise ValueError("q and k come together or not at all")
        if self.q is not None and (self.q.shape != self.k.shape or self.q.ndim != 4 or self.q.shape[1] != n):
            raise ValueError(f"q and k must both be [layer, {n}, head, d_head], got {self.q.shape} and {self.k.shape}")


@dataclass
class Captured:
    """``capture``'s result: per sentence, real tokens, ``pattern`` ``[layer, head, n, n]`` and, when asked,
    ``q``/``k`` ``[layer, n, head, d_head]`` (numpy float32). ``positions[i]``: the sentence's real positions
    in the padded batch ``model.tokenize(texts)`` (to slice maps computed on that batch)."""

    tokens: list[list[str]]
    positions: list[np.ndarray]
    pattern: list[np.ndarray]
    q: list[np.ndarray | None]
    k: list[np.ndarray | None]


def capture(
    model, inputs: Mapping[str, torch.Tensor], *, qk: Sequence[bool] | None = None, batch_size: int = 8
) -> Captured:
    """Run ``model`` on ``inputs`` (``model.tokenize(texts)``: ``input_ids``, ``attention_mask`` ``[batch,
    pos]``, optional ``token_type_ids``) and keep, per sentence, only its real tokens: the attention pattern
    (``blocks.{L}.attn.hook_pattern``) and, where ``qk[i]`` (default: all), the queries and keys
    (``blocks.{L}.attn.hook_q`` / ``hook_k``). Chunks of ``batch_size`` sentences bound memory."""
    n_texts = int(inputs["input_ids"].shape[0])
    if qk is None:
        qk = [True] * n_texts
    mask = inputs["attention_mask"].bool()
    n_layers = model.config.n_layers
    tokens, positions, patterns, qs, ks = [], [], [], [], []
    for start in range(0, n_texts, batch_size):
        chunk = {k: v[start : start + batch_size] for k, v in inputs.items()}
        want_qk = any(qk[start : start + batch_size])
        suffixes = ("attn.hook_pattern", "attn.hook_q", "attn.hook_k") if want_qk else ("attn.hook_pattern",)
        with torch.inference_mode():
            _, cache = model.run_with_cache(
                chunk["input_ids"],
                chunk["attention_mask"],
                chunk.get("token_type_ids"),
                names_filter=lambda name, s=suffixes: name.endswith(s),
            )
        pattern = torch.stack([cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(n_layers)], dim=1)
        if want_qk:
            q = torch.stack([cache[f"blocks.{layer}.attn.hook_q"] for layer in range(n_layers)], dim=1)
            k = torch.stack([cache[f"blocks.{layer}.attn.hook_k"] for layer in range(n_layers)], dim=1)
        for b in range(pattern.shape[0]):
            i = start + b
            real = mask[i].nonzero().flatten()
            ids = inputs["input_ids"][i, real].tolist()
            tokens.append([str(t) for t in model.tokenizer.convert_ids_to_tokens(ids)])
            positions.append(real.cpu().numpy())
            patterns.append(_real(pattern[b][:, :, real][:, :, :, real]))
            qs.append(_real(q[b][:, real]) if qk[i] else None)
            ks.append(_real(k[b][:, real]) if qk[i] else None)
    return Captured(tokens, positions, patterns, qs, ks)


def _real(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).numpy().copy()


def sentence_maps(
    value, n_sentences: int, positions: Sequence[np.ndarray], padded_len: int, name: str
) -> list[np.ndarray]:
    """Normalise a user's maps for one method to ``[layer, head, n, n]`` per sentence.

    ``value``: a tensor/array ``[batch, layer, query, key]`` or ``[batch, layer, head, query, key]`` over the
    padded batch (``query``/``key`` = ``padded_len``), or a sequence of per-sentence ``[layer, query, key]`` /
    ``[layer, head, query, key]`` over either the padded length or the sentence's real length."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        arr = _as_numpy(value)
        if arr.ndim not in (4, 5):
            raise ValueError(
                f"maps[{name!r}] must be [batch, layer, query, key] or [batch, layer, head, query, key], "
                f"got shape {tuple(arr.shape)}"
            )
        if arr.shape[0] != n_sentences:
            raise ValueError(f"maps[{name!r}] has {arr.shape[0]} sentences, expected {n_sentences}")
        value = list(arr)
    if not isinstance(value, Sequence) or len(value) != n_sentences:
        raise ValueError(f"maps[{name!r}] must give one map per text ({n_sentences})")
    out = []
    for i, (m, real) in enumerate(zip(value, positions, strict=True)):
        arr = _as_numpy(m)
        if arr.ndim == 3:
            arr = arr[:, None]
        if arr.ndim != 4:
            raise ValueError(f"maps[{name!r}][{i}] must be [layer, query, key] or [layer, head, query, key]")
        n = len(real)
        if arr.shape[2:] == (padded_len, padded_len):
            arr = arr[:, :, real][:, :, :, real]
        elif arr.shape[2:] != (n, n):
            raise ValueError(
                f"maps[{name!r}][{i}] is {arr.shape[2]}x{arr.shape[3]} over query x key; expected the padded "
                f"length {padded_len} or the sentence's {n} real tokens"
            )
        out.append(np.ascontiguousarray(arr, dtype=np.float32))
    return out


def _as_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float32).numpy()
    return np.asarray(x, dtype=np.float32)


# ---------------------------------------------------------------------------------------------- codes
def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def encode_map(m: np.ndarray) -> dict:
    """Quantise one map ``[layer, head, n, n]`` (query, key) for the page.

    Values within [0, 1] everywhere (probabilities, normalised contributions) are coded on that fixed scale,
    ``lo = 0``, ``hi = 1`` for every (layer, head): a step of 1/255, and the many near-zero weights become
    exact zeros. Otherwise each (layer, head) gets its own ``lo = min(0, min)``, ``hi = max(0, max)``. The
    code is ``round((v - lo) / (hi - lo) * 255)`` (uint8), stored key-major ``[layer, head, key, query]``
    (deflate finds the long runs of the near-zero columns: about 8% smaller on the bundled model). Returns
    ``{"lo", "hi"}`` (base64 float32 ``[layer * head]``) and ``"data"`` (base64 of the zlib stream).
    """
    flat = rearrange(m, "l h q k -> (l h) (k q)")
    if flat.size and (flat.min() < 0 or flat.max() > 1):
        lo = np.minimum(flat.min(axis=1), 0.0)
        hi = np.maximum(flat.max(axis=1), 0.0)
        hi = np.where(hi > lo, hi, lo + 1.0)
    else:
        lo, hi = np.zeros(len(flat)), np.ones(len(flat))
    code = np.rint((flat - lo[:, None]) / (hi - lo)[:, None] * MAP_LEVELS).clip(0, MAP_LEVELS).astype(np.uint8)
    return {
        "lo": _b64(lo.astype("<f4").tobytes()),
        "hi": _b64(hi.astype("<f4").tobytes()),
        "data": _b64(zlib.compress(code.tobytes(), 9)),
    }


def decode_map(encoded: Mapping, shape: tuple[int, int, int, int]) -> np.ndarray:
    """Invert ``encode_map`` (up to quantisation): ``[layer, head, n, n]`` (query, key) float32."""
    layers, heads, n, _ = shape
    lo = np.frombuffer(base64.b64decode(encoded["lo"]), "<f4")
    hi = np.frombuffer(base64.b64decode(encoded["hi"]), "<f4")
    code = np.frombuffer(zlib.decompress(base64.b64decode(encoded["data"])), np.uint8).reshape(len(lo), -1)
    flat = lo[:, None] + code.astype(np.float32) / MAP_LEVELS * (hi - lo)[:, None]
    return rearrange(flat, "(l h) (k q) -> l h q k", l=layers, h=heads, k=n, q=n).astype(np.float32)


def encode_qk(q: np.ndarray, k: np.ndarray) -> dict:
    """Quantise queries and keys ``[layer, n, head, d_head]`` for the query-key view.

    Stored as int8 ``[2 (q, k), layer, head, n, d_head]`` with one scale ``max|x| / 127`` per (q|k, layer,
    head, dimension): BERT's queries and keys have a few outlier dimensions, and a scale shared with them
    would leave the others a handful of levels. Returns ``"layers"``, ``"heads"``, ``"scale"`` (base64
    float32 ``[2 * layer * head * d_head]``) and ``"data"`` (base64 of zlib-compressed int8).
    """
    qk = rearrange(np.stack([q, k]), "two l n h d -> (two l h) n d")
    scale = np.abs(qk).max(axis=1) / QK_LEVELS
    scale = np.where(scale > 0, scale, 1.0)
    code = np.rint(qk / scale[:, None, :]).clip(-QK_LEVELS, QK_LEVELS).astype(np.int8)
    return {
        "layers": int(q.shape[0]),
        "heads": int(q.shape[2]),
        "scale": _b64(scale.astype("<f4").tobytes()),
        "data": _b64(zlib.compress(code.tobytes(), 9)),
    }


def decode_qk(encoded: Mapping, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Invert ``encode_qk`` (up to quantisation) for ``n`` tokens: ``q``, ``k`` ``[layer, n, head, d_head]``."""
    n_layers, n_heads = encoded["layers"], encoded["heads"]
    scale = np.frombuffer(base64.b64decode(encoded["scale"]), "<f4").reshape(2 * n_layers * n_heads, 1, -1)
    code = np.frombuffer(zlib.decompress(base64.b64decode(encoded["data"])), np.int8)
    flat = code.reshape(len(scale), n, -1).astype(np.float32) * scale
    q, k = rearrange(flat, "(two l h) n d -> two l n h d", two=2, l=n_layers, h=n_heads)
    return q, k


def pair_segments(tokenizer, texts: Sequence[str], pairs: Sequence[str], positions: Sequence[np.ndarray]) -> list[
        list[int]]:
    """Each real token's segment (0 = A, 1 = B) for ``tokenizer(texts, pairs)`` padded as ``model.tokenize`` pads,
    at the real ``positions`` of each row. Special tokens join the segment before them (BERT's ``[CLS] A [SEP]``
    is A, the last ``[SEP]`` is B), as BERT's token types say; this works for tokenizers without token types
    (RoBERTa's ``</s></s>`` between the segments belongs to A)."""
    enc = tokenizer(list(texts), list(pairs), padding=True, truncation=False)
    out = []
    for i, real in enumerate(positions):
        if getattr(enc, "is_fast", False):
            ids = enc.sequence_ids(i)
        else:
            ids = enc.get("token_type_ids", [[0] * len(enc["input_ids"][i])] * (i + 1))[i]
        segs, last = [], 0
        for p in real.tolist():
            last = last if ids[p] is None else int(ids[p])
            segs.append(last)
        out.append(segs)
    return out


def attention_tuple(attentions, tokens) -> tuple[np.ndarray, list[list[str]]]:
    """transformers' ``output_attentions`` (a tuple of ``n_layers`` tensors ``[batch, head, query, key]``, as
    bertviz takes it) and the tokens (one list for a batch of one, or one list per row) -> the stacked
    ``[batch, layer, head, query, key]`` array and one token list per row. A row shorter than the padded length
    is read as right-padded (its tokens are the first positions)."""
    if isinstance(attentions, torch.Tensor) and attentions.dim() == 5:
        attentions = tuple(attentions)
    if not isinstance(attentions, (tuple, list)) or not attentions or not all(
            isinstance(a, (torch.Tensor, np.ndarray)) for a in attentions):
        raise TypeError("attentions must be transformers' output_attentions: a tuple of one [batch, head, query, key] "
                        "tensor per layer (run the model with output_attentions=True, attn_implementation='eager')")
    arr = np.stack([_as_numpy(a) for a in attentions], axis=1)
    if arr.ndim != 5 or arr.shape[-1] != arr.shape[-2]:
        raise ValueError(f"each layer's attention must be [batch, head, query, key], got {tuple(arr.shape[0:1])} + "
                         f"{tuple(arr.shape[2:])}")
    if isinstance(tokens, (list, tuple)) and tokens and all(isinstance(t, str) for t in tokens):
        tokens = [list(tokens)]
    if not isinstance(tokens, (list, tuple)) or not all(
            isinstance(row, (list, tuple)) and all(isinstance(t, str) for t in row) for row in tokens):
        raise TypeError("tokens must be a list of token strings (e.g. tokenizer.convert_ids_to_tokens(ids)), or one "
                        "such list per batch row")
    if len(tokens) != arr.shape[0]:
        raise ValueError(f"the attentions hold {arr.shape[0]} rows but {len(tokens)} token lists were given")
    n_pos = arr.shape[-1]
    for i, row in enumerate(tokens):
        if not 0 < len(row) <= n_pos or (arr.shape[0] == 1 and len(row) != n_pos):
            raise ValueError(f"row {i} has {len(row)} tokens but the attention is over {n_pos} positions")
    return arr, [list(row) for row in tokens]
