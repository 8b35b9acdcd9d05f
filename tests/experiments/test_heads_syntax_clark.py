"""Syntax scores against Clark et al. (2019)'s analysis code (clarkkev/attention-analysis, Syntax_Analysis.ipynb).

Two kinds of check: planted word-level maps with a known answer per direction (including head words with several
dependents, where a "row of the gold head" reading and Clark's transposed reading disagree), and an independent
numpy port of their notebook (``attn_head_predictor`` / ``evaluate_predictor``, word pooling as their
``bpe_utils``) run on the bundled model's real attention over a hand-made gold CoNLL-U with split words.
"""

from __future__ import annotations

import collections

import numpy as np
import pandas as pd
import pytest
import torch
from bertscope.experiments import corpus as corpus_mod
from bertscope.experiments.heads import roles as heads_roles
from bertscope.experiments.heads import syntax as syn

# "The cat sat on the mat ." : "sat" heads nsubj, obl and punct; "mat" heads case and det.
GOLD = (2, 3, 0, 6, 6, 3, 3)
RELS = ("det", "nsubj", "root", "case", "det", "obl", "punct")


def planted(gold: tuple[int, ...]) -> torch.Tensor:
    """``[layer=1, head=3, n, n]``. Head 0: each dependent attends to its head (dep->head pointer). Head 1: each
    head word attends to ALL its dependents equally (the transposed pointer: column d peaks at d's head). Head 2:
    each head word attends to its LAST dependent only (the old "argmax of the head's row" reading would score
    that one arc; in Clark's reading every dependent whose column peaks at its head is a hit)."""
    n = len(gold)
    maps = torch.full((1, 3, n, n), 0.01)
    for d, g in enumerate(gold):
        if g > 0:
            maps[0, 0, d, g - 1] = 1.0
            maps[0, 1, g - 1, d] = 1.0
    for g in range(1, n + 1):
        deps = [d for d, h in enumerate(gold) if h == g]
        if deps:
            maps[0, 2, g - 1, deps[-1]] = 1.0
    maps[..., torch.arange(n), torch.arange(n)] = 9.0  # self is excluded before the argmax
    return maps


def test_transposed_reading_hits_every_dependent_of_a_head_word():
    hits = syn.sentence_arc_hits(planted(GOLD), GOLD, RELS)
    acc = syn.head_relation_accuracy(hits).set_index(["relation", "head", "direction"])["accuracy"]
    assert acc[(syn.ALL_RELATIONS, 0, "dep->head")] == 1.0
    assert acc[(syn.ALL_RELATIONS, 1, "head->dep")] == 1.0  # "sat" has 3 dependents, "mat" 2: all hit
    # head 1 read dep->head: a word's own row peaks at its first dependent; a word without dependents has a
    # flat row whose argmax is the first other word: only "The" (-> "cat", its head) hits, 1 arc of 6
    assert acc[(syn.ALL_RELATIONS, 1, "dep->head")] == pytest.approx(1 / 6)
    # head 2: column d peaks at its head only for the last dependent of each head word (the small background
    # 0.01 makes every other column's argmax the first non-self word): det(The)->cat, punct(.)->sat, det(the)->mat
    per_arc = hits.head_hits[:, 0, 2, 1]
    expected = [d == max(e for e, h in enumerate(GOLD) if h == GOLD[d]) for d in np.flatnonzero(np.asarray(GOLD))]
    assert per_arc.tolist() == expected
    assert per_arc.sum() == 3


def test_subtypes_kept_apart_unless_collapsed():
    gold, rels = (2, 3, 0, 3), ("nmod:poss", "nsubj:pass", "root", "punct")
    kept = syn.sentence_arc_hits(planted(gold), gold, rels)
    assert set(kept.relations) == {"nmod:poss", "nsubj:pass", "punct"}
    collapsed = syn.sentence_arc_hits(planted(gold), gold, rels, collapse_subtypes=True)
    assert set(collapsed.relations) == {"nmod", "nsubj", "punct"}


def test_headline_table_leaves_out_punct_but_long_table_keeps_it():
    hits = syn.ArcHits.concat([syn.sentence_arc_hits(planted(GOLD), GOLD, RELS, i) for i in range(6)])
    table = syn.syntax_table(hits, n_boot=50)
    assert "punct" not in set(table["relation"]) and "root" not in set(table["relation"])
    assert (table["selection"] == "held-out").all()
    assert "punct" in set(syn.head_relation_accuracy(hits)["relation"])
    det = table.set_index("relation").loc["det"]
    assert det["heldout_accuracy"] == 1.0 and det["heldout_accuracy_low"] == 1.0


