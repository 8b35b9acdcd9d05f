"""Corpora: file readers (good and malformed files), the builtin generator's gold trees, repeated-random."""

from __future__ import annotations

import collections
import json
import re

import pytest
from bertscope.experiments.corpus import (
    BUILTIN_SIZE,
    Corpus,
    CorpusError,
    CorpusFileNotFoundError,
    Sentence,
    generate_builtin,
    load_corpus,
    read_conllu,
    read_jsonl,
    read_text,
    repeated_random,
    tree_problems,
    write_conllu,
)


@pytest.fixture(scope="module")
def builtin() -> Corpus:
    return generate_builtin()


# ---------------------------------------------------------------------------------------------- plain text


def test_text_reader_splits_on_whitespace_and_skips_blank_lines(tmp_path):
    path = tmp_path / "small.txt"
    path.write_bytes("\ufeffThe cat  sat.\r\n\r\n   \n\tdogs\tbark loudly \nlast line no newline".encode())
    corpus = read_text(path)
    assert [s.words for s in corpus] == [("The", "cat", "sat."), ("dogs", "bark", "loudly"),
                                         ("last", "line", "no", "newline")]
    assert [s.id for s in corpus] == ["small.txt:1", "small.txt:4", "small.txt:5"]
    assert corpus[1].text == "dogs\tbark loudly"
    assert not corpus.has_syntax and not corpus.has_upos
    assert len(read_text(path, max_sentences=2)) == 2


@pytest.mark.parametrize("content", [b"", b"  \n\n\t\n"])
@pytest.mark.parametrize("suffix", [".txt", ".conllu", ".jsonl"])
def test_empty_files_are_errors_naming_the_file(tmp_path, content, suffix):
    path = tmp_path / f"empty{suffix}"
    path.write_bytes(content)
    with pytest.raises(CorpusError, match=re.escape(str(path)) + " is empty"):
        load_corpus(path)


@pytest.mark.parametrize("suffix", [".txt", ".conllu", ".jsonl"])
def test_non_utf8_bytes_are_errors_naming_file_and_line(tmp_path, suffix):
    path = tmp_path / f"latin1{suffix}"
    good = '{"text": "fine"}\n' if suffix == ".jsonl" else "fine\n"
    path.write_bytes(good.encode() * 2 + "caf\u00e9\n".encode("latin-1"))
    with pytest.raises(CorpusError, match=re.escape(f"{path}:3: not valid UTF-8")):
        load_corpus(path)


def test_missing_file_directory_and_unknown_names(tmp_path):
    with pytest.raises(CorpusFileNotFoundError, match=re.escape(str(tmp_path / "nope.txt"))) as info:
        load_corpus(tmp_path / "nope.txt")
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(CorpusFileNotFoundError, match="builtin, repeated-random"):
        load_corpus("buitlin")
    with pytest.raises(CorpusError, match="is a directory"):
        read_text(tmp_path)
    (tmp_path / "table.csv").write_text("a,b\n")
    with pytest.raises(CorpusError, match=r"unknown corpus file type '\.csv'"):
        load_corpus(tmp_path / "table.csv")
    with pytest.raises(ValueError, match="max_sentences"):
        load_corpus("builtin", max_sentences=0)


# ---------------------------------------------------------------------------------------------- CoNLL-U

GOOD_CONLLU = """\
# newdoc id = d1
# sent_id = s1
# text = The cat's toy fell.
1\tThe\tthe\tDET\t_\t_\t2\tdet\t_\t_
2-3\tcat's\t_\t_\t_\t_\t_\t_\t_\t_
2\tcat\tcat\tNOUN\t_\t_\t4\tnmod:poss\t_\t_
3\t's\t's\tPART\t_\t_\t2\tcase\t_\t_
4\ttoy\ttoy\tNOUN\t_\t_\t5\tnsubj\t_\t_
4.1\tgone\tgo\tVERB\t_\t_\t_\t_\t5:conj\t_
5\tfell\tfall\tVERB\t_\t_\t0\troot\t_\t_
6\t.\t.\tPUNCT\t_\t_\t5\tpunct\t_\t_

1\tDogs\tdog\tNOUN\t_\t_\t2\tnsubj\t_\t_
2\tbark\tbark\tVERB\t_\t_\t0\troot\t_\t_"""


