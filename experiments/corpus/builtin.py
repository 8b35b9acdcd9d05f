"""`builtin`: a seeded generator of English sentences with gold UPOS tags and UD dependency trees.

A small grammar written for this project builds each sentence as a tree of nodes (head word, dependents
to its left and right, each dependent with its relation) and reads the words off in order, so every gold
tree is projective and well formed by construction. Relations follow Universal Dependencies v2 as in the
English Web Treebank: determiners `det`, possessive pronouns and `'s` possessors `nmod:poss` (with `'s` as
`case`), relative pronouns as `nsubj`/`obj` of an `acl:relcl`, infinitival `to` as `mark`, copular
sentences rooted at the adjective with `cop`, the second conjunct as `conj` of the first with `cc` on the
second, and every comma or final punctuation mark as `punct` of the root.

Nouns already used in a sentence are often used again (P_REPEAT), so words recur naturally. A few words
split into several WordPiece pieces (e.g. "hedgehog", "wheelbarrow", "'s") to exercise word alignment.
Sentences are generated one after another from one `random.Random` stream and duplicates are skipped, so
the first k sentences for a seed never depend on how many are asked for.
"""

from __future__ import annotations

import random

from .base import Corpus, CorpusError, Sentence
from .lexicon import (
    ADJECTIVES,
    ANIMATE,
    CLAUSAL,
    COMPOUNDS,
    CONJUNCTIONS,
    CONTROL,
    DEGREE,
    DITRANSITIVE,
    FRONTED,
    INTRANSITIVE,
    MANNER,
    MODALS,
    NAMES,
    NOUN_PREPS,
    NUMBERS,
    OBJECT_PRONOUNS,
    PLACES,
    POSSESSIVES,
    PREDICATIVE,
    PREVERBAL,
    SUBJECT_PRONOUNS,
    SUBORDINATORS,
    THINGS,
    TRANSITIVE,
    VERB_PREPS,
)

BUILTIN_SIZE = 3000  # sentences in the default builtin corpus
MAX_WORDS = 40  # longest sentence, punctuation included
MIN_WORDS = 3
P_REPEAT = 0.3  # chance that a noun slot reuses a noun already in the sentence


def generate_builtin(n_sentences: int = BUILTIN_SIZE, *, seed: int = 0) -> Corpus:
    """`n_sentences` distinct sentences with gold `upos`, `heads`, `deprels`; deterministic per `seed`.

    Sentence ids are `builtin/<seed>/<index>`; `meta` records the seed and generator parameters.
    """
    if not isinstance(n_sentences, int) or n_sentences < 1:
        raise ValueError(f"n_sentences must be a positive integer, got {n_sentences!r}")
    rng = random.Random(f"bertscope-builtin/{seed}")
    seen: set[str] = set()
    sentences: list[Sentence] = []
    attempts = 0
    while len(sentences) < n_sentences:
        attempts += 1
        if attempts > 50 * n_sentences + 1000:
            raise CorpusError(f"builtin generator could not find {n_sentences} distinct sentences")
        words, upos, heads, deprels = _Grammar(rng).sentence()
        if not MIN_WORDS <= len(words) <= MAX_WORDS:
            continue
        text = _detokenize(words)
        if text in seen:
            continue
        seen.add(text)
        sentences.append(Sentence(f"builtin/{seed}/{len(sentences)}", words, text, upos, heads, deprels))
    meta = {"seed": seed, "n_sentences": n_sentences, "max_words": MAX_WORDS, "p_repeat": P_REPEAT}
    return Corpus(name="builtin", source=f"builtin generator (seed={seed})", sentences=sentences, meta=meta)


# ---------------------------------------------------------------------------------------------- grammar


class _Node:
    """A word with its dependents; `left`/`right` hold dependents in reading order."""

    __slots__ = ("word", "upos", "deprel", "left", "right")

    def __init__(self, word: str, upos: str) -> None:
        self.word, self.upos, self.deprel = word, upos, "root"
        self.left: list[_Node] = []
        self.right: list[_Node] = []

    def add(self, deprel: str, child: _Node, *, before: bool = False) -> _Node:
        child.deprel = deprel
        (self.left if before else self.right).append(child)
        return child

    def add_first(self, deprel: str, child: _Node) -> _Node:
        """Attach `child` as the leftmost word of this node's phrase (a preposition, `that`, `and`)."""
        child.deprel = deprel
        self.left.insert(0, child)
        return child


