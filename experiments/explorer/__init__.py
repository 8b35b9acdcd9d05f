"""Interactive attention (and context-mixing) explorer: one offline HTML page per set of sentences.

>>> import bertscope
>>> model = bertscope.load()
>>> view = bertscope.explore(model, ["The cat sat on the mat.", "A dog barked."])
>>> view                     # in Jupyter: the page, inline
>>> view.save("explore.html")

Each sentence gets a head view (lines from each token to the tokens it attends to, for a layer and a set of
heads), a model view (every layer x head as a thumbnail; click one to open it in the head view) and a
query-key view (for one token and head: q, each key's k, q*k elementwise, q.k/sqrt(d_head) and the softmax).
Other ``[layer, query, key]`` maps, e.g. context-mixing contributions, come in through ``maps=`` and get the
same views, chosen in a menu. With ``dictionary=`` (a saved sparse dictionary) and ``latents=``, a latent view
colours each token by the chosen latent's activation (``explorer.latents``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bertscope.experiments.explorer import data, page
from bertscope.experiments.explorer import latents as latents_mod
from bertscope.experiments.explorer.data import SentenceData, capture, decode_map, decode_qk, encode_map, encode_qk
from bertscope.experiments.naming import model_label

#: Default budget for embedded queries and keys (raw int8 bytes): sentences get them, in order, while the total
#: stays within it (the first sentence always does). Each token costs 2 * n_layers * d_model bytes (4.6 kB for the
#: bundled model), so the default keeps a 10 x 128-token explorer under 5 MB.
QK_AUTO_BYTES = 600_000

__all__ = [
    "QK_AUTO_BYTES",
    "MIXING_LABELS",
    "Explorer",
    "SentenceData",
    "build",
    "capture",
    "decode_map",
    "decode_qk",
    "encode_map",
    "encode_qk",
    "explore",
    "from_attentions",
    "mixing_maps",
    "mixing_methods",
]


#: Menu names for the context-mixing methods ``mixing=`` computes (others are shown by their id).
MIXING_LABELS = {
    "attention_norm": "attention norm (Kobayashi et al. 2020)",
    "residual_norm": "attention + residual norm (Kobayashi et al. 2021)",
    "alti": "ALTI (Ferrando et al. 2022)",
    "value_zeroing": "value zeroing (Mohebbi et al. 2023)",
    "rollout:attention": "attention rollout (Abnar & Zuidema 2020)",
    "flow:attention": "attention flow (Abnar & Zuidema 2020)",
}


def mixing_methods(mixing: str | Sequence[str] | None) -> list[str]:
    """``"alti,attention_norm"`` or ``["alti", ...]`` -> checked method names (token-to-token methods of
    ``hooks.mixing.METHODS``, not "attention", which the explorer shows per head already); ``ValueError``
    naming the choices otherwise."""
    from bertscope.hooks import mixing as mixing_mod

    if mixing is None:
        return []
    names = [m.strip() for m in mixing.split(",")] if isinstance(mixing, str) else [str(m).strip() for m in mixing]
    allowed = [m for m in mixing_mod.METHODS if m not in mixing_mod.INPUT_ATTRIBUTIONS and m != "attention"]
    bad = [m for m in names if m not in allowed]
    if bad or not names:
        raise ValueError(f"unknown mixing method {', '.join(bad) or '(none)'}; choose from {', '.join(allowed)}")
    return list(dict.fromkeys(names))


def mixing_maps(model, inputs, mixing: str | Sequence[str] | None) -> dict[str, object]:
    """Method -> ``hooks.contributions(model, inputs, method)`` ``[batch, layer, query, key]`` for each of
    ``mixing_methods(mixing)``."""
    from bertscope.hooks.mixing import contributions

    return {m: contributions(model, inputs, m).detach().float().cpu() for m in mixing_methods(mixing)}


class Explorer:
    """A rendered explorer: ``html()`` is the whole page; ``save(path)`` writes it; Jupyter shows it inline.

    ``payload`` (the JSON the page reads) is ``{"format", "title", "model": {"name", "d_head"}, "methods":
    [{"id", "label", "layers", "heads", "vmax"}], "sentences": [{"text", "tokens", "maps": {method id:
    encode_map(...)}, "qk": encode_qk(...) | None}]}``. The first method is the one shown first.
    """

    def __init__(self, payload: dict) -> None:
        self.payload = payload
        self._html: str | None = None

    def html(self) -> str:
        """The self-contained HTML document."""
        if self._html is None:
            self._html = page.render(self.payload, self.payload.get("title", "bertscope explorer"))
        return self._html

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the page to ``path`` (atomically) and return the path."""
        from bertscope.experiments.io import write_text

        return write_text(path, self.html())

    def _repr_html_(self) -> str:
        return page.iframe(self.html())

    @property
    def nbytes(self) -> int:
        """Size of the page in bytes (UTF-8)."""
        return len(self.html().encode("utf-8"))

    def __repr__(self) -> str:
        n = len(self.payload["sentences"])
        methods = ", ".join(m["id"] for m in self.payload["methods"])
        return f"<Explorer: {n} sentence(s); methods: {methods}; {self.nbytes / 1e6:.2f} MB>"