def test_conllu_reader_keeps_words_tags_and_tree(tmp_path):
    path = tmp_path / "tiny.conllu"
    path.write_text(GOOD_CONLLU)
    corpus = read_conllu(path)
    first, second = corpus
    assert first.id == "s1" and first.text == "The cat's toy fell."
    assert first.words == ("The", "cat", "'s", "toy", "fell", ".")  # range 2-3 and empty node 4.1 skipped
    assert first.upos == ("DET", "NOUN", "PART", "NOUN", "VERB", "PUNCT")
    assert first.heads == (2, 4, 2, 5, 0, 5)
    assert first.deprels == ("det", "nmod:poss", "case", "nsubj", "root", "punct")
    assert second.id == "tiny.conllu:13" and second.text == "Dogs bark" and second.heads == (2, 0)
    assert corpus.has_syntax and corpus.has_upos


def test_conllu_without_annotations_has_no_syntax(tmp_path):
    path = tmp_path / "bare.conllu"
    path.write_text("1\tHello\t_\t_\t_\t_\t_\t_\t_\t_\n2\tthere\t_\t_\t_\t_\t_\t_\t_\t_\n")
    (sentence,) = read_conllu(path)
    assert sentence.words == ("Hello", "there") and sentence.upos is None and sentence.heads is None
    assert not read_conllu(path).has_syntax


def _row(i, word, upos="NOUN", head="0", deprel="root"):
    return "\t".join([str(i), word, "_", upos, "_", "_", head, deprel, "_", "_"])


# (lines of the file, the line the error must name, what the message must say)
MALFORMED_CONLLU = {
    "nine columns": (["# text = a b", _row(1, "a", head="2", deprel="det"), "2\tb\t_\tNOUN\t_\t_\t0\troot\t_"],
                     3, "expected 10 tab-separated columns"),
    "spaces not tabs": ([_row(1, "a").replace("\t", " ")], 1, "found 1"),
    "head not a number": ([_row(1, "a", head="x")], 1, "HEAD must be a non-negative integer"),
    "id out of sequence": ([_row(1, "a", head="0"), _row(3, "b", head="1", deprel="dep")], 2, "out of sequence"),
    "id not a number": (["one\ta\t_\tNOUN\t_\t_\t0\troot\t_\t_"], 1, "out of sequence"),
    "bad range": ([_row(1, "a"), "x-2\tab\t_\t_\t_\t_\t_\t_\t_\t_"], 2, "malformed token ID"),
    "head beyond sentence": ([_row(1, "a", head="0"), _row(2, "b", head="7", deprel="dep")], 2, "beyond"),
    "two roots": (["", _row(1, "a"), _row(2, "b")], 2, "2 roots"),
    "cycle": ([_row(1, "a", head="0"), _row(2, "b", head="3", deprel="dep"), _row(3, "c", head="2", deprel="dep")],
              1, "cycle through words [2, 3]"),
    "partial upos": ([_row(1, "a", head="0"), _row(2, "b", upos="_", head="1", deprel="dep")], 2, "UPOS is '_'"),
    "head without deprel": ([_row(1, "a", deprel="_")], 1, "HEAD but no DEPREL"),
}


@pytest.mark.parametrize("case", list(MALFORMED_CONLLU))
def test_malformed_conllu_names_file_and_line(tmp_path, case):
    lines, line_number, message = MALFORMED_CONLLU[case]
    path = tmp_path / "bad.conllu"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorpusError, match=re.escape(f"{path}:{line_number}: ") + ".*" + re.escape(message)):
        read_conllu(path)


