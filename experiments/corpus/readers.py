"""Corpus files: plain text, CoNLL-U and JSONL readers, and a CoNLL-U writer.

Every error names the file, and the line where there is one (`path:line: problem; what to do`).
"""

from __future__ import annotations

import warnings
from pathlib import Path

from ...hooks.jsonl import json_objects, utf8_lines
from .base import Corpus, CorpusError, CorpusFileNotFoundError, Sentence, invisible_problem, tree_problems

CONLLU_COLUMNS = ("ID", "FORM", "LEMMA", "UPOS", "XPOS", "FEATS", "HEAD", "DEPREL", "DEPS", "MISC")
SUFFIXES = {".txt": "text", ".text": "text", ".conllu": "conllu", ".conll": "conllu", ".jsonl": "jsonl",
            ".ndjson": "jsonl"}


def read_corpus_file(path: str | Path, *, max_sentences: int | None = None) -> Corpus:
    """Read a corpus file, choosing the reader by suffix (see `SUFFIXES`)."""
    path = Path(path)
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise CorpusError(
            f"{path}: unknown corpus file type {path.suffix!r}; use one of {sorted(SUFFIXES)} "
            "(plain text: one segment per line; CoNLL-U; JSONL with a 'text' field)"
        )
    reader = {"text": read_text, "conllu": read_conllu, "jsonl": read_jsonl}[kind]
    return reader(path, max_sentences=max_sentences)


def read_text(path: str | Path, *, max_sentences: int | None = None) -> Corpus:
    """Plain text: one segment per line, words split on whitespace, blank lines skipped.
    Sentence ids are `<file name>:<line number>`."""
    path = Path(path)
    sentences = []
    for lineno, line in enumerate(_read_lines(path), start=1):
        if max_sentences is not None and len(sentences) >= max_sentences:
            break
        words = line.split()
        _check_visible(path, lineno, words)
        if words:
            sentences.append(Sentence(id=f"{path.name}:{lineno}", words=tuple(words), text=line.strip()))
    return _corpus(path, sentences)


def read_jsonl(path: str | Path, *, max_sentences: int | None = None, field: str = "text") -> Corpus:
    """JSON Lines: one object per line with a string `field` (default `text`); words split on whitespace.
    An `id` field, when present, becomes the sentence id (else `<file name>:<line number>`).
    Blank lines are skipped; objects whose text has no words are skipped with a warning."""
    path = Path(path)
    sentences, empty = [], []
    fail = lambda lineno, problem: CorpusError(f"{path}:{lineno}: {problem}")  # noqa: E731
    for lineno, record in json_objects(_read_lines(path), fail, expected=f"a JSON object with a {field!r} field"):
        if max_sentences is not None and len(sentences) >= max_sentences:
            break
        if field not in record:
            raise CorpusError(f"{path}:{lineno}: object has no {field!r} field (keys: {sorted(record)})")
        text = record[field]
        if not isinstance(text, str):
            raise CorpusError(f"{path}:{lineno}: field {field!r} must be a string, got {type(text).__name__}")
        words = text.split()
        _check_visible(path, lineno, words)
        if not words:
            empty.append(lineno)
            continue
        sentence_id = str(record["id"]) if "id" in record else f"{path.name}:{lineno}"
        sentences.append(Sentence(id=sentence_id, words=tuple(words), text=text.strip()))
    if empty:
        warnings.warn(f"{path}: skipped {len(empty)} line(s) whose {field!r} has no words "
                      f"(first: line {empty[0]})", stacklevel=2)
    return _corpus(path, sentences)


