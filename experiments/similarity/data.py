"""What the `similarity` experiment reads from the model: the builtin pairs, pooled embeddings of every site, the
scores with one head mean-ablated, each head's share of the cosine, the pairwise attributions, the scores after
token pairs are removed, and the negation edits.

Everything here takes plain values (a model, lists of texts, numbers) and returns arrays or tables; the
statistics are ``measures``'. Shapes: ``n`` pairs, ``L`` layers, ``H`` heads, ``d`` the embedding's width.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from bertscope.hooks import ablation, similarity
from einops import rearrange

#: The builtin pairs: written for this experiment by its authors, gold scores on STS's 0-5 scale assigned by the
#: STS annotation guidelines (5 equivalent, 4 mostly equivalent, 3 roughly equivalent, 2 not equivalent but
#: sharing details, 1 same topic, 0 different topics). Authors' judgements, for a demo only; ``kind`` says which
#: contrast a pair tests (paraphrase, partial, unrelated, negation, word swap).
BUILTIN: list[tuple[str, str, float, str]] = [
    ("A man is playing a guitar.", "A man plays the guitar.", 5.0, "paraphrase"),
    ("A woman is slicing an onion.", "A woman is cutting an onion into slices.", 4.8, "paraphrase"),
    ("The children are playing in the park.", "Kids are playing at the park.", 4.8, "paraphrase"),
    ("Two dogs are running across a field.", "Two dogs run through a grassy field.", 4.6, "paraphrase"),
    ("The plane landed safely at the airport.", "The aircraft touched down safely at the airport.", 5.0,
     "paraphrase"),
    ("She bought a new car last week.", "Last week she purchased a new car.", 5.0, "paraphrase"),
    ("The stock market fell sharply on Monday.", "Shares dropped steeply on Monday.", 4.4, "paraphrase"),
    ("A cat is sleeping on the sofa.", "A cat is asleep on the couch.", 5.0, "paraphrase"),
    ("The meeting was postponed until Friday.", "The meeting has been moved to Friday.", 4.4, "paraphrase"),
    ("A boy is riding a bicycle down the street.", "A young boy rides his bike along the road.", 4.2,
     "paraphrase"),
    ("A man is slicing a potato with a knife.", "A man is cutting a potato.", 3.8, "paraphrase"),
    ("The company reported record profits this year.", "The company made more money this year than ever before.",
     4.0, "paraphrase"),
    ("Three people are walking on the beach.", "People are walking along a beach.", 3.6, "paraphrase"),
    ("A man is playing a guitar.", "A man is playing a piano.", 2.6, "partial"),
    ("A woman is slicing an onion.", "A woman is slicing a tomato.", 2.6, "partial"),
    ("The train to London was late.", "The bus to Paris was late.", 1.8, "partial"),
    ("Two dogs are running across a field.", "A dog is sleeping in a field.", 1.8, "partial"),
    ("The president visited China this week.", "The president will visit Japan next month.", 2.0, "partial"),
    ("A girl is reading a book in the library.", "A girl is writing a letter at home.", 1.2, "partial"),
    ("The team won the final match.", "The team lost its first match of the season.", 1.6, "partial"),
    ("A chef is cooking pasta in a kitchen.", "A man is eating pasta at a restaurant.", 1.4, "partial"),
    ("A man is playing a guitar.", "The stock market fell sharply on Monday.", 0.0, "unrelated"),
    ("A cat is sleeping on the sofa.", "The government announced new taxes.", 0.0, "unrelated"),
    ("The children are playing in the park.", "Scientists discovered a new planet.", 0.0, "unrelated"),
    ("She bought a new car last week.", "A woman is slicing an onion.", 0.0, "unrelated"),
    ("Heavy rain flooded the streets.", "The orchestra played a symphony.", 0.0, "unrelated"),
    ("A boy is riding a bicycle.", "The bank raised interest rates.", 0.0, "unrelated"),
    ("The museum opens at nine.", "A dog is chasing a ball.", 0.0, "unrelated"),
    ("He is learning to speak French.", "The bridge was closed for repairs.", 0.0, "unrelated"),
    ("The man is playing the guitar.", "The man is not playing the guitar.", 2.4, "negation"),
    ("The store was open on Sunday.", "The store was not open on Sunday.", 2.4, "negation"),
    ("She can swim very well.", "She cannot swim at all.", 2.0, "negation"),
    ("The children are happy.", "The children are not happy.", 2.4, "negation"),
    ("The flight has been cancelled.", "The flight has not been cancelled.", 2.4, "negation"),
    ("A dog is barking at the mailman.", "A dog is not barking at the mailman.", 2.4, "negation"),
    ("The test results were positive.", "The test results were not positive.", 2.4, "negation"),
    ("He will attend the conference.", "He will not attend the conference.", 2.4, "negation"),
    ("The dog chased the cat.", "The cat chased the dog.", 3.0, "word swap"),
    ("A man is feeding a horse.", "A horse is feeding a man.", 2.4, "word swap"),
    ("Alice sent a letter to Bob.", "Bob sent a letter to Alice.", 3.0, "word swap"),
    ("The teacher praised the student.", "The student praised the teacher.", 3.0, "word swap"),
    ("The company bought the startup.", "The startup bought the company.", 2.8, "word swap"),
    ("A woman is following a man.", "A man is following a woman.", 3.0, "word swap"),
    ("Brazil beat Germany in the final.", "Germany beat Brazil in the final.", 2.6, "word swap"),
]


def builtin_rows() -> list[dict[str, Any]]:
    """The builtin pairs as rows ``{"a", "b", "score", "kind"}`` (for ``pairs_from_rows``)."""
    return [{"a": a, "b": b, "score": s, "kind": k} for a, b, s, k in BUILTIN]


def split(n: int, select_fraction: float, seed: int) -> np.ndarray:
    """``[n]`` bool: True for the pairs the best site and pooling are chosen on (``select``), False for the pairs
    every number is reported on; a seeded permutation, at least one pair on each side when ``n >= 2``."""
    order = np.random.default_rng([seed, 41]).permutation(n)
    k = min(max(int(round(select_fraction * n)), 1), max(n - 1, 1))
    select = np.zeros(n, dtype=bool)
    select[order[:k]] = True
    return select


def residual_sites(model: Any) -> list[str]:
    """``blocks.{L}.hook_resid_post`` of every block; the last one is the model's own output."""
    return [f"blocks.{layer}.hook_resid_post" for layer in range(model.config.n_layers)]


