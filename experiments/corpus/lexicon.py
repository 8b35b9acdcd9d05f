"""The `builtin` corpus's words: nouns by kind (singular, plural), verbs by frame (base, 3sg, past, past
participle), adjectives, adverbs, prepositions, pronouns and function words."""

from __future__ import annotations

# Nouns are "singular plural"; verbs are "base third-person-singular past past-participle".


def _pairs(spec: str) -> list[tuple[str, ...]]:
    """Comma-separated entries, each a tuple of its space-separated forms."""
    return [tuple(item.split()) for item in spec.strip().split(",")]


ANIMATE = _pairs("""teacher teachers, doctor doctors, farmer farmers, child children, woman women, man men,
    girl girls, boy boys, dog dogs, cat cats, bird birds, horse horses, student students, driver drivers,
    friend friends, baker bakers, king kings, queen queens, artist artists, writer writers, nurse nurses,
    pilot pilots, singer singers, neighbor neighbors, toddler toddlers, hedgehog hedgehogs,
    zookeeper zookeepers, shopkeeper shopkeepers, plumber plumbers, giraffe giraffes, walrus walruses,
    raccoon raccoons, mountaineer mountaineers, firefighter firefighters""")
THINGS = _pairs("""book books, table tables, letter letters, car cars, window windows, door doors, box boxes,
    apple apples, chair chairs, bag bags, key keys, picture pictures, song songs, story stories, ball balls,
    cup cups, map maps, ship ships, tree trees, phone phones, bottle bottles, hat hats, coat coats,
    teapot teapots, cupcake cupcakes, pancake pancakes, paintbrush paintbrushes, raincoat raincoats,
    skateboard skateboards, wheelbarrow wheelbarrows, scarecrow scarecrows, xylophone xylophones,
    sunflower sunflowers""")
PLACES = _pairs("""park parks, garden gardens, kitchen kitchens, school schools, city cities, river rivers,
    forest forests, market markets, station stations, library libraries, village villages, room rooms,
    house houses, street streets, bookshelf bookshelves, trampoline trampolines""")
COMPOUNDS = _pairs("""coffee cup cups, school bus buses, flower shop shops, birthday cake cakes,
    kitchen table tables, train station stations, music box boxes, garden door doors""")
NAMES = "anna tom sarah peter lucy james maria david emma oliver".split()
ADJECTIVES = """big small old young happy tall red green quiet new little bright dark heavy strange hungry
    tired kind angry beautiful grumpy wobbly crunchy gloomy spotty freckled woolen""".split()
PREDICATIVE = "happy tired hungry angry quiet kind tall old young sad busy ready grumpy gloomy".split()
INTRANSITIVE = _pairs("""sleep sleeps slept slept, laugh laughs laughed laughed, arrive arrives arrived arrived,
    smile smiles smiled smiled, wait waits waited waited, run runs ran run, sing sings sang sung,
    work works worked worked, cry cries cried cried, fall falls fell fallen, leave leaves left left,
    swim swims swam swum, dance dances danced danced, stay stays stayed stayed, jump jumps jumped jumped""")
TRANSITIVE = _pairs("""see sees saw seen, find finds found found, like likes liked liked,
    watch watches watched watched, take takes took taken, hold holds held held, read reads read read,
    open opens opened opened, carry carries carried carried, follow follows followed followed,
    help helps helped helped, visit visits visited visited, paint paints painted painted,
    clean cleans cleaned cleaned, build builds built built, buy buys bought bought, need needs needed needed,
    remember remembers remembered remembered, love loves loved loved, break breaks broke broken,
    catch catches caught caught, write writes wrote written, bring brings brought brought,
    push pushes pushed pushed, wash washes washed washed, draw draws drew drawn""")
DITRANSITIVE = _pairs("""give gives gave given, show shows showed shown, send sends sent sent,
    offer offers offered offered, lend lends lent lent, throw throws threw thrown""")
CLAUSAL = _pairs("""say says said said, think thinks thought thought, know knows knew known,
    believe believes believed believed, notice notices noticed noticed, hear hears heard heard""")
CONTROL = _pairs("""want wants wanted wanted, try tries tried tried, hope hopes hoped hoped,
    decide decides decided decided, plan plans planned planned""")
MANNER = "quickly slowly quietly carefully happily again together loudly cheerfully".split()
PREVERBAL = "often never always sometimes".split()
FRONTED = "suddenly finally later sometimes meanwhile afterwards".split()
DEGREE = "very really quite".split()
VERB_PREPS = "in on near under behind with at into across beside from to through around".split()
NOUN_PREPS = "in on near under behind with from beside of".split()
SUBORDINATORS = "because when after before while although if".split()
CONJUNCTIONS = ["and"] * 4 + ["but", "or"]
MODALS = "will can might should could would".split()
NUMBERS = "two three four five ten".split()
SUBJECT_PRONOUNS = [("I", "1sg"), ("you", "2"), ("he", "3sg"), ("she", "3sg"), ("it", "3sg"), ("we", "pl"),
                    ("they", "pl")]
OBJECT_PRONOUNS = "me you him her it us them".split()
POSSESSIVES = "my your his her its our their".split()