def build(
    sentences: Sequence[SentenceData],
    *,
    labels: Mapping[str, str] | None = None,
    vmax: Mapping[str, float] | None = None,
    model_name: str = "",
    title: str = "bertscope explorer",
    latents: Mapping | None = None,
) -> Explorer:
    """An ``Explorer`` from arrays (no model needed). Every sentence must carry the same methods, each with the
    same number of layers and heads; ``labels`` names them in the menu (default: the id); ``vmax`` fixes the
    value a line at full opacity stands for (default: the largest |value| of that method). ``latents``: the
    latent view's description (`latents.describe`); every sentence then carries ``latents`` ``[latent, n]``."""
    if not sentences:
        raise ValueError("no sentences to explore")
    methods = list(sentences[0].maps)
    if not methods:
        raise ValueError("sentences carry no maps")
    labels, vmax = dict(labels or {}), dict(vmax or {})
    described = []
    for method in methods:
        shapes = {s.maps[method].shape[:2] if method in s.maps else None for s in sentences}
        if len(shapes) != 1 or None in shapes or set().union(*(s.maps.keys() for s in sentences)) != set(methods):
            raise ValueError(f"every sentence needs the same methods with the same [layer, head]; {method!r} differs")
        (layers, heads), = shapes
        top = vmax.get(method) or max(float(np.abs(s.maps[method]).max(initial=0.0)) for s in sentences) or 1.0
        described.append(
            {"id": method, "label": labels.get(method, method), "layers": layers, "heads": heads, "vmax": top}
        )
    d_head = next((int(s.q.shape[-1]) for s in sentences if s.q is not None), 0)
    if latents is not None and any(s.latents is None or len(s.latents) != len(latents["ids"]) for s in sentences):
        raise ValueError(f"every sentence needs the activations of the {len(latents['ids'])} latent(s) shown")
    payload = {
        "format": page.FORMAT,
        "title": title,
        "model": {"name": model_name, "d_head": d_head},
        "methods": described,
        "sentences": [
            {
                "text": s.text,
                "tokens": list(s.tokens),
                "maps": {m: encode_map(s.maps[m]) for m in methods},
                "qk": None if s.q is None else encode_qk(s.q, s.k),
                "segments": s.segments,
                **({"latents": _rounded(s.latents)} if latents is not None else {}),
            }
            for s in sentences
        ],
    }
    if latents is not None:
        payload["latents"] = dict(latents)
    return Explorer(payload)


def _rounded(values: np.ndarray) -> list[list[float]]:
    """``[latent, n]`` activations as JSON numbers with 4 significant digits (the page shows 3)."""
    return [[float(f"{v:.4g}") for v in row] for row in np.asarray(values, dtype=np.float64)]