def test_punct_alone_does_not_make_a_head_syntactic():
    # two shapes, so that no fixed offset gets det / nsubj right everywhere: det and nsubj heads at +1, then +2
    shapes = [((2, 3, 0, 3, 3, 3), ("det", "nsubj", "root", "punct", "punct", "punct")),
              ((3, 3, 5, 5, 0, 5), ("det", "amod", "nsubj", "advmod", "root", "punct"))]  # fmt: skip
    parts = []
    for i in range(40):
        gold, rels = shapes[i % 2]
        maps = planted(gold)
        for d, rel in enumerate(rels):  # head 0 gets only punctuation right: other words point at the last word
            if rel not in ("punct", "root"):
                maps[0, 0, d] = 0.01
                maps[0, 0, d, d], maps[0, 0, d, -1] = 9.0, 1.0
        parts.append(syn.sentence_arc_hits(maps, gold, rels, i))
    hits = syn.ArcHits.concat(parts)
    gains = syn.heldout_head_gains(hits, threshold=0.1, n_boot=200)
    assert "punct" not in set(gains["relation"])
    det = gains.query("head == 1 and relation == 'det'").iloc[0]
    assert det["heldout_accuracy"] == 1.0  # the offset chosen on one half hits only one shape on the other
    assert det["heldout_gain"] == pytest.approx(1.0 - det["heldout_baseline_accuracy"]) and det["heldout_gain"] > 0.3
    stats = pd.DataFrame({"layer": 0, "head": [0, 1, 2], **{m: 0.0 for m in ("mass_cls", "mass_sep", "mass_punct",
                          "mass_self", "mass_prev", "mass_next", "entropy_ratio", "top_offset_fraction")},
                          "top_offset": 0})  # fmt: skip
    roles = heads_roles.assign_roles(stats, gains, min_arcs=1)
    syntactic = roles.query("role == 'syntactic' and assigned")
    assert 0 not in set(syntactic["head"])  # head 0 only gets punct right
    assert 1 in set(syntactic["head"])  # the transposed pointer beats the offsets on det and nsubj, held-out
    assert (syntactic["selection"] == "held-out").all()


def test_benjamini_hochberg_known_answer():
    p = np.array([0.001, 0.008, 0.039, 0.041, 0.042, 0.06, 0.074, 0.205, 0.212, 0.216])
    # step-up at q = 0.05: the largest k with p_(k) <= k q / m is k = 2 (0.008 <= 0.01; 0.039 > 0.015)
    assert syn.benjamini_hochberg(p, 0.05).tolist() == [True, True] + [False] * 8
    assert syn.benjamini_hochberg(np.array([0.04, 0.03]), 0.05).tolist() == [True, True]


# ---------------------------------------------------------------- independent port of Clark et al.'s notebook

CONLLU = """\
# text = The hedgehog crossed the unpaved road.
1\tThe\t_\t_\t_\t_\t2\tdet\t_\t_
2\thedgehog\t_\t_\t_\t_\t3\tnsubj\t_\t_
3\tcrossed\t_\t_\t_\t_\t0\troot\t_\t_
4\tthe\t_\t_\t_\t_\t6\tdet\t_\t_
5\tunpaved\t_\t_\t_\t_\t6\tamod\t_\t_
6\troad\t_\t_\t_\t_\t3\tobj\t_\t_
7\t.\t_\t_\t_\t_\t3\tpunct\t_\t_

# text = Grandmother's tortoises sleep peacefully.
1\tGrandmother\t_\t_\t_\t_\t3\tnmod:poss\t_\t_
2\t's\t_\t_\t_\t_\t1\tcase\t_\t_
3\ttortoises\t_\t_\t_\t_\t4\tnsubj\t_\t_
4\tsleep\t_\t_\t_\t_\t0\troot\t_\t_
5\tpeacefully\t_\t_\t_\t_\t4\tadvmod\t_\t_
6\t.\t_\t_\t_\t_\t4\tpunct\t_\t_

# text = Archaeologists discovered ceramics and manuscripts near Thessaloniki.
1\tArchaeologists\t_\t_\t_\t_\t2\tnsubj\t_\t_
2\tdiscovered\t_\t_\t_\t_\t0\troot\t_\t_
3\tceramics\t_\t_\t_\t_\t2\tobj\t_\t_
4\tand\t_\t_\t_\t_\t5\tcc\t_\t_
5\tmanuscripts\t_\t_\t_\t_\t3\tconj\t_\t_
6\tnear\t_\t_\t_\t_\t7\tcase\t_\t_
7\tThessaloniki\t_\t_\t_\t_\t2\tobl\t_\t_
8\t.\t_\t_\t_\t_\t2\tpunct\t_\t_

# text = She gave the marmoset a pomegranate.
1\tShe\t_\t_\t_\t_\t2\tnsubj\t_\t_
2\tgave\t_\t_\t_\t_\t0\troot\t_\t_
3\tthe\t_\t_\t_\t_\t4\tdet\t_\t_
4\tmarmoset\t_\t_\t_\t_\t2\tiobj\t_\t_
5\ta\t_\t_\t_\t_\t6\tdet\t_\t_
6\tpomegranate\t_\t_\t_\t_\t2\tobj\t_\t_
7\t.\t_\t_\t_\t_\t2\tpunct\t_\t_

"""