def read_conllu(path: str | Path, *, max_sentences: int | None = None) -> Corpus:
    """CoNLL-U: sentences separated by blank lines; `#` comment lines (`# sent_id = ...` and `# text = ...`
    are used when present). Words are the syntactic words (integer IDs), which HEAD indexes; a multiword-token
    range (`3-4 don't`) becomes `Sentence.multiword` (the model reads its surface form; its words keep their
    own annotations); empty nodes (`8.1`, enhanced graphs only) are left out (basic trees never point to them).
    UPOS, XPOS, HEAD and DEPREL are kept when every word of a sentence has them; `_` everywhere means absent."""
    path = Path(path)
    sentences: list[Sentence] = []
    block: list[tuple[int, str]] = []
    comments: dict[str, str] = {}
    lines = _read_lines(path)
    for lineno, line in enumerate([*lines, ""], start=1):
        if max_sentences is not None and len(sentences) >= max_sentences:
            break
        if not line.strip():
            if block:
                sentences.append(_conllu_sentence(path, block, comments))
            elif comments:
                raise CorpusError(f"{path}:{lineno}: comment lines with no word lines after them")
            block, comments = [], {}
        elif line.startswith("#"):
            key, sep, value = line[1:].partition("=")
            if sep and not block:
                comments[key.strip()] = value.strip()
        else:
            block.append((lineno, line))
    return _corpus(path, sentences)


def write_conllu(corpus: Corpus, path: str | Path) -> Path:
    """Write `corpus` as CoNLL-U (`# sent_id`, `# text`, multiword ranges, ID FORM UPOS XPOS HEAD DEPREL; other
    columns `_`)."""
    path = Path(path)
    out = []
    for s in corpus:
        out += [f"# sent_id = {s.id}", f"# text = {s.text}"]
        ranges = {first: (last, form) for first, last, form in s.multiword}
        for i, word in enumerate(s.words):
            if i in ranges:
                last, form = ranges[i]
                out.append("\t".join([f"{i + 1}-{last + 1}", form] + ["_"] * 8))
            upos = s.upos[i] if s.upos else "_"
            xpos = s.xpos[i] if s.xpos else "_"
            head = str(s.heads[i]) if s.heads else "_"
            deprel = s.deprels[i] if s.deprels else "_"
            out.append("\t".join([str(i + 1), word, "_", upos, xpos, "_", head, deprel, "_", "_"]))
        out.append("")
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path


# ----------------------------------------------------------------------------------------------------------


def _read_lines(path: Path) -> list[str]:
    """The file's lines (UTF-8, optional BOM, `\\n` or `\\r\\n`), or a clear error naming the file."""
    if not path.exists():
        raise CorpusFileNotFoundError(
            f"corpus file {path} does not exist; give an existing .txt/.conllu/.jsonl file, "
            "or 'builtin' / 'repeated-random'"
        )
    if path.is_dir():
        raise CorpusError(f"{path} is a directory; give a corpus file (.txt, .conllu or .jsonl)")
    lines = utf8_lines(path.read_bytes(), path, CorpusError)
    if not any(line.strip() for line in lines):
        raise CorpusError(f"{path} is empty; a corpus file needs at least one sentence")
    return lines


def _check_visible(path: Path, lineno: int, words: list[str]) -> None:
    problem = invisible_problem(words)
    if problem:
        raise CorpusError(f"{path}:{lineno}: {problem}")


def _corpus(path: Path, sentences: list[Sentence]) -> Corpus:
    if not sentences:
        raise CorpusError(f"{path} contains no sentences")
    return Corpus(name=path.stem, source=str(path.resolve()), sentences=sentences)


