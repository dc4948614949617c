#!/usr/bin/env python3
"""Generate a small, deterministic corpus of short English-like stories for BERT pretraining.

The output is the ``data.format: text`` layout that ``tcli pretrain-bert`` reads: one sentence per
line, documents separated by exactly one blank line.  Each document is a short story with real
structure, so both pretraining tasks have something to learn:

* Theme: every story has one of eight themes (farm, river, school, park, forest, kitchen, market,
  sea) that fixes its places, animals, things and trades; no such word belongs to two themes, so the
  words of one story belong together.
* Cast: a hero (a name such as ``Anna``, a person noun such as ``the farmer``, or in 40% of the
  stories the narrator: ``I``, ``me``, ``my``), a companion (an animal or a second person), a
  thing, sometimes an extra animal; nouns may be plural
  (``two ducks``).  A noun is introduced with ``a``/``an``/a number/``some`` and afterwards
  referred to with ``the``, an owner's possessive (``Anna's dog``) or a pronoun that agrees in
  gender and number (``she``/``he``/``it``/``they``, ``her``/``him``/``it``/``them``).
* Order: introduction (who lives where, who has what), then 1-9 actions (finding, giving,
  chasing, going somewhere, feelings with ``because``/``so``), then an ending (``In the end, ...``).
  Consecutive sentences talk about the same cast, so next-sentence prediction can tell a real
  continuation from a sentence of another story.
* Grammar: one tense per story (past or present), subject-verb agreement (``the dog barks``,
  ``the dogs bark``, ``Anna and the dog go``, ``I am``, ``my dog and I go``), irregular verbs
  (``ate``, ``caught``), ``a``/``an``, ``did not``/``does not``/``do not``, and verbs that fit
  their objects (one eats an apple, reads a book, throws a ball; a dog barks, an owl hoots).

A few documents (about 3%) have a single sentence; the trainer uses those only as random B sides.

Usage::

    python scripts/make_bert_toy_data.py [--out data/bert_toy] [--seed 1]
                                         [--train-docs 2000] [--valid-docs 200]

The output (``train.txt`` and ``valid.txt``, UTF-8) is byte-identical for the same arguments: all
randomness flows through one explicit ``random.Random(seed)``; valid is drawn first, then train.
Only the standard library is used, and the word lists live in this file (not shared with
``make_toy_data.py``) so that the committed corpus never changes when the translation generator does.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path

# ----------------------------------------------------------------------------- lexicon

FEMALE_NAMES = ["Anna", "Maria", "Lena", "Sofia", "Nina", "Eva", "Clara", "Rosa"]
MALE_NAMES = ["Tom", "Paul", "Ivan", "Marko", "Leo", "Max", "Peter", "Omar"]

# singular -> (plural, pronoun or None: drawn per story)
PERSON_NOUNS = {
    "man": ("men", "he"),
    "woman": ("women", "she"),
    "girl": ("girls", "she"),
    "boy": ("boys", "he"),
    "child": ("children", None),
    "farmer": ("farmers", None),
    "fisher": ("fishers", None),
    "teacher": ("teachers", None),
    "pupil": ("pupils", None),
    "gardener": ("gardeners", None),
    "ranger": ("rangers", None),
    "cook": ("cooks", None),
    "seller": ("sellers", None),
    "sailor": ("sailors", None),
}
GENERIC_PEOPLE = ("man", "woman", "girl", "boy", "child")

# singular -> (plural, sound verb or None, ways of moving)
ANIMALS = {
    "cow": ("cows", "moo", ("walk",)),
    "horse": ("horses", "neigh", ("run", "jump")),
    "goat": ("goats", "bleat", ("jump", "climb")),
    "hen": ("hens", "cluck", ("run", "hop")),
    "pig": ("pigs", "grunt", ("run", "walk")),
    "duck": ("ducks", "quack", ("swim", "fly")),
    "frog": ("frogs", "croak", ("jump", "swim")),
    "fish": ("fish", None, ("swim",)),
    "swan": ("swans", "hiss", ("swim", "fly")),
    "hamster": ("hamsters", "squeak", ("run", "hide")),
    "parrot": ("parrots", "talk", ("fly", "hop")),
    "dog": ("dogs", "bark", ("run", "jump", "swim")),
    "squirrel": ("squirrels", None, ("climb", "hide", "jump")),
    "pigeon": ("pigeons", "coo", ("fly", "walk")),
    "owl": ("owls", "hoot", ("fly",)),
    "fox": ("foxes", "yelp", ("run", "hide")),
    "bear": ("bears", "growl", ("climb", "swim")),
    "wolf": ("wolves", "howl", ("run", "hide")),
    "cat": ("cats", "meow", ("run", "jump", "climb")),
    "mouse": ("mice", "squeak", ("run", "hide")),
    "donkey": ("donkeys", "bray", ("walk", "run")),
    "camel": ("camels", None, ("walk",)),
    "seal": ("seals", "bark", ("swim",)),
    "crab": ("crabs", None, ("crawl", "hide")),
    "gull": ("gulls", "scream", ("fly",)),
}

# singular -> (plural, verbs that fit this thing besides the general THING_VERBS)
THINGS = {
    "egg": ("eggs", ("eat", "cook")),
    "bucket": ("buckets", ("fill",)),
    "tractor": ("tractors", ("drive", "wash")),
    "sack": ("sacks", ("fill",)),
    "boat": ("boats", ("row", "paint")),
    "net": ("nets", ("throw", "pull")),
    "rod": ("rods", ("use",)),
    "book": ("books", ("read", "open")),
    "pencil": ("pencils", ("use",)),
    "bag": ("bags", ("open", "close")),
    "map": ("maps", ("read", "open")),
    "ball": ("balls", ("throw", "catch", "kick")),
    "kite": ("kites", ("fly",)),
    "flower": ("flowers", ("water", "smell")),
    "basket": ("baskets", ("fill",)),
    "lamp": ("lamps", ("light",)),
    "rope": ("ropes", ("pull", "tie")),
    "cake": ("cakes", ("eat", "bake")),
    "pie": ("pies", ("eat", "bake")),
    "cup": ("cups", ("fill", "wash")),
    "spoon": ("spoons", ("use", "wash")),
    "coin": ("coins", ("count",)),
    "apple": ("apples", ("eat", "wash")),
    "purse": ("purses", ("open", "close")),
    "hat": ("hats", ("wear",)),
    "shell": ("shells", ("wash",)),
    "ship": ("ships", ("paint", "sail")),
}
THING_VERBS = ("find", "carry", "hold", "drop", "lose", "take", "want", "bring")  # fit every thing

ANIMAL_ADJECTIVES = [
    "big",
    "small",
    "old",
    "young",
    "little",
    "quick",
    "sleepy",
    "clever",
    "funny",
    "brown",
    "white",
    "black",
    "grey",
]
THING_ADJECTIVES = ["big", "small", "old", "new", "red", "blue", "green", "white", "black", "yellow", "shiny", "heavy"]
FEELINGS = ["happy", "sad", "angry", "tired", "hungry", "afraid", "excited", "surprised"]


@dataclass(frozen=True)
class Theme:
    places: tuple[str, ...]
    animals: tuple[str, ...]
    things: tuple[str, ...]
    people: tuple[str, ...]  # besides GENERIC_PEOPLE


# Places, animals, things and trades belong to one theme each, so the words of a story belong together.
THEMES = {
    "farm": Theme(
        ("farm", "barn", "field", "meadow"),
        ("cow", "horse", "goat", "hen", "pig"),
        ("egg", "bucket", "tractor", "sack"),
        ("farmer",),
    ),
    "river": Theme(
        ("river", "lake", "bridge", "pond"), ("duck", "frog", "fish", "swan"), ("boat", "net", "rod"), ("fisher",)
    ),
    "school": Theme(
        ("school", "classroom", "library", "playground"),
        ("hamster", "parrot"),
        ("book", "pencil", "bag", "map"),
        ("teacher", "pupil"),
    ),
    "park": Theme(
        ("park", "garden", "fountain", "lawn"), ("dog", "squirrel", "pigeon"), ("ball", "kite", "flower"), ("gardener",)
    ),
    "forest": Theme(
        ("forest", "cave", "woods", "hill"), ("owl", "fox", "bear", "wolf"), ("basket", "lamp", "rope"), ("ranger",)
    ),
    "kitchen": Theme(
        ("kitchen", "house", "table", "oven"), ("cat", "mouse"), ("cake", "pie", "cup", "spoon"), ("cook",)
    ),
    "market": Theme(
        ("market", "shop", "street", "square"), ("donkey", "camel"), ("coin", "apple", "purse", "hat"), ("seller",)
    ),
    "sea": Theme(("beach", "harbour", "island", "sea"), ("seal", "crab", "gull"), ("shell", "ship"), ("sailor",)),
}
THEME_NAMES = list(THEMES)

# Prepositions that say where something happens at a place (default: in, near).
PLACE_PREPOSITIONS = {
    "farm": ("on", "near"),
    "hill": ("on", "near"),
    "bridge": ("on", "under", "near"),
    "beach": ("on", "near"),
    "table": ("under", "near"),
    "street": ("on", "in"),
    "river": ("near", "by"),
    "lake": ("near", "by"),
    "pond": ("near", "by"),
    "playground": ("on", "near"),
    "lawn": ("on", "near"),
    "fountain": ("near", "by"),
    "oven": ("near", "by"),
    "island": ("on", "near"),
    "sea": ("by", "near"),
    "field": ("in", "near"),
    "harbour": ("in", "near"),
}
FOOD = {"apple", "cake", "pie", "egg"}
FOOD_ADJECTIVES = ["big", "small", "fresh", "sweet", "little"]

# Irregular or spelling-changing forms: base -> (3rd person singular present, past).
IRREGULAR = {
    "be": ("is", "was"),
    "have": ("has", "had"),
    "go": ("goes", "went"),
    "do": ("does", "did"),
    "see": ("sees", "saw"),
    "find": ("finds", "found"),
    "eat": ("eats", "ate"),
    "hold": ("holds", "held"),
    "bring": ("brings", "brought"),
    "take": ("takes", "took"),
    "lose": ("loses", "lost"),
    "throw": ("throws", "threw"),
    "catch": ("catches", "caught"),
    "read": ("reads", "read"),
    "wear": ("wears", "wore"),
    "fly": ("flies", "flew"),
    "give": ("gives", "gave"),
    "run": ("runs", "ran"),
    "swim": ("swims", "swam"),
    "sing": ("sings", "sang"),
    "sleep": ("sleeps", "slept"),
    "feed": ("feeds", "fed"),
    "meet": ("meets", "met"),
    "hide": ("hides", "hid"),
    "drop": ("drops", "dropped"),
    "hop": ("hops", "hopped"),
    "hug": ("hugs", "hugged"),
    "light": ("lights", "lit"),
    "wake": ("wakes", "woke"),
    "leave": ("leaves", "left"),
    "sit": ("sits", "sat"),
    "make": ("makes", "made"),
    "come": ("comes", "came"),
    "keep": ("keeps", "kept"),
    "drive": ("drives", "drove"),
}

PRONOUNS = {
    "he": ("he", "him", "his"),
    "she": ("she", "her", "her"),
    "it": ("it", "it", "its"),
    "they": ("they", "them", "their"),
    "I": ("I", "me", "my"),
}


def verb_form(base: str, tense: str, plural: bool, first_person: bool = False) -> str:
    """`base` conjugated for its subject (3rd person singular/plural, or "I"): present or past."""
    if base == "be":
        if first_person:
            return "was" if tense == "past" else "am"
        return ("were" if plural else "was") if tense == "past" else ("are" if plural else "is")
    if tense == "present" and (plural or first_person):
        return base
    if base in IRREGULAR:
        third, past = IRREGULAR[base]
    else:
        if base.endswith(("s", "sh", "ch", "x")):
            third = base + "es"
        elif base.endswith("y") and base[-2] not in "aeiou":
            third = base[:-1] + "ies"
        else:
            third = base + "s"
        if base.endswith("e"):
            past = base + "d"
        elif base.endswith("y") and base[-2] not in "aeiou":
            past = base[:-1] + "ied"
        else:
            past = base + "ed"
    return third if tense == "present" else past


def negated(base: str, tense: str, plural: bool) -> list[str]:
    aux = "did" if tense == "past" else ("do" if plural else "does")
    return [aux, "not", base]


def a_or_an(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


# ----------------------------------------------------------------------------- cast


@dataclass
class Entity:
    kind: str  # "person" | "animal" | "thing"
    noun: str | None  # singular noun; None for a named person
    name: str | None = None
    plural: bool = False
    count: str | None = None  # "two", "three", "some" for plural first mentions
    adj: str | None = None
    pronoun: str = "it"
    owner: Entity | None = None
    mentioned: bool = False

    def head(self) -> str:
        if self.noun is None:
            raise ValueError("a named entity has no noun")
        if not self.plural:
            return self.noun
        table = {
            **{k: v[0] for k, v in PERSON_NOUNS.items()},
            **{k: v[0] for k, v in ANIMALS.items()},
            **{k: v[0] for k, v in THINGS.items()},
        }
        return table[self.noun]


def mention(e: Entity, rng: random.Random, role: str = "subject", pronoun_ok: bool = False) -> list[str]:
    """How the story refers to `e` now: a first mention is indefinite, later ones definite or a pronoun."""
    if e.pronoun == "I" or (pronoun_ok and e.mentioned and rng.random() < 0.55):
        subj, obj, _ = PRONOUNS[e.pronoun]
        return [subj if role == "subject" else obj]
    if e.name is not None:
        e.mentioned = True
        return [e.name]
    head = e.head()
    if not e.mentioned:
        e.mentioned = True
        words = [e.adj, head] if e.adj else [head]
        if e.plural:
            return [e.count or "some", *words]
        return [a_or_an(words[0]), *words]
    if e.owner is not None and not e.plural and rng.random() < 0.3:
        if role == "subject" and e.owner.name is not None:
            return [e.owner.name + "'s", head]  # Anna's dog
        return [PRONOUNS[e.owner.pronoun][2], head]  # her dog
    if e.adj and rng.random() < 0.3:
        return ["the", e.adj, head]
    return ["the", head]


def new_person(rng: random.Random, theme: Theme, used_names: set[str], named: bool) -> Entity:
    if named:
        female = rng.random() < 0.5
        name = rng.choice([n for n in (FEMALE_NAMES if female else MALE_NAMES) if n not in used_names])
        used_names.add(name)
        return Entity("person", None, name=name, pronoun="she" if female else "he", mentioned=True)
    noun = rng.choice(theme.people) if rng.random() < 0.6 else rng.choice(GENERIC_PEOPLE)
    pronoun = PERSON_NOUNS[noun][1] or rng.choice(["he", "she"])
    adj = rng.choice(["old", "young", "tall", "little", "clever", "funny"]) if rng.random() < 0.5 else None
    return Entity("person", noun, adj=adj, pronoun=pronoun)


def new_animal(rng: random.Random, theme: Theme, exclude: set[str]) -> Entity:
    noun = rng.choice([a for a in theme.animals if a not in exclude])
    plural = rng.random() < 0.2
    adj = rng.choice(ANIMAL_ADJECTIVES) if rng.random() < 0.6 else None
    count = rng.choice(["two", "three", "some"]) if plural else None
    return Entity("animal", noun, plural=plural, count=count, adj=adj, pronoun="they" if plural else "it")


def new_thing(rng: random.Random, theme: Theme) -> Entity:
    noun = rng.choice(theme.things)
    adj = rng.choice(FOOD_ADJECTIVES if noun in FOOD else THING_ADJECTIVES) if rng.random() < 0.6 else None
    return Entity("thing", noun, adj=adj, pronoun="it")


# ----------------------------------------------------------------------------- sentences


class Story:
    """One document: a theme, a tense, a cast and the place where the story is now."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.theme_name = rng.choice(THEME_NAMES)
        self.theme = THEMES[self.theme_name]
        self.tense = "past" if rng.random() < 0.5 else "present"
        self.place = rng.choice(self.theme.places)
        used: set[str] = set()
        if rng.random() < 0.4:  # told by the hero: I, me, my
            self.hero = Entity("person", None, pronoun="I", mentioned=True)
        else:
            self.hero = new_person(rng, self.theme, used, named=rng.random() < 0.55)
        if rng.random() < 0.8:
            self.friend = new_animal(rng, self.theme, set())
            self.friend.owner = self.hero
        else:
            self.friend = new_person(rng, self.theme, used, named=True)
        self.thing = new_thing(rng, self.theme)
        self.extra: Entity | None = None
        if rng.random() < 0.6:
            exclude = {self.friend.noun} if self.friend.noun else set()
            self.extra = new_animal(rng, self.theme, exclude)
        self.last_subject: Entity | None = None

    # helpers -------------------------------------------------------------

    def v(self, base: str, subject: Entity | bool) -> str:
        """`base` agreeing with `subject`: an entity, or True for a plural such as "Anna and Tom"."""
        if isinstance(subject, bool):
            return verb_form(base, self.tense, subject)
        return verb_form(base, self.tense, subject.plural, first_person=subject.pronoun == "I")

    def neg(self, base: str, subject: Entity) -> list[str]:
        return negated(base, self.tense, subject.plural or subject.pronoun == "I")

    def pair(self, a: Entity, b: Entity) -> list[str]:
        """A plural subject of two entities; "I" comes last (my dog and I)."""
        if a.pronoun == "I":
            return [*mention(b, self.rng, "subject"), "and", "I"]
        return [*mention(a, self.rng), "and", *mention(b, self.rng, "object")]

    def subj(self, e: Entity) -> list[str]:
        words = mention(e, self.rng, "subject", pronoun_ok=e is self.last_subject)
        self.last_subject = e
        return words

    def obj(self, e: Entity) -> list[str]:
        return mention(
            e, self.rng, "object", pronoun_ok=e is not self.last_subject and e.mentioned and self.rng.random() < 0.4
        )

    def animate(self) -> list[Entity]:
        cast = [self.hero, self.friend]
        if self.extra is not None:
            cast.append(self.extra)
        return cast

    def connective(self, p: float) -> list[str]:
        if self.rng.random() >= p:
            return []
        if self.tense == "past":
            return [self.rng.choice(["Then,", "After that,", "Later,", "Suddenly,", "Soon,", "Next,"])]
        return [self.rng.choice(["Then,", "After that,", "Sometimes,", "Every day,", "Often,", "Soon,"])]

    def at_place(self) -> list[str]:
        return [self.rng.choice(PLACE_PREPOSITIONS.get(self.place, ("in", "near"))), "the", self.place]

    # the parts of a story --------------------------------------------------

    def intro_hero(self) -> list[str]:
        h, r = self.hero, self.rng
        if h.noun is not None:  # a person noun is introduced: "There was a farmer ..."
            return ["there", self.v("be", False), *mention(h, r), *self.at_place()]
        choice = r.random()
        if choice < 0.5:
            return [*self.subj(h), self.v("live", h), "near", "the", self.place]
        if choice < 0.8:
            return [*self.subj(h), self.v("like", h), "the", self.place]
        return ["every", "morning,", *self.subj(h), self.v("go", h), "to", "the", self.place]

    def intro_friend(self) -> list[str]:
        f, h, r = self.friend, self.hero, self.rng
        if f.kind == "person":
            if r.random() < 0.5:
                return [*self.subj(h), self.v("have", h), "a", "friend", "called", f.name]
            self.last_subject = f
            owner = (h.name + "'s") if h.name else PRONOUNS[h.pronoun][2]
            return [f.name, self.v("be", False), owner, "best", "friend"]
        return [*self.subj(h), self.v("have", h), *mention(f, r, "object")]

    def action(self) -> list[str]:
        kinds = ["thing", "meet", "sound", "move", "feel", "give", "go", "negate"]
        weights = [4, 3, 2, 2, 2, 1.5, 1.5, 1]
        kind = self.rng.choices(kinds, weights=weights)[0]
        return self.connective(0.35) + getattr(self, "act_" + kind)()

    def pick_actor(self, kind: str | None = None) -> Entity:
        cast = [e for e in self.animate() if kind is None or e.kind == kind]
        weights = [3 if e is self.hero else 1.5 if e is self.friend else 1 for e in cast]
        return self.rng.choices(cast, weights=weights)[0]

    def act_thing(self) -> list[str]:
        t, r = self.thing, self.rng
        actor = self.pick_actor()
        if not t.mentioned:
            verb = r.choice(["find", "see"])
            return [*self.subj(actor), self.v(verb, actor), *mention(t, r, "object"), *self.at_place()]
        if actor.kind == "animal":
            options = ["find", "take", "want"] + (["eat"] if "eat" in THINGS[t.noun][1] else [])
            options += ["chase"] if t.noun in ("ball", "kite", "hat") else []
        else:
            options = list(THING_VERBS) + list(THINGS[t.noun][1]) * 2
        verb = r.choice(options)
        words = [*self.subj(actor), self.v(verb, actor), *self.obj(t)]
        if verb in ("carry", "bring", "take") and r.random() < 0.5:
            self.place = r.choice(self.theme.places)
            words += ["to", "the", self.place]
        elif verb in ("lose", "drop", "find", "hide") and r.random() < 0.4:
            words += self.at_place()
        return words

    def act_meet(self) -> list[str]:
        r = self.rng
        actor = self.pick_actor()
        other = r.choice([e for e in self.animate() if e is not actor])
        if actor.kind == "person":
            verbs = ["see", "call", "help", "watch", "follow", "find"]
            verbs += ["feed", "stroke", "hug", "wash"] if other.kind == "animal" else ["visit", "meet", "thank"]
        else:
            verbs = ["see", "follow", "watch", "find", "chase"]
            verbs += ["wake"] if other.kind == "person" else []
        verb = r.choice(verbs)
        words = [*self.subj(actor), self.v(verb, actor), *self.obj(other)]
        if r.random() < 0.5:
            words += self.at_place()
        return words

    def act_sound(self) -> list[str]:
        r = self.rng
        animals = [e for e in self.animate() if e.kind == "animal" and ANIMALS[e.noun][1]]
        if not animals or r.random() < 0.3:
            actor = self.pick_actor("person")
            verb = r.choice(["laugh", "sing", "smile", "shout", "cry"])
            words = [*self.subj(actor), self.v(verb, actor)]
            if r.random() < 0.3:
                words.append(r.choice(["loudly", "happily", "quietly"]))
            return words + (self.at_place() if r.random() < 0.6 else [])
        actor = r.choice(animals)
        words = [*self.subj(actor), self.v(ANIMALS[actor.noun][1], actor)]
        if r.random() < 0.5:
            target = r.choice([e for e in self.animate() if e is not actor])
            words += ["at", *self.obj(target)]
        return words

    def act_move(self) -> list[str]:
        r = self.rng
        actor = self.pick_actor()
        verb = r.choice(ANIMALS[actor.noun][2]) if actor.kind == "animal" else r.choice(["run", "walk", "jump", "sit"])
        words = [*self.subj(actor), self.v(verb, actor)]
        place = r.choice(self.theme.places)
        if verb in ("run", "walk", "fly", "swim", "hop"):
            self.place = place
            words += ["to", "the", place]
        elif r.random() < 0.6:
            words += [r.choice(PLACE_PREPOSITIONS.get(place, ("in", "near"))), "the", place]
        return words

    def act_feel(self) -> list[str]:
        r = self.rng
        actor = self.pick_actor()
        feeling = r.choice(FEELINGS)
        words = [*self.subj(actor), self.v("be", actor), feeling]
        t = self.thing
        if feeling == "hungry" and "eat" in THINGS[t.noun][1] and t.mentioned:
            pron = PRONOUNS[actor.pronoun][0]
            self.last_subject = actor
            return [*words[:-1], feeling + ",", "so", pron, self.v("eat", actor), *self.obj(t)]
        if r.random() < 0.5:
            other = r.choice([e for e in self.animate() if e is not actor])
            if t.mentioned:
                reason = r.choice(["find", "lose", "take", "want"])
                obj = self.obj(t)
            else:  # the reason concerns the actor: an object pronoun that agrees with it
                reason = r.choice(["see", "help", "call"])
                obj = [PRONOUNS[actor.pronoun][1]]
            return [*words, "because", *mention(other, r, "subject"), self.v(reason, other), *obj]
        return words + (self.at_place() if r.random() < 0.6 else [])

    def act_give(self) -> list[str]:
        r = self.rng
        people = [e for e in self.animate() if e.kind == "person"]
        actor = r.choice(people)
        other = r.choice([e for e in self.animate() if e is not actor])
        t = self.thing
        return [*self.subj(actor), self.v(r.choice(["give", "show"]), actor), *self.obj(t), "to", *self.obj(other)]

    def act_go(self) -> list[str]:
        r = self.rng
        self.place = r.choice(self.theme.places)
        a, b = self.hero, self.friend
        words = [*self.pair(a, b), self.v("go", True), "to", "the", self.place]
        self.last_subject = None
        return words

    def act_negate(self) -> list[str]:
        r = self.rng
        actor = self.pick_actor()
        if self.thing.mentioned and r.random() < 0.5:
            verb = r.choice(["want", "like", "find"])
            return [*self.subj(actor), *self.neg(verb, actor), *self.obj(self.thing)]
        other = r.choice([e for e in self.animate() if e is not actor])
        verb = r.choice(["see", "like", "follow"])
        return [*self.subj(actor), *self.neg(verb, actor), *self.obj(other)]

    def ending(self) -> list[str]:
        r = self.rng
        h, f = self.hero, self.friend
        choice = r.randrange(5)
        if choice == 0:
            self.last_subject = None
            return ["in", "the", "end,", *self.pair(h, f), self.v("go", True), "home"]
        if choice == 1:
            night = "that night," if self.tense == "past" else "at night,"
            return [*night.split(), *self.subj(h), self.v("sleep", h), "well", *self.at_place()]
        if choice == 2 and self.thing.mentioned:
            return ["in", "the", "end,", *self.subj(h), self.v("keep", h), *self.obj(self.thing)]
        if choice == 3:
            return ["after", "that,", *self.pair(h, f), self.v("be", True), "good", "friends"]
        return ["in", "the", "end,", "everyone", *self.at_place(), self.v("be", False), "happy"]

    def sentences(self, n: int) -> list[str]:
        parts = [self.intro_hero()]
        if n >= 2:
            parts.append(self.intro_friend())
        while len(parts) < n - 1:
            parts.append(self.action())
        if n >= 3:
            parts.append(self.ending())
        return [finish(p) for p in parts]