def clark_word_level(attn: np.ndarray, word_pieces: list[list[int]]) -> np.ndarray:
    """Their ``bpe_utils.make_attn_word_level``: ``attn [layer, head, piece, piece]`` with [CLS] and [SEP] as
    one-piece "words" at the ends; sum over the pieces attended TO, then mean over the pieces attending FROM."""
    to_words = np.stack([attn[..., pieces].sum(-1) for pieces in word_pieces], axis=-1)
    return np.stack([to_words[..., pieces, :].mean(-2) for pieces in word_pieces], axis=-2)


def clark_attn_head_predictor(word_attn: np.ndarray, layer: int, head: int, mode: str = "normal") -> np.ndarray:
    attn = np.array(word_attn[layer][head])
    if mode == "transpose":
        attn = attn.T
    attn[range(attn.shape[0]), range(attn.shape[0])] = 0
    attn = attn[1:-1, 1:-1]
    return np.argmax(attn, axis=-1) + 1


def clark_evaluate_predictor(examples: list[dict], prediction_fn) -> dict[str, float]:
    correct, total = collections.Counter(), collections.Counter()
    for example in examples:
        words = example["words"]
        predictions = prediction_fn(example)
        for i, (p, y, r) in enumerate(zip(predictions, example["heads"], example["relns"], strict=True)):
            is_correct = p == y
            if r == "poss" and p < len(words):  # their special case for PTB possessive 's (never fires on UD)
                is_correct = predictions[i + 1] == y
            correct[r] += is_correct
            total[r] += 1
            correct["all"] += is_correct
            total["all"] += 1
    return {k: correct[k] / total[k] for k in total}


@pytest.mark.slow
def test_both_directions_equal_an_independent_port_of_clark_on_gold_conllu(tmp_path, bundled, hf_bundled, tokenizer):
    path = tmp_path / "gold.conllu"
    path.write_text(CONLLU)
    corpus = corpus_mod.load_corpus(str(path))
    # --- Clark: tokenize word by word, attention from transformers' reference model (eager)
    examples = []
    for sentence in corpus:
        pieces = [tokenizer.tokenize(w) for w in sentence.words]
        ids = tokenizer.convert_tokens_to_ids(["[CLS]", *[p for ps in pieces for p in ps], "[SEP]"])
        spans, start = [[0]], 1
        for ps in pieces:
            spans.append(list(range(start, start + len(ps))))
            start += len(ps)
        spans.append([start])
        with torch.no_grad():
            out = hf_bundled(torch.tensor([ids]), output_attentions=True)
        attn = torch.stack(out.attentions)[:, 0].double().numpy()  # [layer, head, piece, piece]
        examples.append({"words": list(sentence.words), "heads": list(sentence.heads),
                         "relns": list(sentence.deprels), "attns": clark_word_level(attn, spans)})  # fmt: skip
    assert any(len(s) > 1 for s in spans), "want words split into several pieces"
    n_layers, n_heads = examples[0]["attns"].shape[:2]
    # --- bertscope: the experiment's path (encode, run_with_cache, word_attention, sentence_arc_hits)
    encoded = corpus_mod.encode(corpus, tokenizer, batch_size=8)
    parts = []
    for batch in encoded.batches:
        with torch.no_grad():
            _, cache = bundled.run_with_cache(batch.input_ids, batch.attention_mask, batch.token_type_ids,
                                              names_filter="blocks.*.attn.hook_pattern")  # fmt: skip
        patterns = cache.stack("attn.hook_pattern")
        for b, si in enumerate(batch.sentence_index):
            maps = corpus_mod.word_attention(patterns[:, b], batch.word_ids[b])
            s = corpus[si]
            parts.append(syn.sentence_arc_hits(maps, s.heads, s.deprels, int(si)))
    ours = syn.head_relation_accuracy(syn.ArcHits.concat(parts)).set_index(["relation", "layer", "head", "direction"])
    compared = 0
    for layer in range(n_layers):
        for head in range(n_heads):
            for mode, direction in (("normal", "dep->head"), ("transpose", "head->dep")):
                scores = clark_evaluate_predictor(
                    examples, lambda ex, m=mode: clark_attn_head_predictor(ex["attns"], layer, head, m)  # noqa: B023
                )
                assert scores["root"] == 0.0  # an argmax over words never names the root
                for rel, value in scores.items():
                    if rel in ("all", "root"):
                        continue
                    assert ours.loc[(rel, layer, head, direction), "accuracy"] == pytest.approx(value), (
                        rel, layer, head, direction)  # fmt: skip
                    compared += 1
    # 12 relations besides root (det nsubj obj amod punct nmod:poss case advmod cc conj obl iobj), subtype kept
    assert compared == n_layers * n_heads * 2 * 12
    assert "nmod:poss" in ours.index.get_level_values("relation")
