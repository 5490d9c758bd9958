"""Tests for sat_tf.cli.build_tag_table (the tag table's builder, sat-build-tag-table): the
WordNet walk on made-up synsets, a synset's word and its spellings."""

from sat_tf.cli import build_tag_table


class _Synset:
    def __init__(self, name, lemmas, parents=()):
        self._name, self._lemmas, self._parents = name, lemmas, list(parents)

    def name(self):
        return self._name

    def lemma_names(self):
        return self._lemmas

    def hypernyms(self):
        return self._parents

    def instance_hypernyms(self):
        return []


class _WordNet:
    def __init__(self, senses):
        self.senses = senses

    def synsets(self, word, pos):
        return self.senses.get(word, [])

    def morphy(self, word, pos):
        return None


def test_word_is_the_nearest_lemma_in_its_usual_sense():
    """tabby -> domestic cat -> cat -> animal: "cat"; the compound "sports car" gives
    "car"; "truck" is not taken from "truck crop" (its usual sense is the lorry), nor
    "animal" (too general)."""
    animal = _Synset("animal.n.01", ["animal"])
    cat = _Synset("cat.n.01", ["cat"], [animal])
    domestic = _Synset("domestic_cat.n.01", ["domestic_cat", "house_cat"], [cat])
    tabby = _Synset("tabby.n.01", ["tabby"], [domestic])
    lorry = _Synset("truck.n.01", ["truck"])
    produce = _Synset("truck.n.02", ["truck"], [_Synset("food.n.01", ["food"])])
    broccoli = _Synset("broccoli.n.01", ["broccoli"], [produce])
    sports_car = _Synset("sports_car.n.01", ["sports_car"])
    wordnet = _WordNet({"cat": [cat], "truck": [lorry], "animal": [animal], "car": []})
    words = {w: i for i, w in enumerate(["cat", "truck", "animal", "car", "food"])}
    word, how = build_tag_table.word_for(tabby, words, wordnet, max_depth=5)
    assert word == "cat" and how.startswith("tabby.n.01 > domestic_cat.n.01 > cat.n.01")
    assert build_tag_table.word_for(broccoli, words, wordnet, 5) == ("", "")
    wordnet.senses["car"] = [sports_car]
    assert build_tag_table.word_for(sports_car, words, wordnet, 5)[0] == "car"
    assert build_tag_table.word_for(tabby, words, wordnet, max_depth=1) == ("", "")


def test_most_used_word_and_its_spellings():
    """Of a synset's words the most frequent (lowest id) is the tag; its set adds the
    `ALSO` words and the plurals of both that the vocabulary holds."""
    cycle = _Synset("bicycle.n.01", ["bicycle", "bike"])
    wordnet = _WordNet({"bicycle": [cycle], "bike": [cycle]})
    plural = {"bikes": "bike", "bicycles": "bicycle", "cats": "cat"}
    wordnet.morphy = lambda word, pos: plural.get(word, word)
    words = {w: i for i, w in enumerate(["a", "bike", "cat", "bikes", "bicycle", "cats"])}
    assert build_tag_table.word_for(cycle, words, wordnet, 0)[0] == "bike"
    assert build_tag_table.spellings("bicycle", words, wordnet) == "bicycle|bike|bikes"
    assert build_tag_table.spellings("cat", words, wordnet) == "cat|cats"
