"""Writes corpus.txt, the text the demo's n-gram models learn from.

The text is synthetic: sentences drawn from a small grammar whose word lists and templates were
written for this project, so it carries no third party's copyright (it is released with the
project under its licence; nothing in it is copied from a book). A fixed seed makes the file
reproducible:

    python specops/demo/make_corpus.py
"""

import random
from pathlib import Path

SUBJECTS = [
    "the miller", "the old sailor", "a young clerk", "the baker", "my neighbour", "the doctor",
    "a tired horse", "the captain", "the widow", "her brother", "the stranger", "a quiet child",
    "the farmer", "the grey cat", "his mother", "the schoolmaster", "a travelling tinker",
]
VERBS = [
    "walked", "looked", "waited", "listened", "spoke", "laughed", "worked", "rested", "sang",
    "wandered", "turned", "hurried", "smiled", "watched", "paused", "knocked", "whistled",
]
PLACES = [
    "by the river", "near the mill", "on the hill", "at the gate", "in the garden",
    "under the old oak", "along the road", "beside the fire", "in the market", "at the harbour",
    "behind the church", "across the bridge", "in the kitchen", "on the stair", "by the window",
]
TIMES = [
    "at dawn", "in the evening", "before supper", "after the rain", "all morning", "at noon",
    "late at night", "on sunday", "in winter", "when the bells rang", "as the sun went down",
]
OBJECTS = [
    "a letter", "the bread", "a lantern", "the key", "an apple", "the coat", "a basket of eggs",
    "the map", "a small box", "the newspaper", "a cup of tea", "the violin", "a pair of boots",
]
ACTIONS = ["carried", "found", "lost", "mended", "opened", "sold", "bought", "hid", "gave away"]
ADJECTIVES = ["cold", "bright", "quiet", "long", "strange", "happy", "grey", "warm", "windy"]
SAYINGS = [
    "we shall see", "it will rain tomorrow", "the road is long", "nobody knows",
    "the kettle is boiling", "supper is ready", "the ship is late", "i have seen this before",
]


def sentence(rng: random.Random) -> str:
    pick = rng.choice
    kind = rng.randrange(6)
    if kind == 0:
        s = f"{pick(SUBJECTS)} {pick(VERBS)} {pick(PLACES)} {pick(TIMES)}"
    elif kind == 1:
        s = f"{pick(SUBJECTS)} {pick(ACTIONS)} {pick(OBJECTS)} {pick(PLACES)}"
    elif kind == 2:
        s = f"it was a {pick(ADJECTIVES)} day, and {pick(SUBJECTS)} {pick(VERBS)} {pick(PLACES)}"
    elif kind == 3:
        s = f"\"{pick(SAYINGS)},\" said {pick(SUBJECTS)}"
    elif kind == 4:
        s = (f"{pick(TIMES)} {pick(SUBJECTS)} {pick(ACTIONS)} {pick(OBJECTS)}, "
             f"then {pick(VERBS)} {pick(PLACES)}")
    else:
        s = f"the {pick(ADJECTIVES)} wind {pick(VERBS)} {pick(PLACES)} {pick(TIMES)}"
    first = 1 if s[0] == '"' else 0  # capitalise the first letter, also inside a quote
    return s[:first] + s[first].upper() + s[first + 1 :] + "."


def corpus(num_paragraphs: int = 200, seed: int = 1859) -> str:
    rng = random.Random(seed)
    paragraphs = [
        " ".join(sentence(rng) for _ in range(rng.randint(2, 6))) for _ in range(num_paragraphs)
    ]
    return "\n\n".join(paragraphs) + "\n"


if __name__ == "__main__":
    path = Path(__file__).with_name("corpus.txt")
    path.write_text(corpus())
    print(f"wrote {path} ({path.stat().st_size} bytes)")