def finish(words: list[str]) -> str:
    text = " ".join(words) + "."
    return text[0].upper() + text[1:]


def make_document(rng: random.Random) -> list[str]:
    story = Story(rng)
    if rng.random() < 0.03:  # a one-sentence document: only ever a random B side
        return [finish(story.action())]
    return story.sentences(rng.randint(4, 12))


def make_documents(rng: random.Random, n: int) -> list[list[str]]:
    return [make_document(rng) for _ in range(n)]


def render(docs: list[list[str]]) -> str:
    """Sentences one per line, documents separated by one blank line, a final newline."""
    return "\n\n".join("\n".join(doc) for doc in docs) + "\n" if docs else ""


def write_corpus(out: Path, seed: int, train_docs: int, valid_docs: int) -> None:
    rng = random.Random(seed)
    valid = make_documents(rng, valid_docs)  # valid first: it stays put when only the train size changes
    train = make_documents(rng, train_docs)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.txt").write_bytes(render(train).encode("utf-8"))
    (out / "valid.txt").write_bytes(render(valid).encode("utf-8"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/bert_toy"), help="output directory")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--train-docs", type=int, default=2000, help="number of training documents")
    parser.add_argument("--valid-docs", type=int, default=200, help="number of held-out documents")
    args = parser.parse_args(argv)
    if args.train_docs < 2 or args.valid_docs < 2:
        parser.error("--train-docs and --valid-docs must be >= 2 (next sentence prediction needs two documents)")
    write_corpus(args.out, args.seed, args.train_docs, args.valid_docs)
    print(f"wrote {args.train_docs}/{args.valid_docs} train/valid documents to {args.out}")


if __name__ == "__main__":
    main()