class _Grammar:
    """Builds one sentence; probabilities below set the mix of constructions and the length spread."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: list[tuple[str, ...]] = []  # noun entries already in this sentence

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def sentence(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...], tuple[str, ...]]:
        root = self.clause(depth=0)
        if self.chance(0.12):  # clause coordination: "... and the dog slept"
            second = self.clause(depth=1)
            second.add_first("cc", _Node(self.rng.choice(CONJUNCTIONS), "CCONJ"))
            root.add("conj", second)
        if self.chance(0.1):
            clause = self.adverbial_clause(depth=1)
            if self.chance(0.5):  # "When the bell rang , the children ran ."
                root.add_first("punct", _Node(",", "PUNCT"))
                root.add_first("advcl", clause)
            else:
                root.add("advcl", clause)
        elif self.chance(0.07):  # "Suddenly , ..."
            root.add_first("punct", _Node(",", "PUNCT"))
            root.add_first("advmod", _Node(self.rng.choice(FRONTED), "ADV"))
        root.add("punct", _Node("!" if self.chance(0.06) else ".", "PUNCT"))
        return _linearize(root)

    # -- clauses

    def clause(self, depth: int) -> _Node:
        """A finite clause; returns its head (a verb, or an adjective for copular clauses)."""
        r = self.rng.random()
        if r < 0.1:
            return self.copular_clause(depth)
        frame = ("intr" if r < 0.38 else "trans" if r < 0.8 else "ditrans" if r < 0.87 else
                 "clausal" if r < 0.94 and depth < 2 else "control" if depth < 2 else "trans")
        head = _Node("", "VERB")
        subject, agr = self.noun_phrase(depth + 1, role="subj", animate=True)
        head.add("nsubj", subject, before=True)
        entry = self.rng.choice({"intr": INTRANSITIVE, "trans": TRANSITIVE, "ditrans": DITRANSITIVE,
                                 "clausal": CLAUSAL, "control": CONTROL}[frame])
        form = self.inflect(head, entry, agr, self.tense(), negate=self.chance(0.1))
        self.complements(head, frame, depth)
        if self.chance(0.1) and depth < 2:  # verb-phrase coordination: "... laughed and sang"
            conj_entry = self.rng.choice(INTRANSITIVE + TRANSITIVE)
            conj = head.add("conj", _Node(conj_entry[form], "VERB"))  # same form as the first verb
            conj.add("cc", _Node("and", "CCONJ"), before=True)
            self.complements(conj, "intr" if conj_entry in INTRANSITIVE else "trans", depth + 1)
        return head

    def copular_clause(self, depth: int) -> _Node:
        """'the dog was very happy': rooted at the adjective; the copula is `cop`."""
        head = _Node(self.rng.choice(PREDICATIVE), "ADJ")
        subject, agr = self.noun_phrase(depth + 1, role="subj")
        head.add("nsubj", subject, before=True)
        tense, negate = self.tense(), self.chance(0.12)
        if tense in ("modal", "perfect"):
            aux = self.rng.choice(MODALS) if tense == "modal" else ("has" if agr == "3sg" else "have")
            head.add("aux", _Node(aux, "AUX"), before=True)
            if negate:
                head.add("advmod", _Node("not", "PART"), before=True)
            head.add("cop", _Node("be" if tense == "modal" else "been", "AUX"), before=True)
        else:
            forms = {"past": {"1sg": "was", "3sg": "was"}, "present": {"1sg": "am", "3sg": "is"}}[tense]
            head.add("cop", _Node(forms.get(agr, "were" if tense == "past" else "are"), "AUX"), before=True)
            if negate:
                head.add("advmod", _Node("not", "PART"), before=True)
        if self.chance(0.3):
            head.add("advmod", _Node(self.rng.choice(DEGREE), "ADV"), before=True)
        if self.chance(0.15):
            head.add("obl", self.prepositional(depth + 1, VERB_PREPS))
        return head

    def tense(self) -> str:
        r = self.rng.random()
        return "past" if r < 0.45 else "present" if r < 0.7 else "modal" if r < 0.88 else "perfect"

    def inflect(self, head: _Node, entry: tuple[str, ...], agr: str, tense: str, *, negate: bool) -> int:
        """Set the verb form and add auxiliaries, negation and a pre-verbal adverb (after the subject).
        Returns the form used: an index into `entry` (base, third person singular, past, participle)."""
        aux = None
        if tense == "modal":
            aux, form = self.rng.choice(MODALS), 0
        elif tense == "perfect":
            aux = "had" if self.chance(0.25) else "has" if agr == "3sg" else "have"
            form = 3
        elif negate:  # do-support
            aux = "did" if tense == "past" else "does" if agr == "3sg" else "do"
            form = 0
        else:
            form = 2 if tense == "past" else 1 if agr == "3sg" else 0
        head.word = entry[form]
        if aux:
            head.add("aux", _Node(aux, "AUX"), before=True)
        if negate:
            head.add("advmod", _Node("not", "PART"), before=True)
        elif self.chance(0.08):
            head.add("advmod", _Node(self.rng.choice(PREVERBAL), "ADV"), before=True)
        return form

    def complements(self, head: _Node, frame: str, depth: int) -> None:
        """Objects and clausal complements for `frame`, then optional adverb and prepositional phrases."""
        if frame == "trans":
            head.add("obj", self.noun_phrase(depth + 1, role="obj")[0])
        elif frame == "ditrans":
            head.add("iobj", self.noun_phrase(depth + 1, role="obj", animate=True, plain=True)[0])
            head.add("obj", self.noun_phrase(depth + 1, role="obj", animate=False)[0])
        elif frame == "clausal":
            embedded = self.clause(depth + 1)
            if self.chance(0.7):
                embedded.add_first("mark", _Node("that", "SCONJ"))
            head.add("ccomp", embedded)
            return  # an adverb or PP after the clause would read as the embedded verb's
        elif frame == "control":  # "wanted to read the book"
            entry = self.rng.choice(INTRANSITIVE + TRANSITIVE)
            verb = head.add("xcomp", _Node(entry[0], "VERB"))
            verb.add("mark", _Node("to", "PART"), before=True)
            self.complements(verb, "intr" if entry in INTRANSITIVE else "trans", depth + 1)
            return
        if self.chance(0.15):
            head.add("advmod", _Node(self.rng.choice(MANNER), "ADV"))
        for _ in range(2):
            if depth < 3 and self.chance(0.3):
                head.add("obl", self.prepositional(depth + 1, VERB_PREPS))

    def adverbial_clause(self, depth: int) -> _Node:
        clause = self.clause(depth + 1)
        clause.add_first("mark", _Node(self.rng.choice(SUBORDINATORS), "SCONJ"))
        return clause

    def relative_clause(self, noun: _Node, animate: bool, agr: str, depth: int) -> None:
        """Subject relative ('who saw the dog') or object relative ('that the girl found')."""
        verb = _Node("", "VERB")
        tense = "past" if self.chance(0.6) else "present"
        if self.chance(0.55 if animate else 0.2):
            pronoun = "who" if animate and self.chance(0.7) else "that" if self.chance(0.6) else "which"
            verb.add("nsubj", _Node(pronoun, "PRON"), before=True)
            entry = self.rng.choice(INTRANSITIVE + TRANSITIVE)
            self.inflect(verb, entry, agr, tense, negate=False)
            if entry in TRANSITIVE:
                verb.add("obj", self.noun_phrase(depth + 1, role="obj", plain=True)[0])
        else:
            if self.chance(0.8):  # else a bare relative: "the book the girl found"
                pronoun = "who" if animate and self.chance(0.5) else "that" if self.chance(0.6) else "which"
                verb.add("obj", _Node(pronoun, "PRON"), before=True)
            subject, subject_agr = self.noun_phrase(depth + 1, role="subj", animate=True, plain=True)
            verb.add("nsubj", subject, before=True)
            self.inflect(verb, self.rng.choice(TRANSITIVE), subject_agr, tense, negate=False)
        if self.chance(0.2):
            verb.add("obl", self.prepositional(depth + 1, VERB_PREPS, plain=True))
        noun.add("acl:relcl", verb)

    # -- noun phrases

    def noun_phrase(self, depth: int, *, role: str, animate: bool | None = None,
                    plain: bool = False) -> tuple[_Node, str]:
        """A noun phrase and its agreement class ('1sg', '2', '3sg', 'pl'). `plain` forbids clauses/PPs."""
        r = self.rng.random()
        if r < 0.12 and animate is not False:
            if role == "subj":
                word, agr = self.rng.choice(SUBJECT_PRONOUNS)
                return _Node(word, "PRON"), agr
            return _Node(self.rng.choice(OBJECT_PRONOUNS), "PRON"), "3sg"
        if r < 0.18 and animate is not False:
            return _Node(self.rng.choice(NAMES).capitalize(), "PROPN"), "3sg"
        if animate is None:
            animate = self.chance(0.5)
        return self.common_noun(depth, ANIMATE if animate else THINGS, plain=plain, animate=animate)

    def common_noun(self, depth: int, pool: list[tuple[str, ...]], *, plain: bool = False,
                    animate: bool = False, possessor: bool = False) -> tuple[_Node, str]:
        plural = not possessor and self.chance(0.25)
        compound = None
        if pool is THINGS and not possessor and self.chance(0.06):
            compound, singular, plural_form = self.rng.choice(COMPOUNDS)
            noun = _Node(plural_form if plural else singular, "NOUN")
        else:
            entry = self.noun_entry(pool)
            noun = _Node(entry[1] if plural else entry[0], "NOUN")
        self.determiner(noun, depth, plural, possessor)
        if self.chance(0.3):
            if self.chance(0.15):
                adjective = noun.add("amod", _Node(self.rng.choice(ADJECTIVES), "ADJ"), before=True)
                adjective.add("advmod", _Node(self.rng.choice(DEGREE), "ADV"), before=True)
            else:
                noun.add("amod", _Node(self.rng.choice(ADJECTIVES), "ADJ"), before=True)
            if self.chance(0.2):
                noun.add("amod", _Node(self.rng.choice(ADJECTIVES), "ADJ"), before=True)
        if compound:
            noun.add("compound", _Node(compound, "NOUN"), before=True)
        if possessor:
            noun.add("case", _Node("'s", "PART"))
        elif not plain and depth < 3:
            if self.chance(0.12):
                noun.add("nmod", self.prepositional(depth + 1, NOUN_PREPS, plain=True))
            if self.chance(0.12):
                self.relative_clause(noun, animate, "pl" if plural else "3sg", depth)
        return noun, "pl" if plural else "3sg"

    def determiner(self, noun: _Node, depth: int, plural: bool, possessor: bool) -> None:
        r = self.rng.random()
        if r < 0.1:
            noun.add("nmod:poss", _Node(self.rng.choice(POSSESSIVES), "PRON"), before=True)
        elif r < 0.16 and not possessor and depth < 3:  # "the teacher 's dog"
            owner, _ = self.common_noun(depth + 1, ANIMATE, possessor=True)
            noun.add("nmod:poss", owner, before=True)
        elif plural:
            if r < 0.26:
                noun.add("nummod", _Node(self.rng.choice(NUMBERS), "NUM"), before=True)
            elif r < 0.85:
                det = "the" if r < 0.6 else self.rng.choice(["some", "these", "those", "no"])
                noun.add("det", _Node(det, "DET"), before=True)
        else:
            det = "the" if r < 0.62 else "a" if r < 0.88 else self.rng.choice(["this", "that", "every", "each"])
            noun.add("det", _Node(det, "DET"), before=True)

    def noun_entry(self, pool: list[tuple[str, ...]]) -> tuple[str, ...]:
        """A noun from `pool`, often one already used in this sentence."""
        seen = [entry for entry in self.used if entry in pool]
        entry = self.rng.choice(seen) if seen and self.chance(P_REPEAT) else self.rng.choice(pool)
        self.used.append(entry)
        return entry

    def prepositional(self, depth: int, prepositions: list[str], *, plain: bool = False) -> _Node:
        """'in the old garden': the noun heads the phrase; the preposition is its `case` dependent."""
        pool = PLACES if self.chance(0.6) else THINGS if self.chance(0.6) else ANIMATE
        noun, _ = self.common_noun(depth, pool, plain=plain or depth >= 2, animate=pool is ANIMATE)
        noun.add_first("case", _Node(self.rng.choice(prepositions), "ADP"))
        return noun


# ---------------------------------------------------------------------------------------------- helpers


def _linearize(root: _Node) -> tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...], tuple[str, ...]]:
    """Words in reading order with 1-based heads; fixes 'a' before vowels and capitalises the first word."""
    order: list[_Node] = []
    parent: dict[int, _Node | None] = {id(root): None}

    def visit(node: _Node) -> None:
        for child in node.left:
            parent[id(child)] = node
            visit(child)
        order.append(node)
        for child in node.right:
            parent[id(child)] = node
            visit(child)

    visit(root)
    position = {id(node): i + 1 for i, node in enumerate(order)}
    words = [node.word for node in order]
    for i in range(len(words) - 1):
        if words[i] == "a" and order[i].upos == "DET" and words[i + 1][0] in "aeiou":
            words[i] = "an"
    words[0] = words[0][0].upper() + words[0][1:]
    heads = tuple(0 if parent[id(n)] is None else position[id(parent[id(n)])] for n in order)
    return tuple(words), tuple(n.upos for n in order), heads, tuple(n.deprel for n in order)


_NO_SPACE_BEFORE = {".", ",", "!", "?", "'s"}


def _detokenize(words: tuple[str, ...]) -> str:
    text = words[0]
    for word in words[1:]:
        text += word if word in _NO_SPACE_BEFORE else " " + word
    return text