def explore(
    model,
    texts: str | Sequence[str],
    *,
    maps: Mapping[str, object] | None = None,
    labels: Mapping[str, str] | None = None,
    mixing: str | Sequence[str] | None = None,
    qk: bool | str | Sequence[int] = "auto",
    attention: bool = True,
    title: str = "bertscope explorer",
    batch_size: int = 8,
    pairs: str | Sequence[str] | None = None,
    sentence_b_start: int | Sequence[int | None] | None = None,
    dictionary: Any = None,
    latents: int | str | Sequence[int] | None = None,
) -> Explorer:
    """Explore ``model``'s attention on ``texts`` (one string or several; padded together, padding dropped).

    Sentence pairs: ``pairs`` gives each text its second segment (``model.tokenize(texts, pairs)``, as in
    next-sentence or entailment inputs); the page then marks each token's segment and can show only
    A->B, B->A, A->A or B->B attention, with the attention mass each way.

    bertviz-style input: ``explore(outputs.attentions, tokens)`` takes transformers' ``output_attentions`` (a tuple
    of ``[batch, head, query, key]`` tensors, one per layer) with the tokens (``convert_ids_to_tokens``; one list
    per row for a batch) instead of a model and texts, and ``sentence_b_start`` (the position where segment B
    starts, as bertviz's ``head_view`` takes it; one per row for a batch) for a pair. No query-key view then
    (the queries and keys are not in the attentions).

    ``maps``: extra views, method id -> ``[batch, layer, query, key]`` (or ``[batch, layer, head, query,
    key]``) over ``model.tokenize(texts)``'s padded positions, or a list with one ``[layer, query, key]`` per
    text over its real tokens; e.g. ``maps={"alti": contributions}``. ``labels``: menu names for them.
    ``mixing``: context-mixing methods to compute and add to the menu, e.g. ``["alti", "attention_norm"]`` (or
    ``"alti,attention_norm"``): each is ``bertscope.hooks.contributions(model, model.tokenize(texts), method)``,
    ``[batch, layer, query, key]``; any per-layer, ``rollout:`` or ``flow:`` method of ``hooks.mixing.METHODS``.
    ``qk``: which sentences embed queries and keys for the query-key view: True (all), False (none), a list of
    indices, or "auto" (in order while the int8 total stays within ``QK_AUTO_BYTES``; the first always).
    ``attention=False`` leaves attention out of the menu (then ``maps`` is required).
    ``dictionary``: a saved sparse dictionary (a folder as ``bertscope sae train`` / ``bertscope run features``
    write, or a loaded ``probes.dictionary.Dictionary``) whose site this model has; ``latents``: which of its
    latents to show (an index, several, or ``"3,17"``). The page then gets a latent view: each token's background
    is the latent's activation at the dictionary's site. A folder that holds no dictionary, a site the model
    lacks, another model's width or a latent out of range: ``ValueError``, before the model runs.
    """
    if isinstance(model, (tuple, list)) or (isinstance(model, torch.Tensor) and model.dim() == 5):
        if maps or mixing or pairs is not None:
            raise ValueError("with transformers' attentions, give only the tokens and sentence_b_start (maps, mixing "
                             "and pairs need a bertscope model)")
        return from_attentions(model, texts, sentence_b_start=sentence_b_start, title=title)
    if sentence_b_start is not None:
        raise ValueError("sentence_b_start goes with transformers' attentions; with a model, give pairs=")
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError("texts must be a non-empty list of strings")
    if pairs is not None:
        pairs = [pairs] if isinstance(pairs, str) else list(pairs)
        if len(pairs) != len(texts) or not all(isinstance(t, str) for t in pairs):
            raise ValueError(f"pairs must give one second segment (a string) per text: {len(texts)} texts")
    if not attention and not maps:
        raise ValueError("nothing to show: attention=False and no maps")
    if attention and "attention" in (maps or {}):
        raise ValueError("'attention' is the model's own attention; give your map another name")
    if (dictionary is None) != (latents is None):
        raise ValueError("the latent view needs both a dictionary and the latents to show")
    chosen, dictionary_name = None, ""
    if dictionary is not None:
        dictionary_name = (Path(os.fspath(dictionary)).name if isinstance(dictionary, (str, os.PathLike))
                           else str(dictionary.config.site or "dictionary"))
        dictionary = latents_mod.load_for_model(dictionary, model)
        chosen = latents_mod.parse_latents(latents, int(dictionary.config.d_sae))
    cfg = model.config
    inputs = model.tokenize(texts, pairs)
    computed = mixing_maps(model, inputs, mixing)
    if computed:
        clash = sorted(set(computed) & set(maps or {}))
        if clash:
            raise ValueError(f"{', '.join(clash)} given both in maps= and mixing=")
        maps = {**(maps or {}), **computed}
        labels = {**{m: MIXING_LABELS.get(m, m) for m in computed}, **(labels or {})}
    want = _qk_wanted(qk, [int(m.sum()) for m in inputs["attention_mask"]], 2 * cfg.n_layers * cfg.d_model)

    caught = capture(model, inputs, qk=want, batch_size=batch_size)
    padded_len = int(inputs["input_ids"].shape[1])
    extra = {
        name: data.sentence_maps(value, len(texts), caught.positions, padded_len, name)
        for name, value in (maps or {}).items()
    }
    segments = (data.pair_segments(model.tokenizer, texts, pairs, caught.positions) if pairs is not None
                else [None] * len(texts))  # fmt: skip
    described, values = None, [None] * len(texts)
    if chosen is not None:
        values = latents_mod.latent_values(model, dictionary, inputs, chosen, caught.positions, batch_size=batch_size)
        described = latents_mod.describe(dictionary, chosen, values, dictionary_name)
    sentences = []
    for i, text in enumerate(texts):
        sentence_maps = {"attention": caught.pattern[i]} if attention else {}
        sentence_maps.update({name: arrays[i] for name, arrays in extra.items()})
        shown = text if pairs is None else f"{text} || {pairs[i]}"
        sentences.append(SentenceData(shown, caught.tokens[i], sentence_maps, caught.q[i], caught.k[i], segments[i],
                                      values[i]))
    return build(
        sentences,
        labels=labels,
        vmax={"attention": 1.0} if attention else None,
        model_name=model_label(model),  # name and weights sha256, never the local path (pages get shared)
        title=title,
        latents=described,
    )