def _unique(a: Sequence[str], b: Sequence[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
    texts = list(dict.fromkeys([*a, *b]))
    index = {t: i for i, t in enumerate(texts)}
    return texts, np.array([index[t] for t in a]), np.array([index[t] for t in b])


def _cosines(e: torch.Tensor, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
    return similarity.score(e[torch.as_tensor(ia)], e[torch.as_tensor(ib)], "cosine").double().numpy()


def site_scores(model: Any, a: Sequence[str], b: Sequence[str], poolings: Sequence[str], *,
                batch_size: int = 64) -> dict[tuple[str, str], np.ndarray]:
    """``{(site, pooling): [n]}``: the cosine of each pair's pooled embeddings at every residual site (one forward
    pass per batch of distinct texts)."""
    texts, ia, ib = _unique(a, b)
    emb = similarity.embed(model, texts, pooling=list(poolings), sites=residual_sites(model), batch_size=batch_size)
    return {key: _cosines(e, ia, ib) for key, e in emb.items()}


@torch.no_grad()
def head_ablation_scores(model: Any, a: Sequence[str], b: Sequence[str], *, pooling: str, batch_size: int = 64
                         ) -> np.ndarray:
    """``[L, H, n]``: each pair's cosine of the model's own embedding (last block, ``pooling``) with one head
    mean-ablated (its ``z`` replaced by its mean over every real token of the pairs' texts: the hooks' ablation
    mechanism, ``hooks.ablation.head_gates`` with ``method="mean"``). The heads of layer L run as copies of one
    batch from ``blocks.L.hook_resid_pre`` (the layers before L cannot change)."""
    texts, ia, ib = _unique(a, b)
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    batches = [model.tokenize(texts[i:i + batch_size]) for i in range(0, len(texts), batch_size)]
    mean_z = ablation.mean_z_over(model, [_Batch(bt) for bt in batches])
    emb = torch.zeros(n_layers, n_heads, len(texts), model.config.d_model, dtype=torch.float64)
    names = [f"blocks.{layer}.hook_resid_pre" for layer in range(n_layers)]
    start = 0
    for bt in batches:
        nb = bt["input_ids"].shape[0]
        _, cache = model.run_with_cache(**bt, names_filter=names)
        mask = bt["attention_mask"].repeat(n_heads, 1)
        for layer in range(n_layers):
            keep = ablation.single_head_keep(n_layers, n_heads, layer)  # copy h: head h of this layer ablated
            hooks = ablation.head_gates(keep, n_batch=nb, method="mean", mean_z=mean_z, first_layer=layer)
            with model.hooks(hooks):
                hidden = model.forward_from(layer, cache[names[layer]].repeat(n_heads, 1, 1), mask)
            pooled = similarity.pool(hidden, mask, pooling).double().cpu()
            emb[layer, :, start:start + nb] = rearrange(pooled, "(h b) d -> h b d", h=n_heads)
        start += nb
    ta, tb = torch.as_tensor(ia), torch.as_tensor(ib)
    return similarity.score(emb[:, :, ta], emb[:, :, tb], "cosine").numpy()


class _Batch:
    """A tokenised batch as ``ablation.mean_z_over`` reads it (attributes, not keys)."""

    def __init__(self, enc: dict[str, torch.Tensor]) -> None:
        self.input_ids = enc["input_ids"]
        self.attention_mask = enc["attention_mask"]
        self.token_type_ids = enc.get("token_type_ids")


def head_shares(model: Any, a: Sequence[str], b: Sequence[str], *, pooling: str, batch_size: int = 16
                ) -> pd.DataFrame:
    """Each component's share of each pair's cosine (``similarity.shares``: the exact decomposition under frozen
    LayerNorm), pairs ``batch_size`` at a time; columns ``pair``, ``component``, ``layer``, ``head``, ``kind``,
    ``share`` (a pair's shares sum to its cosine)."""
    parts = []
    for start in range(0, len(a), batch_size):
        df = similarity.shares(model, list(a[start:start + batch_size]), list(b[start:start + batch_size]),
                               score="cosine", pooling=pooling)
        df["pair"] += start
        parts.append(df)
    return pd.concat(parts, ignore_index=True)


def attributions(model: Any, a: Sequence[str], b: Sequence[str], methods: Sequence[str], *, steps: int,
                 progress: Callable[[str], None] = lambda msg: None, batch_size: int = 4) -> dict[str, list]:
    """``{method: [PairAttribution per pair]}`` (``similarity.attribute`` at piece level); methods with a
    ``steps`` option run at ``steps``."""
    out: dict[str, list] = {}
    for method in methods:
        progress(f"attributions: {method} on {len(a)} pairs")
        options = {"steps": steps} if "steps" in similarity.TABLE[method].defaults else {}
        out[method] = similarity.attribute(model, list(a), list(b), method=method, batch_size=batch_size,
                                           **options)
    return out


def piece_ids(model: Any, texts: Sequence[str]) -> list[list[int]]:
    """Each text's word-piece ids, special tokens included (the positions of an attribution's matrix)."""
    out = []
    for t in texts:
        enc = model.tokenize([t])
        out.append([int(i) for i in enc["input_ids"][0][enc["attention_mask"][0].bool()]])
    return out


def special_positions(model: Any, ids: Sequence[int]) -> np.ndarray:
    """``[len(ids)]`` bool: True at special tokens ([CLS], [SEP], <s>, ...)."""
    specials = {v for v in model.special_token_ids.values() if v is not None}
    return np.array([i in specials for i in ids], dtype=bool)


def pad_id(model: Any) -> int:
    """The padding token's id: what a removed token is replaced by (xsbert's reference token)."""
    return int(model.special_token_ids.get("pad", model.config.pad_token_id))


@torch.no_grad()
def embed_ids(model: Any, seqs: Sequence[Sequence[int]], *, pooling: str, batch_size: int = 64) -> torch.Tensor:
    """``[len(seqs), d]``: the model's pooled embedding of each id sequence (attended over its whole length)."""
    out = []
    for start in range(0, len(seqs), batch_size):
        rows = seqs[start:start + batch_size]
        n = max(len(r) for r in rows)
        ids = torch.full((len(rows), n), pad_id(model), dtype=torch.long)
        mask = torch.zeros((len(rows), n), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.as_tensor(list(r))
            mask[i, :len(r)] = 1
        device = next(model.parameters()).device
        hidden = model(ids.to(device), mask.to(device))
        out.append(similarity.pool(hidden, mask.to(device), pooling).double().cpu())
    return torch.cat(out)


#: How a token is removed: ``reference`` replaces it by the padding token (xsbert's reference token, attended like
#: a real one); ``delete`` drops it from the sequence (the text without that word piece).
REMOVALS: tuple[str, ...] = ("reference", "delete")
#: Which texts lose a removed token pair's tokens: ``one``: one text at a time (the pair's token of a removed from a
#: with b intact, then its token of b from b with a intact; the score after is the mean of the two), which breaks
#: the pair's match; ``both``: both texts at once, which removes both halves of a match and leaves the two texts
#: parallel (see docs/experiments/similarity.md, "How to read the faithfulness result").
SIDES: tuple[str, ...] = ("one", "both")


def removal_scores(model: Any, ids_a: Sequence[Sequence[int]], ids_b: Sequence[Sequence[int]],
                   plans: pd.DataFrame, *, pooling: str, removal: str = "reference", sides: str = "both",
                   batch_size: int = 64) -> np.ndarray:
    """``[len(plans)]``: the cosine of each plan's pair after its positions are removed (``removal``, see
    :data:`REMOVALS`; ``sides``, see :data:`SIDES`: for ``one`` the mean of the cosine with only a's positions
    removed and the cosine with only b's). ``plans``: rows with ``pair`` and ``positions_a`` / ``positions_b``
    (piece positions). One ``sides`` of ``removal_cosines``."""
    if sides not in SIDES:
        raise ValueError(f"sides must be one of {', '.join(SIDES)}, got {sides!r}")
    return removal_cosines(model, ids_a, ids_b, plans, pooling=pooling, removal=removal, sides=(sides,),
                           batch_size=batch_size)[sides]


def removal_cosines(model: Any, ids_a: Sequence[Sequence[int]], ids_b: Sequence[Sequence[int]],
                    plans: pd.DataFrame, *, pooling: str, removal: str = "reference",
                    sides: Sequence[str] = SIDES, batch_size: int = 64) -> dict[str, np.ndarray]:
    """``{sides: [len(plans)]}``: ``removal_scores`` for each of ``sides`` from one forward pass over every
    distinct text they need (each plan's edited a and b, and for ``one`` the intact texts)."""
    if removal not in REMOVALS:
        raise ValueError(f"removal must be one of {', '.join(REMOVALS)}, got {removal!r}")
    unknown = sorted(set(sides) - set(SIDES))
    if unknown:
        raise ValueError(f"sides must be one of {', '.join(SIDES)}, got {unknown[0]!r}")
    pad = pad_id(model)

    def edit(ids: Sequence[int], positions: Sequence[int]) -> tuple[int, ...]:
        gone = {int(p) for p in positions}
        if removal == "delete":
            return tuple(t for n, t in enumerate(ids) if n not in gone)
        return tuple(pad if n in gone else t for n, t in enumerate(ids))

    seq_a = [edit(ids_a[r.pair], r.positions_a) for r in plans.itertuples()]
    seq_b = [edit(ids_b[r.pair], r.positions_b) for r in plans.itertuples()]
    whole_a = [tuple(ids_a[r.pair]) for r in plans.itertuples()] if "one" in sides else []
    whole_b = [tuple(ids_b[r.pair]) for r in plans.itertuples()] if "one" in sides else []
    distinct = list(dict.fromkeys([*seq_a, *seq_b, *whole_a, *whole_b]))
    index = {s: i for i, s in enumerate(distinct)}
    emb = embed_ids(model, distinct, pooling=pooling, batch_size=batch_size)

    def cos(left: list[tuple[int, ...]], right: list[tuple[int, ...]]) -> np.ndarray:
        il = torch.as_tensor([index[s] for s in left])
        ir = torch.as_tensor([index[s] for s in right])
        return similarity.score(emb[il], emb[ir], "cosine").numpy()

    out: dict[str, np.ndarray] = {}
    for side in sides:
        out[side] = cos(seq_a, seq_b) if side == "both" else (cos(seq_a, whole_b) + cos(whole_a, seq_b)) / 2
    return out


# ----------------------------------------------------------------------------------------------- negation
#: The words after which the negation rule inserts "not" (the first of them in a sentence, any case).
AUXILIARIES: tuple[str, ...] = ("am", "is", "are", "was", "were", "will", "would", "can", "could", "shall",
                                "should", "may", "might", "must", "has", "have", "had", "does", "do", "did")
#: Words that mark a sentence as negated already (it is skipped, counted).
NEGATORS: tuple[str, ...] = ("not", "n't", "never", "no", "cannot", "nobody", "nothing", "none", "neither", "nor")
#: The control's word: the inserted "not" swapped for this word of the same length (one word piece, no negation).
CONTROL_WORD = "now"
_WORD = re.compile(r"[A-Za-z']+")


def negate(text: str) -> tuple[str | None, str]:
    """``(negated text, "")``, inserting "not" after the first auxiliary or copula (:data:`AUXILIARIES`), or
    ``(None, why)`` for a sentence without one or one negated already (:data:`NEGATORS`)."""
    words = [m.group(0).lower() for m in _WORD.finditer(text)]
    if any(w in NEGATORS or w.endswith("n't") for w in words):
        return None, "negated already"
    for m in _WORD.finditer(text):
        if m.group(0).lower() in AUXILIARIES:
            return f"{text[:m.end()]} not{text[m.end():]}", ""
    return None, "no auxiliary or copula"


def control(negated: str) -> str:
    """The control edit of a negated sentence: its inserted " not " swapped for :data:`CONTROL_WORD` (same length,
    same position, no negation), so the control differs from the original by one inserted word exactly as the
    negation does."""
    at = negated.index(" not")
    return f"{negated[:at]} {CONTROL_WORD}{negated[at + 4:]}"


def negation_edits(texts: Sequence[str]) -> pd.DataFrame:
    """One row per distinct text: ``text``, ``negated``, ``control`` (empty when skipped), ``skipped`` (why, or
    empty)."""
    rows = []
    for t in dict.fromkeys(texts):
        neg, why = negate(t)
        rows.append({"text": t, "negated": neg or "", "control": control(neg) if neg else "", "skipped": why})
    return pd.DataFrame(rows, columns=["text", "negated", "control", "skipped"])


def edit_cosines(model: Any, edits: pd.DataFrame, *, pooling: str, batch_size: int = 64) -> pd.DataFrame:
    """``edits`` (the kept rows of ``negation_edits``) with ``cos_negated`` and ``cos_control``: the cosine of each
    original's own embedding (last block, ``pooling``) with its negation's and with its control's."""
    kept = edits[edits.skipped == ""].reset_index(drop=True)
    if kept.empty:
        return kept.assign(cos_negated=[], cos_control=[])
    texts = [*kept.text, *kept.negated, *kept.control]
    e = similarity.embed(model, texts, pooling=pooling, batch_size=batch_size)[(similarity.final_site(model),
                                                                                pooling)]
    n = len(kept)
    orig, neg, ctl = e[:n], e[n:2 * n], e[2 * n:]
    return kept.assign(cos_negated=similarity.score(orig, neg).double().numpy(),
                       cos_control=similarity.score(orig, ctl).double().numpy())


def attributed(n: int, k: int, seed: int) -> np.ndarray:
    """Indices of the ``min(k, n)`` pairs every method attributes: a seeded sample, in corpus order."""
    return np.sort(np.random.default_rng([seed, 43]).permutation(n)[:min(k, n)])
