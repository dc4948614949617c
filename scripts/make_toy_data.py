#!/usr/bin/env python3
"""Generate a small, deterministic, rule-based toy parallel corpus.

The corpus pairs an English-like source language with "Toyish", an invented
target language.  Every target sentence is a pure function of its source
sentence (no random choice happens during translation), so a perfect model can
reach 100 BLEU, yet the mapping has real structure that a translation model
has to learn:

* Vocabulary: about 100 content words (nouns, adjectives, verbs, numbers,
  prepositions), each with one fixed Toyish stem, e.g. ``dog -> hund-``,
  ``red -> rub-``, ``see -> vid-``.  Personal names (``Anna``, ``Tom``) are
  copied unchanged.  English irregular forms (``mice``, ``saw``) map to
  regular Toyish forms.
* Word order: Toyish is subject-object-verb.  A prepositional phrase becomes
  a postpositional phrase placed right after the subject, the direct object is
  followed by the object particle ``ka``, and the sentence ends with the verb.
  Inside a noun phrase, adjectives follow the noun in mirror order
  (``big red dog -> hundo rubo grando``), a number word comes after the
  adjectives, and a relative clause (``ki ...``) closes the noun phrase.
* Agreement: each noun has a lexical gender that English does not show.
  Masculine nouns end in ``-o`` (plural ``-oj``), feminine nouns in ``-a``
  (plural ``-aj``); adjectives take the same ending as their noun; articles
  agree in gender and number (the: ``lo la loj laj``; a/an: ``un una``;
  some: ``kelkoj kelkaj``).  Verbs agree with their subject in number and
  mark tense: present ``-as``/``-an`` (singular/plural), past ``-is``/``-in``.
* Negation: ``does/do/did not V`` becomes ``ne`` right before the verb.

Sentences have 3 to 15 source words, start with a capital letter and end with
``.`` on both sides.  Example::

    Two big black dogs did not see a red cat in the garden.
    Hundoj nigroj grandoj du la garda en una kata ruba ka ne vidin.

Usage::

    python scripts/make_toy_data.py [--out data/toy] [--seed 1]
                                    [--train 12000 --val 500 --test 500]

The output (``{train,val,test}.{src,tgt}``, UTF-8, one sentence per line) is
byte-identical for the same arguments.  The test split is drawn first, then
val, then train, and a source sentence never appears twice in the corpus.
Only the standard library is used.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path

# ---------------------------------------------------------------------------
# Lexicon
# ---------------------------------------------------------------------------

# English singular, English plural, Toyish stem, gender ("m" or "f").
NOUNS: list[tuple[str, str, str, str]] = [
    ("dog", "dogs", "hund", "m"),
    ("cat", "cats", "kat", "f"),
    ("bird", "birds", "pajar", "m"),
    ("horse", "horses", "kaval", "m"),
    ("cow", "cows", "vak", "f"),
    ("mouse", "mice", "mus", "f"),
    ("owl", "owls", "strig", "f"),
    ("elephant", "elephants", "elefant", "m"),
    ("child", "children", "infan", "m"),
    ("man", "men", "vir", "m"),
    ("woman", "women", "femin", "f"),
    ("girl", "girls", "pik", "f"),
    ("boy", "boys", "knab", "m"),
    ("teacher", "teachers", "skolist", "f"),
    ("doctor", "doctors", "medik", "m"),
    ("farmer", "farmers", "farm", "m"),
    ("house", "houses", "dom", "f"),
    ("tree", "trees", "arbor", "m"),
    ("river", "rivers", "flum", "m"),
    ("garden", "gardens", "gard", "f"),
    ("ball", "balls", "bal", "f"),
    ("book", "books", "libr", "m"),
    ("apple", "apples", "pom", "m"),
    ("egg", "eggs", "ov", "m"),
    ("box", "boxes", "kest", "f"),
    ("car", "cars", "aut", "m"),
    ("boat", "boats", "bark", "f"),
    ("table", "tables", "tabl", "f"),
    ("chair", "chairs", "sed", "m"),
    ("door", "doors", "pord", "f"),
    ("cake", "cakes", "kuk", "f"),
    ("key", "keys", "klav", "m"),
]

# English adjective, Toyish stem.
ADJECTIVES: list[tuple[str, str]] = [
    ("big", "grand"),
    ("small", "pet"),
    ("old", "antik"),
    ("new", "nov"),
    ("red", "rub"),
    ("blue", "blu"),
    ("green", "verd"),
    ("white", "blank"),
    ("black", "nigr"),
    ("yellow", "flav"),
    ("orange", "oranz"),
    ("happy", "felic"),
    ("sad", "trist"),
    ("angry", "koler"),
    ("quick", "rapid"),
    ("slow", "lent"),
    ("tall", "alt"),
    ("young", "jun"),
    ("heavy", "pez"),
    ("ugly", "fi"),
]

# English base, 3rd person singular present, past, Toyish stem.
TRANSITIVE_VERBS: list[tuple[str, str, str, str]] = [
    ("see", "sees", "saw", "vid"),
    ("chase", "chases", "chased", "cas"),
    ("like", "likes", "liked", "sat"),
    ("follow", "follows", "followed", "sekv"),
    ("find", "finds", "found", "trov"),
    ("eat", "eats", "ate", "mang"),
    ("watch", "watches", "watched", "rigard"),
    ("help", "helps", "helped", "help"),
    ("carry", "carries", "carried", "port"),
    ("push", "pushes", "pushed", "pus"),
    ("hold", "holds", "held", "ten"),
    ("want", "wants", "wanted", "vol"),
    ("bring", "brings", "brought", "brink"),
    ("draw", "draws", "drew", "pentr"),
    ("take", "takes", "took", "pren"),
]

INTRANSITIVE_VERBS: list[tuple[str, str, str, str]] = [
    ("sleep", "sleeps", "slept", "dorm"),
    ("run", "runs", "ran", "kur"),
    ("sing", "sings", "sang", "kant"),
    ("wait", "waits", "waited", "atend"),
    ("jump", "jumps", "jumped", "salt"),
    ("swim", "swims", "swam", "nag"),
    ("laugh", "laughs", "laughed", "rid"),
    ("dance", "dances", "danced", "danc"),
    ("cry", "cries", "cried", "plor"),
    ("fly", "flies", "flew", "flug"),
]

# English preposition, Toyish postposition.
PREPOSITIONS: list[tuple[str, str]] = [
    ("in", "en"),
    ("on", "sur"),
    ("near", "apud"),
    ("under", "sub"),
    ("behind", "post"),
    ("with", "kun"),
]

# English number word, Toyish number word (numbers do not inflect).
NUMBERS: list[tuple[str, str]] = [
    ("two", "du"),
    ("three", "tri"),
    ("four", "kvar"),
    ("five", "kvin"),
]

# Personal names are copied unchanged and always singular.
NAMES: list[str] = ["Anna", "Maria", "Lena", "Sofia", "Tom", "Paul", "Ivan", "Marko"]

NOUN_BY_WORD = {n[0]: n for n in NOUNS}
ADJ_BY_WORD = dict(ADJECTIVES)
VERB_BY_WORD = {v[0]: v for v in TRANSITIVE_VERBS + INTRANSITIVE_VERBS}
TRANSITIVE = {v[0] for v in TRANSITIVE_VERBS}
PREP_BY_WORD = dict(PREPOSITIONS)
NUMBER_BY_WORD = dict(NUMBERS)

# Toyish inflection tables.
NOUN_ENDING = {("m", "sg"): "o", ("m", "pl"): "oj", ("f", "sg"): "a", ("f", "pl"): "aj"}
ARTICLE = {
    ("the", "m", "sg"): "lo",
    ("the", "f", "sg"): "la",
    ("the", "m", "pl"): "loj",
    ("the", "f", "pl"): "laj",
    ("a", "m", "sg"): "un",
    ("a", "f", "sg"): "una",
    ("some", "m", "pl"): "kelkoj",
    ("some", "f", "pl"): "kelkaj",
}
VERB_ENDING = {("present", "sg"): "as", ("present", "pl"): "an", ("past", "sg"): "is", ("past", "pl"): "in"}
OBJECT_PARTICLE = "ka"
RELATIVE_WORD = ("that", "ki")
NEGATION = "ne"

MIN_WORDS = 3
MAX_WORDS = 15

# ---------------------------------------------------------------------------
# Abstract syntax
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class VP:
    """A verb phrase: verb, tense, negation and (for transitive verbs) an object."""

    verb: str  # English base form, e.g. "see"
    tense: str = "present"  # "present" or "past"
    negated: bool = False
    obj: NP | None = None


@dataclass(frozen=True)
class NP:
    """A noun phrase.

    ``det`` is "the", "a", "some", a number word ("two".."five"), or "name"
    (then ``noun`` is a personal name).  A number word implies plural.
    ``rel`` is an optional relative clause ("that" + verb phrase) whose verb
    agrees with this noun.
    """

    noun: str  # English singular noun, or a personal name
    det: str = "the"
    plural: bool = False
    adjs: tuple[str, ...] = ()
    rel: VP | None = None


@dataclass(frozen=True)
class Sentence:
    subj: NP
    vp: VP
    pp: tuple[str, NP] | None = None  # (English preposition, noun phrase)


def _number(np: NP) -> str:
    return "pl" if np.plural else "sg"


# ---------------------------------------------------------------------------
# Rendering: English source
# ---------------------------------------------------------------------------


def _a_or_an(next_word: str) -> str:
    return "an" if next_word[0] in "aeiou" else "a"


def np_source(np: NP) -> list[str]:
    if np.det == "name":
        return [np.noun]
    singular, plural, _stem, _gender = NOUN_BY_WORD[np.noun]
    head = [*np.adjs, plural if np.plural else singular]
    if np.det == "a":
        words = [_a_or_an(head[0]), *head]
    else:
        words = [np.det, *head]
    if np.rel is not None:
        words += [RELATIVE_WORD[0], *vp_source(np.rel, np.plural)]
    return words


def vp_source(vp: VP, plural_subject: bool) -> list[str]:
    base, third, past, _stem = VERB_BY_WORD[vp.verb]
    if vp.negated:
        aux = "did" if vp.tense == "past" else ("do" if plural_subject else "does")
        words = [aux, "not", base]
    elif vp.tense == "past":
        words = [past]
    else:
        words = [base if plural_subject else third]
    if vp.obj is not None:
        words += np_source(vp.obj)
    return words


def sentence_source_words(s: Sentence) -> list[str]:
    words = np_source(s.subj) + vp_source(s.vp, s.subj.plural)
    if s.pp is not None:
        words += [s.pp[0], *np_source(s.pp[1])]
    return words


def _finish(words: list[str]) -> str:
    text = " ".join(words) + "."
    return text[0].upper() + text[1:]


def render_source(s: Sentence) -> str:
    return _finish(sentence_source_words(s))


# ---------------------------------------------------------------------------
# Rendering: Toyish target (a pure function of the parse)
# ---------------------------------------------------------------------------


def np_target(np: NP) -> list[str]:
    if np.det == "name":
        return [np.noun]
    _singular, _plural, stem, gender = NOUN_BY_WORD[np.noun]
    num = _number(np)
    ending = NOUN_ENDING[gender, num]
    words = []
    if np.det in ("the", "a", "some"):
        words.append(ARTICLE[np.det, gender, num])
    words.append(stem + ending)
    words += [ADJ_BY_WORD[a] + ending for a in reversed(np.adjs)]
    if np.det in NUMBER_BY_WORD:
        words.append(NUMBER_BY_WORD[np.det])
    if np.rel is not None:
        words += [RELATIVE_WORD[1], *vp_target(np.rel, np.plural)]
    return words


def vp_target(vp: VP, plural_subject: bool) -> list[str]:
    words = []
    if vp.obj is not None:
        words += [*np_target(vp.obj), OBJECT_PARTICLE]
    if vp.negated:
        words.append(NEGATION)
    stem = VERB_BY_WORD[vp.verb][3]
    words.append(stem + VERB_ENDING[vp.tense, "pl" if plural_subject else "sg"])
    return words


def render_target(s: Sentence) -> str:
    words = np_target(s.subj)
    if s.pp is not None:
        words += [*np_target(s.pp[1]), PREP_BY_WORD[s.pp[0]]]
    words += vp_target(s.vp, s.subj.plural)
    return _finish(words)


# ---------------------------------------------------------------------------
# Random generation (all randomness flows through an explicit random.Random)
# ---------------------------------------------------------------------------


def _pick(rng: random.Random, weighted: list[tuple[object, float]]):
    items = [w[0] for w in weighted]
    weights = [w[1] for w in weighted]
    return rng.choices(items, weights=weights)[0]


def random_np(rng: random.Random, *, allow_name: bool, allow_rel: bool, max_adjs: int = 2) -> NP:
    if allow_name and rng.random() < 0.12:
        return NP(noun=rng.choice(NAMES), det="name")
    noun = rng.choice(NOUNS)[0]
    plural = rng.random() < 0.45
    if plural:
        det = _pick(rng, [("the", 0.45), ("some", 0.25), ("number", 0.30)])
        if det == "number":
            det = rng.choice(NUMBERS)[0]
    else:
        det = _pick(rng, [("the", 0.6), ("a", 0.4)])
    n_adjs = _pick(rng, [(0, 0.5), (1, 0.35), (2, 0.15)])
    n_adjs = min(n_adjs, max_adjs)
    adjs = tuple(rng.sample([a[0] for a in ADJECTIVES], n_adjs))
    rel = None
    if allow_rel and rng.random() < 0.1:
        rel = random_vp(rng, simple_object=True)
    return NP(noun=noun, det=det, plural=plural, adjs=adjs, rel=rel)


def random_vp(rng: random.Random, *, simple_object: bool = False) -> VP:
    transitive = rng.random() < 0.6
    verb = rng.choice(TRANSITIVE_VERBS if transitive else INTRANSITIVE_VERBS)[0]
    tense = "present" if rng.random() < 0.6 else "past"
    negated = rng.random() < 0.2
    obj = None
    if transitive:
        if simple_object:
            obj = random_np(rng, allow_name=True, allow_rel=False, max_adjs=0)
        else:
            obj = random_np(rng, allow_name=True, allow_rel=True)
    return VP(verb=verb, tense=tense, negated=negated, obj=obj)


def random_sentence(rng: random.Random) -> Sentence:
    """Draw sentences until one has MIN_WORDS..MAX_WORDS source words."""
    while True:
        subj = random_np(rng, allow_name=True, allow_rel=True)
        vp = random_vp(rng)
        pp = None
        if rng.random() < 0.3:
            prep = rng.choice(PREPOSITIONS)[0]
            pp = (prep, random_np(rng, allow_name=False, allow_rel=False, max_adjs=1))
        s = Sentence(subj=subj, vp=vp, pp=pp)
        if MIN_WORDS <= len(sentence_source_words(s)) <= MAX_WORDS:
            return s


def generate_splits(rng: random.Random, sizes: dict[str, int]) -> dict[str, list[tuple[str, str]]]:
    """Draw unique pairs split by split, in the order of ``sizes``."""
    seen: set[str] = set()
    splits: dict[str, list[tuple[str, str]]] = {}
    for name, size in sizes.items():
        pairs = []
        while len(pairs) < size:
            s = random_sentence(rng)
            src = render_source(s)
            if src in seen:
                continue
            seen.add(src)
            pairs.append((src, render_target(s)))
        splits[name] = pairs
    return splits


def write_corpus(out: Path, seed: int, train: int, val: int, test: int) -> None:
    rng = random.Random(seed)
    # Test first, then val, then train: the evaluation splits stay the same
    # when only the training size changes.
    splits = generate_splits(rng, {"test": test, "val": val, "train": train})
    out.mkdir(parents=True, exist_ok=True)
    for name in ("train", "val", "test"):
        pairs = splits[name]
        for side, idx in (("src", 0), ("tgt", 1)):
            text = "".join(p[idx] + "\n" for p in pairs)
            (out / f"{name}.{side}").write_bytes(text.encode("utf-8"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/toy"), help="output directory")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--train", type=int, default=12000, help="number of training pairs")
    parser.add_argument("--val", type=int, default=500, help="number of validation pairs")
    parser.add_argument("--test", type=int, default=500, help="number of test pairs")
    args = parser.parse_args(argv)
    for name in ("train", "val", "test"):
        if getattr(args, name) < 0:
            parser.error(f"--{name} must be >= 0")
    write_corpus(args.out, args.seed, args.train, args.val, args.test)
    print(f"wrote {args.train}/{args.val}/{args.test} train/val/test pairs to {args.out}")


if __name__ == "__main__":
    main()