def _conllu_sentence(path: Path, block: list[tuple[int, str]], comments: dict[str, str]) -> Sentence:
    words: list[str] = []
    upos: list[str | None] = []
    xpos: list[str | None] = []
    heads: list[int | None] = []
    deprels: list[str | None] = []
    lines: list[int] = []
    multiword: list[tuple[int, int, str, str]] = []  # 1-based first, last, form, where
    for lineno, line in block:
        cols = line.split("\t")
        where = f"{path}:{lineno}"
        if len(cols) != 10:
            raise CorpusError(
                f"{where}: expected 10 tab-separated columns ({' '.join(CONLLU_COLUMNS)}), found {len(cols)}"
            )
        token_id = cols[0]
        if "-" in token_id or "." in token_id:  # multiword-token range or empty node
            low, _, high = token_id.replace(".", "-").partition("-")
            if not (low.isdigit() and high.isdigit()):
                raise CorpusError(f"{where}: malformed token ID {token_id!r}")
            if "-" in token_id:
                if int(low) != len(words) + 1 or int(high) <= int(low):
                    raise CorpusError(f"{where}: multiword token {token_id!r} must start at the next word "
                                      f"({len(words) + 1}) and span at least two words")
                multiword.append((int(low), int(high), cols[1], where))
            continue
        if not token_id.isdigit() or int(token_id) != len(words) + 1:
            raise CorpusError(f"{where}: token ID {token_id!r} out of sequence (expected {len(words) + 1})")
        form, head, deprel = cols[1], cols[6], cols[7]
        if not form or form.isspace():
            raise CorpusError(f"{where}: empty FORM")
        if invisible_problem([form]):
            raise CorpusError(f"{where}: FORM {invisible_problem([form]).removeprefix('word 1 ')}")
        if head != "_" and not head.isdigit():
            raise CorpusError(f"{where}: HEAD must be a non-negative integer or '_', got {head!r}")
        words.append(form)
        upos.append(None if cols[3] == "_" else cols[3])
        xpos.append(None if cols[4] == "_" else cols[4])
        heads.append(None if head == "_" else int(head))
        deprels.append(None if deprel == "_" else deprel)
        lines.append(lineno)
    first = f"{path}:{block[0][0]}"
    if not words:
        raise CorpusError(f"{first}: sentence has no word lines (only ranges or empty nodes)")
    for low, high, form, where in multiword:
        if high > len(words):
            raise CorpusError(f"{where}: multiword token {low}-{high} reaches past the sentence's {len(words)} words")
        if not form or form.isspace() or form == "_":
            raise CorpusError(f"{where}: multiword token {low}-{high} has no surface FORM")
    upos_t = _all_or_none(path, lines, upos, "UPOS")
    xpos_t = tuple(xpos) if all(x is not None for x in xpos) else None  # optional: a gap means no XPOS
    heads_t = _all_or_none(path, lines, heads, "HEAD")
    deprels_t = _all_or_none(path, lines, deprels, "DEPREL")
    if heads_t is not None and deprels_t is None:
        raise CorpusError(f"{first}: sentence has HEAD but no DEPREL; give both or neither")
    if heads_t is None:
        deprels_t = None
    else:
        bad = [i for i, h in enumerate(heads_t) if h > len(words)]
        if bad:
            raise CorpusError(f"{path}:{lines[bad[0]]}: HEAD {heads_t[bad[0]]} is beyond the sentence's "
                              f"{len(words)} words")
        problems = tree_problems(heads_t)
        if problems:
            raise CorpusError(f"{first}: sentence is not one dependency tree: {'; '.join(problems)}")
    return Sentence(
        id=comments.get("sent_id", f"{path.name}:{block[0][0]}"),
        words=tuple(words),
        text=comments.get("text", " ".join(words)),
        upos=upos_t,
        heads=heads_t,
        deprels=deprels_t,
        multiword=tuple((low - 1, high - 1, form) for low, high, form, _ in multiword),
        xpos=xpos_t,
    )


def _all_or_none(path: Path, lines: list[int], values: list, column: str) -> tuple | None:
    """All values present -> tuple; all absent -> None; a mix is an error naming the first gap."""
    missing = [i for i, v in enumerate(values) if v is None]
    if not missing:
        return tuple(values)
    if len(missing) == len(values):
        return None
    raise CorpusError(f"{path}:{lines[missing[0]]}: {column} is '_' here but given for other words "
                      "of the sentence; give it for every word or for none")
