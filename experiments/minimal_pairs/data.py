"""What the minimal-pairs experiment reads (the template's ``data`` role): the pairs (a ``--corpus`` file or the
builtin set below) and their pseudo-log-likelihoods, every scoring method's masked copies scored in one batched
pass (`probes.lens.pll.score_copies`), through every stream's logit lens when asked; plain values in and out.

Shapes: ``m`` method, ``s`` stream (``n_layers + 1``, or 1 without the lens: the model's own head), ``t`` sentence
(the ``2 n`` sentences ``[*good, *bad]`` of ``n`` pairs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from bertscope.experiments.corpus.pairs import Pairs, PairsFormat, pairs_from_rows
from bertscope.probes.lens.pll import MaskedCopy, masked_copies, score_copies

#: A row of a minimal-pairs file: a good and a bad sentence, optionally BLiMP's paradigm (``UID``), field,
#: phenomenon (``linguistics_term``) and pair id; header and JSON-key spellings matched case-insensitively.
PAIRS = PairsFormat(
    "minimal pairs",
    ("good", "bad"),
    optional=("paradigm", "field", "phenomenon", "pair_id"),
    aliases={"good": ("sentence_good", "good_sentence", "grammatical"),
             "bad": ("sentence_bad", "bad_sentence", "ungrammatical"),
             "paradigm": ("uid",), "phenomenon": ("linguistics_term", "term"), "pair_id": ("pairid",)},
)  # fmt: skip

#: Label of a column the file does not have.
ABSENT = "all"


def _pairs(paradigm: str, field: str, phenomenon: str, *rows: tuple[str, str]) -> list[dict[str, str]]:
    return [{"good": g, "bad": b, "paradigm": paradigm, "field": field, "phenomenon": phenomenon} for g, b in rows]


#: The builtin set (written for this toolkit in BLiMP's style, 30 pairs): agreement, negative polarity items and
#: argument structure. Each bad sentence differs from its good one in one word.
BUILTIN_ROWS: list[dict[str, str]] = [
    *_pairs("subject_verb_agreement", "morphology", "agreement",
            ("The cat sleeps on the mat.", "The cat sleep on the mat."),
            ("The dogs bark at night.", "The dogs barks at night."),
            ("The teacher who likes the students is tired.", "The teacher who likes the students are tired."),
            ("The keys to the cabinet are lost.", "The keys to the cabinet is lost."),
            ("My brother walks to work.", "My brother walk to work."),
            ("These children play outside.", "These children plays outside.")),
    *_pairs("determiner_noun_agreement", "morphology", "agreement",
            ("Sarah bought these apples.", "Sarah bought this apples."),
            ("That house is old.", "Those house is old."),
            ("He read this article.", "He read these article."),
            ("We visited those museums.", "We visited that museums."),
            ("The girl found a coin.", "The girl found a coins."),
            ("Many people came to the party.", "Much people came to the party.")),
    *_pairs("anaphor_agreement", "morphology", "agreement",
            ("The boys hurt themselves.", "The boys hurt himself."),
            ("Mary saw herself in the mirror.", "Mary saw himself in the mirror."),
            ("John praised himself.", "John praised herself."),
            ("The women trust themselves.", "The women trust herself.")),
    *_pairs("npi_licensing", "semantics", "npi_licensing",
            ("Nobody has ever seen a ghost.", "Somebody has ever seen a ghost."),
            ("I have not bought any bread.", "I have already bought any bread."),
            ("No student has ever failed this test.", "Every student has ever failed this test."),
            ("She never eats any vegetables.", "She often eats any vegetables."),
            ("Few people have ever been there.", "Many people have ever been there."),
            ("Nobody said anything at all.", "Everybody said anything at all.")),
    *_pairs("transitive", "syntax", "argument_structure",
            ("The child broke the window.", "The child arrived the window."),
            ("She admired the painting.", "She fainted the painting."),
            ("We discussed the plan.", "We laughed the plan.")),
    *_pairs("intransitive", "syntax", "argument_structure",
            ("The guests arrived.", "The guests devoured."),
            ("The baby slept.", "The baby found.")),
    *_pairs("passive", "syntax", "argument_structure",
            ("The letter was written by Anna.", "The letter was fallen by Anna."),
            ("The cake was eaten by the kids.", "The cake was vanished by the kids."),
            ("The car was repaired.", "The car was happened.")),
]


def builtin_pairs() -> Pairs:
    """The builtin set as a pairs corpus (checked like a file's rows)."""
    return pairs_from_rows("builtin minimal pairs", BUILTIN_ROWS, PAIRS)


def pairs_table(pairs: Pairs, max_pairs: int | None = None) -> pd.DataFrame:
    """The pairs as the experiment's table: ``pair`` (the file's row order), ``good``, ``bad``, ``paradigm``,
    ``field``, ``phenomenon`` (:data:`ABSENT` where the file has no such column); the first ``max_pairs``."""
    frame = pairs.frame.iloc[:max_pairs] if max_pairs is not None else pairs.frame
    out = pd.DataFrame({"pair": frame["id"].to_numpy(), "good": frame["good"].astype(str).to_numpy(),
                        "bad": frame["bad"].astype(str).to_numpy()})
    for column in ("paradigm", "field", "phenomenon"):
        values = frame[column].fillna(ABSENT).astype(str) if column in frame else pd.Series(ABSENT, index=frame.index)
        out[column] = values.replace("", ABSENT).to_numpy()
    return out


def piece_counts(tokenizer: Any, texts: Sequence[str]) -> np.ndarray:
    """``[len(texts)]``: each text's word pieces with the special tokens (what a forward pass takes)."""
    return np.array([len(ids) for ids in tokenizer(list(texts))["input_ids"]], dtype=np.int64)


def pair_pll(model: Any, good: Sequence[str], bad: Sequence[str], methods: Sequence[str], *, batch_size: int,
             streams: bool, bias: bool = True) -> dict[str, np.ndarray]:
    """Pseudo-log-likelihoods of the sentences ``[*good, *bad]`` by every method: ``pll`` ``[m, s, t]`` (natural
    log; ``s`` is every stream through the logit lens with ``streams``, else the head alone) and ``n_tokens``
    ``[m, t]`` (scored pieces). Equal masked copies are scored once: a copy two methods share (every piece but a
    split word's non-final ones), and a good and a bad sentence's copies masked where they differ, when they
    target the same piece (they differ in the target otherwise, so are two rows)."""
    sentences = [*good, *bad]
    unique: list[MaskedCopy] = []
    seen: dict[tuple[tuple[int, ...], int, int], int] = {}  # (masked ids, position, target id) -> row
    index: list[tuple[np.ndarray, np.ndarray]] = []
    for method in methods:
        copies = masked_copies(model, sentences, method)
        at = np.empty(len(copies), dtype=np.int64)
        for k, c in enumerate(copies):
            at[k] = seen.setdefault((c.ids, c.target, c.target_id), len(unique))
            if at[k] == len(unique):
                unique.append(c)
        index.append((at, np.array([c.sentence for c in copies], dtype=np.int64)))
    scores = score_copies(model, unique, batch_size=batch_size, streams=streams, bias=bias)
    scores = scores if streams else scores[None]  # [s, unique]
    n = len(sentences)
    pll = np.zeros((len(methods), scores.shape[0], n), dtype=np.float64)
    n_tokens = np.zeros((len(methods), n), dtype=np.int64)
    for i, (at, sentence) in enumerate(index):
        n_tokens[i] = np.bincount(sentence, minlength=n)
        for s in range(scores.shape[0]):
            pll[i, s] = np.bincount(sentence, weights=scores[s, at], minlength=n)
    return {"pll": pll, "n_tokens": n_tokens}
