"""CoNLL-U multiword tokens and empty nodes: syntactic words for syntax, surface text for the model; and the
first sentences of UD English EWT when ../shared has it."""

from __future__ import annotations

from pathlib import Path

import pytest
from bertscope.experiments.corpus import Sentence, encode, read_conllu, write_conllu
from bertscope.experiments.corpus.base import CorpusError
from bertscope.experiments.corpus.ewt import find_ewt

EWT_DEV = find_ewt("dev")
needs_ewt = pytest.mark.skipif(EWT_DEV is None, reason="UD English EWT not found (set BERTSCOPE_UD_EWT, or put it "
                               "in ../shared/data/ud-english-ewt as CI does)")

MWT = """\
# sent_id = a
# text = I don't know its name
1	I	I	PRON	PRP	_	3	nsubj	_	_
2-3	don't	_	_	_	_	_	_	_	_
2	do	do	AUX	VBP	_	4	aux	_	_
3	n't	not	PART	RB	_	4	advmod	_	_
4	know	know	VERB	VB	_	0	root	_	_
4.1	knows	know	VERB	VB	_	_	_	4:conj	_
5-6	its	_	_	_	_	_	_	_	_
5	it	it	PRON	PRP	_	7	nmod:poss	_	_
6	s	s	PART	POS	_	5	case	_	_
7	name	name	NOUN	NN	_	4	obj	_	_

"""


def test_multiword_tokens_and_empty_nodes(tmp_path: Path) -> None:
    path = tmp_path / "mwt.conllu"
    path.write_text(MWT)
    (s,) = read_conllu(path)
    assert s.words == ("I", "do", "n't", "know", "it", "s", "name")  # syntactic words; 4.1 left out
    assert s.heads == (3, 4, 4, 0, 7, 5, 4) and s.deprels[2] == "advmod"  # heads index syntactic words
    assert s.multiword == ((1, 2, "don't"), (4, 5, "its"))
    assert s.xpos == ("PRP", "VBP", "RB", "VB", "PRP", "POS", "NN")
    assert [form for form, _ in s.surface_tokens()] == ["I", "don't", "know", "its", "name"]
    again = read_conllu(write_conllu(read_conllu(path), tmp_path / "again.conllu"))
    assert again[0].multiword == s.multiword and again[0].words == s.words and again[0].xpos == s.xpos


def test_the_model_reads_the_surface_form(tmp_path: Path, tokenizer) -> None:
    path = tmp_path / "mwt.conllu"
    path.write_text(MWT)
    (batch,) = encode(read_conllu(path), tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(batch.input_ids[0])
    wids = batch.word_ids[0].tolist()
    # "don't" is tokenised as running text (don ' t), not as "do" + "n't"; "don" -> do, "' t" -> n't
    assert pieces[1:5] == ["i", "don", "'", "t"] and wids[1:5] == [0, 1, 2, 2]
    # "its" is one piece for two words: that token falls back to the words' own pieces, and every word has one
    assert sorted(set(w for w in wids if w >= 0)) == list(range(7))
    plain = Sentence("p", ("I", "do", "n't"), "I do n't")
    (b2,) = encode([plain], tokenizer)
    assert tokenizer.convert_ids_to_tokens(b2.input_ids[0])[2] == "do"  # without the range: the words as given


@pytest.mark.parametrize("bad, message", [
    ("2-2\tx\t_\t_\t_\t_\t_\t_\t_\t_", "at least two words"),
    ("3-4\tx\t_\t_\t_\t_\t_\t_\t_\t_", "start at the next word"),
])
def test_malformed_multiword_ranges_are_errors(tmp_path: Path, bad: str, message: str) -> None:
    path = tmp_path / "bad.conllu"
    path.write_text(f"1\tA\t_\tX\t_\t_\t0\troot\t_\t_\n{bad}\n2\tb\t_\tX\t_\t_\t1\tdep\t_\t_\n3\tc\t_\tX\t_\t_\t1\tdep\t_\t_\n\n")
    with pytest.raises(CorpusError, match=message):
        read_conllu(path)


def test_sentence_checks_multiword_spans() -> None:
    with pytest.raises(ValueError, match="multiword"):
        Sentence("x", ("a", "b"), "ab", multiword=((0, 2, "ab"),))
    with pytest.raises(ValueError, match="multiword"):
        Sentence("x", ("a", "b", "c"), "abc", multiword=((0, 1, "ab"), (1, 2, "bc")))


@needs_ewt
def test_ewt_dev_first_sentences(tokenizer) -> None:
    corpus = read_conllu(EWT_DEV, max_sentences=40)
    assert len(corpus) == 40 and corpus.has_syntax and corpus.has_upos and corpus.has_xpos
    n_mwt = sum(len(s.multiword) for s in corpus)
    assert n_mwt > 0  # EWT's dev opens with contractions
    encoded = encode(corpus, tokenizer)
    seen = {b.sentence_index[r]: int(b.word_ids[r].max()) + 1 for b in encoded for r in range(len(b))}
    assert all(seen[i] == len(corpus[i]) for i in range(len(corpus)))  # every syntactic word has pieces