def from_attentions(
    attentions,
    tokens: Sequence[str] | Sequence[Sequence[str]],
    *,
    sentence_b_start: int | Sequence[int | None] | None = None,
    title: str = "bertscope explorer",
) -> Explorer:
    """An explorer from transformers' ``output_attentions`` (bertviz's input): ``attentions`` a tuple of one
    ``[batch, head, query, key]`` tensor per layer (or one ``[layer, batch, head, query, key]`` tensor), ``tokens``
    the token strings (one list, or one per row; a shorter row is right-padded), ``sentence_b_start`` where
    segment B starts (an int, or one per row, None for a single sentence)."""
    arr, rows = data.attention_tuple(attentions, tokens)
    starts = sentence_b_start if isinstance(sentence_b_start, (list, tuple)) else [sentence_b_start] * len(rows)
    if len(starts) != len(rows):
        raise ValueError(f"sentence_b_start gives {len(starts)} values for {len(rows)} rows")
    sentences = []
    for i, (row, start) in enumerate(zip(rows, starts, strict=True)):
        n = len(row)
        segments = None
        if start is not None:
            if not 0 < int(start) < n:
                raise ValueError(f"sentence_b_start must be in 1..{n - 1} for row {i} ({n} tokens), got {start}")
            segments = [0] * int(start) + [1] * (n - int(start))
        maps = {"attention": np.ascontiguousarray(arr[i, :, :, :n, :n], dtype=np.float32)}
        sentences.append(SentenceData(" ".join(row), row, maps, segments=segments))
    return build(sentences, vmax={"attention": 1.0}, model_name="transformers output_attentions", title=title)


def _qk_wanted(qk: bool | str | Sequence[int], lengths: list[int], per_token: int) -> list[bool]:
    """Which sentences (real-token ``lengths``) embed queries and keys, from ``explore``'s ``qk``;
    ``per_token``: bytes per token (int8 q and k, every layer)."""
    if qk == "auto":
        want, total = [], 0
        for i, n in enumerate(lengths):
            total += n * per_token
            want.append(i == 0 or total <= QK_AUTO_BYTES)
            if not want[-1]:
                total = QK_AUTO_BYTES + 1  # keep a prefix: once one is left out, so are the rest
    elif isinstance(qk, bool):
        want = [qk] * len(lengths)
    elif isinstance(qk, str):
        raise ValueError(f"qk must be True, False, 'auto' or a list of sentence indices, got {qk!r}")
    else:
        chosen = set(qk)
        if not chosen <= set(range(len(lengths))):
            raise ValueError(f"qk indices must be in 0..{len(lengths) - 1}, got {sorted(chosen)}")
        want = [i in chosen for i in range(len(lengths))]
    return want