def test_conllu_round_trip_of_the_builtin_corpus(tmp_path, builtin):
    corpus = builtin[:300]
    back = read_conllu(write_conllu(corpus, tmp_path / "builtin.conllu"))
    assert back.sentences == corpus.sentences
    assert back.sha256 == corpus.sha256


# ---------------------------------------------------------------------------------------------- JSONL


def test_jsonl_reader_uses_text_and_id(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": 7, "text": "a b  c"}\n\n{"text": "d", "other": 1}\n')
    corpus = read_jsonl(path)
    assert [s.words for s in corpus] == [("a", "b", "c"), ("d",)]
    assert [s.id for s in corpus] == ["7", "docs.jsonl:3"]


def test_jsonl_empty_text_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "a"}\n{"text": "   "}\n')
    with pytest.warns(UserWarning, match="skipped 1 line.*line 2"):
        assert len(read_jsonl(path)) == 1


@pytest.mark.parametrize(
    ("line", "message"),
    [('{"text": "unclosed', "not valid JSON"), ('["text"]', "expected a JSON object"),
     ('{"body": "x"}', "no 'text' field"), ('{"text": 3}', "must be a string")],
)
def test_bad_jsonl_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n' + line + "\n")
    with pytest.raises(CorpusError, match=re.escape(f"{path}:2: ") + ".*" + re.escape(message)):
        read_jsonl(path)


# ---------------------------------------------------------------------------------------------- trees


@pytest.mark.parametrize(
    ("heads", "problem"),
    [((2, 0, 2), None), ((0,), None), ((0, 0), "2 roots"), ((2, 3, 1), "0 roots"), ((0, 3, 2), "cycle"),
     ((0, 2), "its own head"), ((0, 5), "not in 0..2"), ((0, -1), "not in 0..2")],
)
def test_tree_problems_known_answers(heads, problem):
    problems = tree_problems(heads)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


def test_sentence_rejects_inconsistent_annotations():
    with pytest.raises(ValueError, match="2 upos for 3 words"):
        Sentence("x", ("a", "b", "c"), "a b c", upos=("DET", "NOUN"))
    with pytest.raises(ValueError, match="both heads and deprels"):
        Sentence("x", ("a",), "a", heads=(0,))
    with pytest.raises(ValueError, match="not a dependency tree"):
        Sentence("x", ("a", "b"), "a b", heads=(0, 0), deprels=("root", "root"))
    with pytest.raises(ValueError, match="empty or whitespace"):
        Sentence("x", ("a", " "), "a")


# ---------------------------------------------------------------------------------------------- builtin


def test_builtin_gold_trees_are_well_formed_and_projective(builtin):
    assert len(builtin) == BUILTIN_SIZE and builtin.has_syntax and builtin.has_upos
    for s in builtin:
        n = len(s.words)
        assert all(0 <= h <= n for h in s.heads)
        assert s.heads.count(0) == 1 and s.deprels[s.heads.index(0)] == "root"
        assert tree_problems(s.heads) == [], s.text
        for dep, head in enumerate(s.heads, start=1):  # projective: no arcs cross
            low, high = sorted((dep, head))
            for inner in range(low + 1, high):
                assert low <= s.heads[inner - 1] <= high, s.text


def test_builtin_punctuation_attaches_to_the_root(builtin):
    for s in builtin:
        root = s.heads.index(0) + 1
        for i, (upos, rel) in enumerate(zip(s.upos, s.deprels, strict=True)):
            assert (upos == "PUNCT") == (rel == "punct")
            if rel == "punct":
                assert s.heads[i] == root, s.text
        assert s.upos[-1] == "PUNCT" and s.words[-1] in ".!"


def test_builtin_relations_agree_with_their_words(builtin):
    """Each relation joins the kinds of words it should (UD conventions), e.g. det is a DET under a noun."""
    dependent = {"det": {"DET"}, "amod": {"ADJ"}, "case": {"ADP", "PART"}, "aux": {"AUX"}, "cop": {"AUX"},
                 "cc": {"CCONJ"}, "nummod": {"NUM"}, "compound": {"NOUN"}, "nmod:poss": {"PRON", "NOUN"},
                 "mark": {"SCONJ", "PART"}, "acl:relcl": {"VERB"}, "iobj": {"NOUN", "PRON", "PROPN"}}
    head = {"det": {"NOUN"}, "amod": {"NOUN"}, "case": {"NOUN", "PROPN"}, "nummod": {"NOUN"},
            "acl:relcl": {"NOUN"}, "nmod:poss": {"NOUN"}, "aux": {"VERB", "ADJ"}, "cop": {"ADJ"},
            "nsubj": {"VERB", "ADJ"}, "obj": {"VERB"}, "iobj": {"VERB"}, "xcomp": {"VERB"}, "ccomp": {"VERB"}}
    for s in builtin:
        for i, rel in enumerate(s.deprels):
            if rel in dependent:
                assert s.upos[i] in dependent[rel], (rel, s.words[i], s.text)
            if rel in head:
                assert s.upos[s.heads[i] - 1] in head[rel], (rel, s.words[i], s.text)
            if s.words[i] == "'s":
                assert rel == "case" and s.deprels[s.heads[i] - 1] == "nmod:poss"
            if s.words[i].lower() in ("a", "an") and s.upos[i] == "DET":  # a/an agrees with the next word
                assert (s.words[i].lower() == "an") == (s.words[i + 1][0] in "aeiou"), s.text


def test_builtin_covers_the_constructions(builtin):
    relations = collections.Counter(r for s in builtin for r in s.deprels)
    wanted = {"root", "det", "amod", "nsubj", "obj", "iobj", "aux", "cop", "case", "nmod", "obl", "nmod:poss",
              "cc", "conj", "acl:relcl", "punct", "advmod", "mark", "advcl", "ccomp", "xcomp", "nummod",
              "compound"}
    assert wanted <= set(relations), wanted - set(relations)
    assert min(relations[r] for r in wanted) >= 50  # each construction occurs often enough to study
    tags = {t for s in builtin for t in s.upos}
    assert tags == {"DET", "ADJ", "NOUN", "PROPN", "PRON", "AUX", "VERB", "ADP", "ADV", "CCONJ", "SCONJ", "PART",
                    "NUM", "PUNCT"}
    words = {w for s in builtin for w in s.words}
    assert {"'s", "who", "that", "not", "to", ","} <= words
    lengths = [len(s) for s in builtin]
    assert min(lengths) >= 3 and max(lengths) <= 40
    assert sum(n <= 8 for n in lengths) > 300 and sum(n >= 25 for n in lengths) > 100  # varied lengths


def test_builtin_words_repeat_within_sentences(builtin):
    repeated_noun = sum(
        any(c > 1 for c in collections.Counter(w.lower() for w, t in zip(s.words, s.upos, strict=True)
                                               if t == "NOUN").values())
        for s in builtin
    )
    repeated_word = sum(len({w.lower() for w in s.words}) < len(s.words) for s in builtin)
    assert repeated_noun > 0.1 * len(builtin)
    assert repeated_word > 0.4 * len(builtin)


def test_builtin_is_deterministic_per_seed_and_prefix_stable(builtin):
    again = generate_builtin(seed=0)
    assert again.sentences == builtin.sentences and again.sha256 == builtin.sha256
    other = generate_builtin(seed=1)
    assert other.sha256 != builtin.sha256
    assert sum(a.text == b.text for a, b in zip(other, builtin, strict=True)) < 0.05 * len(builtin)
    small = load_corpus("builtin", max_sentences=40)
    assert small.sentences == builtin.sentences[:40]
    assert len({s.text for s in builtin}) == len(builtin)  # no duplicates
    assert len({s.id for s in builtin}) == len(builtin)


def test_builtin_words_are_mostly_single_pieces_with_some_split(builtin, tokenizer):
    words = [w for s in builtin[:500] for w in s.words]
    n_pieces = [len(tokenizer.tokenize(w)) for w in words]
    split = sum(n > 1 for n in n_pieces) / len(words)
    assert 0.03 < split < 0.2
    assert max(n_pieces) >= 3


def test_corpus_hash_and_slicing(builtin):
    head = builtin[:10]
    assert isinstance(head, Corpus) and len(head) == 10 and head[3] is builtin[3]
    changed = Corpus(head.name, head.source, [*head.sentences[:9], Sentence("x", ("a",), "a")])
    assert changed.sha256 != head.sha256
    renamed = Corpus("other", "elsewhere", list(head.sentences))
    assert renamed.sha256 == head.sha256  # content only
    frame = head.words_frame()
    assert len(frame) == head.n_words
    assert list(frame.columns) == ["sentence_index", "sentence_id", "word_index", "word", "upos", "head", "deprel"]


# ---------------------------------------------------------------------------------------------- repeated-random


def test_repeated_random_copies_sit_at_offset_m(tokenizer):
    corpus = load_corpus("repeated-random", tokenizer=tokenizer, max_sentences=30)
    m = corpus.meta["m"]
    assert m == 20 and len(corpus) == 30
    special = set(tokenizer.all_special_tokens)
    for s in corpus:
        assert len(s.words) == 2 * m and s.words[:m] == s.words[m:]
        assert len(set(s.words[:m])) == m  # distinct, so the only copy of word i is at i + m
        for w in s.words[:m]:
            assert w.isalpha() and w not in special and tokenizer.tokenize(w) == [w]


def test_repeated_random_m_seed_and_errors(tokenizer):
    a = load_corpus("repeated-random:m=7", tokenizer=tokenizer, max_sentences=5)
    assert a.meta["m"] == 7 and all(len(s) == 14 for s in a)
    assert load_corpus("repeated-random", tokenizer=tokenizer, max_sentences=5, m=7).sha256 == a.sha256
    assert repeated_random(tokenizer, 5, m=7, seed=1).sha256 != a.sha256
    with pytest.raises(CorpusError, match="pass tokenizer="):
        load_corpus("repeated-random")
    with pytest.raises(ValueError, match="disagree"):
        load_corpus("repeated-random:m=7", tokenizer=tokenizer, m=8)
    with pytest.raises(ValueError, match="positive integer"):
        repeated_random(tokenizer, 5, m=0)


# ------------------------------------------------------------------------------------ invisible words (27.4)


@pytest.mark.parametrize("suffix", [".txt", ".jsonl", ".conllu"])
@pytest.mark.parametrize("word", ["\u200b\u200b", "\ufeff", "\u200d\u2060"])
def test_a_word_of_only_invisible_characters_is_an_error_naming_file_and_line(tmp_path, suffix, word):
    """Issue 27.4: a word made only of zero-width / format characters gives no word piece and broke every
    experiment; the reader names the file and line."""
    path = tmp_path / f"zw{suffix}"
    if suffix == ".txt":
        path.write_text(f"ok line\n{word}\n", encoding="utf-8")
        line = 2
    elif suffix == ".jsonl":
        path.write_text('{"text": "ok line"}\n' + json.dumps({"text": f"a {word} b"}) + "\n", encoding="utf-8")
        line = 2
    else:
        path.write_text(f"1\tok\t_\t_\t_\t_\t_\t_\t_\t_\n2\t{word}\t_\t_\t_\t_\t_\t_\t_\t_\n\n", encoding="utf-8")
        line = 2
    with pytest.raises(CorpusError, match=re.escape(f"{path}:{line}:") + ".*invisible"):
        load_corpus(path)


def test_invisible_characters_inside_a_visible_word_are_kept(tmp_path):
    path = tmp_path / "zwj.txt"
    path.write_text("co\u200boperate now\n", encoding="utf-8")
    assert read_text(path)[0].words == ("co\u200boperate", "now")


def test_sentence_rejects_an_invisible_word():
    with pytest.raises(ValueError, match="invisible"):
        Sentence(id="s", words=("ok", "\u200b"), text="ok \u200b")
