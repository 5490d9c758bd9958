"""COCO-format photos with instance boxes, and the caption words that name their objects.

Reads an `instances_*.json` file (and its `captions_*.json` sibling) into `Photo`s whose
boxes are grouped by category name, and maps caption words to COCO's 80 categories
(`SYNONYMS`, `category_mentions`). Both the pointing metric (`coco_grounding`) and the
naming metric (`naming`) read photos and words through this module, so the two count
the same words as the same objects.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import json
import os
from collections.abc import Sequence

import numpy as np

from sat_tf.data import image_io

# The 80 category names of COCO 2014/2017 instance annotations, in category-id order.
COCO_CATEGORIES = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat",
    "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack",
    "umbrella", "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball",
    "kite", "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket",
    "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair",
    "couch", "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse",
    "remote", "keyboard", "cell phone", "microwave", "oven", "toaster", "sink",
    "refrigerator", "book", "clock", "vase", "scissors", "teddy bear", "hair drier",
    "toothbrush",
)  # fmt: skip

SYNONYMS = {
    # person
    "person": "person", "persons": "person", "people": "person",
    "man": "person", "men": "person", "woman": "person", "women": "person",
    "boy": "person", "boys": "person", "girl": "person", "girls": "person",
    "child": "person", "children": "person", "kid": "person", "kids": "person",
    "baby": "person", "babies": "person", "toddler": "person", "toddlers": "person",
    "guy": "person", "guys": "person", "lady": "person", "ladies": "person",
    "gentleman": "person", "gentlemen": "person", "adult": "person", "adults": "person",
    "teenager": "person", "teenagers": "person", "teen": "person", "teens": "person",
    "player": "person", "players": "person", "skier": "person", "skiers": "person",
    "surfer": "person", "surfers": "person", "snowboarder": "person",
    "snowboarders": "person", "skateboarder": "person", "skateboarders": "person",
    "biker": "person", "bikers": "person", "cyclist": "person", "cyclists": "person",
    "rider": "person", "riders": "person", "runner": "person", "runners": "person",
    "swimmer": "person", "swimmers": "person", "climber": "person", "climbers": "person",
    "dancer": "person", "dancers": "person", "athlete": "person", "athletes": "person",
    "batter": "person", "catcher": "person", "umpire": "person", "tourist": "person",
    "tourists": "person", "pedestrian": "person", "pedestrians": "person",
    "worker": "person", "workers": "person", "soldier": "person", "soldiers": "person",
    "crowd": "person", "someone": "person",
    # vehicles
    "bicycle": "bicycle", "bicycles": "bicycle", "bike": "bicycle", "bikes": "bicycle",
    "car": "car", "cars": "car", "taxi": "car", "taxis": "car",
    "motorcycle": "motorcycle", "motorcycles": "motorcycle", "motorbike": "motorcycle",
    "motorbikes": "motorcycle", "dirt bike": "motorcycle", "dirt bikes": "motorcycle",
    "airplane": "airplane", "airplanes": "airplane", "plane": "airplane",
    "planes": "airplane", "aeroplane": "airplane", "aeroplanes": "airplane",
    "jet": "airplane", "jets": "airplane", "airliner": "airplane", "aircraft": "airplane",
    "bus": "bus", "buses": "bus", "busses": "bus",
    "train": "train", "trains": "train", "locomotive": "train",
    "truck": "truck", "trucks": "truck",
    "boat": "boat", "boats": "boat", "ship": "boat", "ships": "boat", "sailboat": "boat",
    "sailboats": "boat", "kayak": "boat", "kayaks": "boat", "canoe": "boat",
    "canoes": "boat", "yacht": "boat", "yachts": "boat",
    # outdoor
    "traffic light": "traffic light", "traffic lights": "traffic light",
    "stoplight": "traffic light", "stoplights": "traffic light",
    "fire hydrant": "fire hydrant", "fire hydrants": "fire hydrant",
    "hydrant": "fire hydrant", "hydrants": "fire hydrant",
    "stop sign": "stop sign", "stop signs": "stop sign",
    "parking meter": "parking meter", "parking meters": "parking meter",
    "bench": "bench", "benches": "bench",
    # animals
    "bird": "bird", "birds": "bird", "seagull": "bird", "seagulls": "bird", "gull": "bird",
    "gulls": "bird", "duck": "bird", "ducks": "bird", "goose": "bird", "geese": "bird",
    "pigeon": "bird", "pigeons": "bird", "parrot": "bird", "parrots": "bird",
    "swan": "bird", "swans": "bird",
    "cat": "cat", "cats": "cat", "kitten": "cat", "kittens": "cat", "kitty": "cat",
    "dog": "dog", "dogs": "dog", "puppy": "dog", "puppies": "dog", "pup": "dog",
    "pups": "dog",
    "horse": "horse", "horses": "horse", "pony": "horse", "ponies": "horse",
    "sheep": "sheep", "lamb": "sheep", "lambs": "sheep",
    "cow": "cow", "cows": "cow", "cattle": "cow", "calf": "cow", "calves": "cow",
    "bull": "cow", "bulls": "cow",
    "elephant": "elephant", "elephants": "elephant", "bear": "bear", "bears": "bear",
    "zebra": "zebra", "zebras": "zebra", "giraffe": "giraffe", "giraffes": "giraffe",
    # accessories
    "backpack": "backpack", "backpacks": "backpack",
    "umbrella": "umbrella", "umbrellas": "umbrella",
    "handbag": "handbag", "handbags": "handbag", "purse": "handbag", "purses": "handbag",
    "tie": "tie", "ties": "tie", "necktie": "tie", "neckties": "tie",
    "suitcase": "suitcase", "suitcases": "suitcase", "luggage": "suitcase",
    # sports
    "frisbee": "frisbee", "frisbees": "frisbee", "skis": "skis", "ski": "skis",
    "snowboard": "snowboard", "snowboards": "snowboard",
    "sports ball": "sports ball", "ball": "sports ball", "balls": "sports ball",
    "soccer ball": "sports ball", "tennis ball": "sports ball",
    "kite": "kite", "kites": "kite",
    "baseball bat": "baseball bat", "baseball bats": "baseball bat",
    "bat": "baseball bat", "bats": "baseball bat",
    "baseball glove": "baseball glove", "baseball gloves": "baseball glove",
    "mitt": "baseball glove", "mitts": "baseball glove",
    "skateboard": "skateboard", "skateboards": "skateboard",
    "surfboard": "surfboard", "surfboards": "surfboard",
    "tennis racket": "tennis racket", "tennis rackets": "tennis racket",
    "racket": "tennis racket", "rackets": "tennis racket", "racquet": "tennis racket",
    "racquets": "tennis racket",
    # kitchen
    "bottle": "bottle", "bottles": "bottle",
    "wine glass": "wine glass", "wine glasses": "wine glass",
    "cup": "cup", "cups": "cup", "mug": "cup", "mugs": "cup",
    "fork": "fork", "forks": "fork", "knife": "knife", "knives": "knife",
    "spoon": "spoon", "spoons": "spoon", "bowl": "bowl", "bowls": "bowl",
    # food
    "banana": "banana", "bananas": "banana", "apple": "apple", "apples": "apple",
    "sandwich": "sandwich", "sandwiches": "sandwich", "oranges": "orange",
    "broccoli": "broccoli", "carrot": "carrot", "carrots": "carrot",
    "hot dog": "hot dog", "hot dogs": "hot dog", "hotdog": "hot dog", "hotdogs": "hot dog",
    "pizza": "pizza", "pizzas": "pizza", "donut": "donut", "donuts": "donut",
    "doughnut": "donut", "doughnuts": "donut", "cake": "cake", "cakes": "cake",
    # furniture
    "chair": "chair", "chairs": "chair", "couch": "couch", "couches": "couch",
    "sofa": "couch", "sofas": "couch",
    "potted plant": "potted plant", "potted plants": "potted plant",
    "bed": "bed", "beds": "bed",
    "dining table": "dining table", "dining tables": "dining table",
    "table": "dining table", "tables": "dining table",
    "toilet": "toilet", "toilets": "toilet",
    # electronics
    "tv": "tv", "tvs": "tv", "television": "tv", "televisions": "tv",
    "laptop": "laptop", "laptops": "laptop", "mouse": "mouse",
    "remote": "remote", "remotes": "remote", "keyboard": "keyboard", "keyboards": "keyboard",
    "cell phone": "cell phone", "cell phones": "cell phone", "cellphone": "cell phone",
    "cellphones": "cell phone", "phone": "cell phone", "phones": "cell phone",
    # appliances
    "microwave": "microwave", "microwaves": "microwave", "oven": "oven", "ovens": "oven",
    "toaster": "toaster", "toasters": "toaster", "sink": "sink", "sinks": "sink",
    "refrigerator": "refrigerator", "refrigerators": "refrigerator",
    "fridge": "refrigerator", "fridges": "refrigerator",
    # indoor
    "book": "book", "books": "book", "clock": "clock", "clocks": "clock",
    "vase": "vase", "vases": "vase", "scissors": "scissors",
    "teddy bear": "teddy bear", "teddy bears": "teddy bear", "teddy": "teddy bear",
    "hair drier": "hair drier", "hair driers": "hair drier", "hair dryer": "hair drier",
    "hair dryers": "hair drier", "toothbrush": "toothbrush", "toothbrushes": "toothbrush",
}  # fmt: skip
"""Caption words (and two-word phrases) -> COCO category names.

Chosen by hand, not from data: every category's name and plural, then the nouns that
captions use for it where the noun names that kind of object in nearly every use (man,
woman, child, skier, player -> person; puppy -> dog; bike -> bicycle; dirt bike ->
motorcycle; table -> dining table; sofa -> couch; ball -> sports ball). Words that often
mean something else are left out: "orange" (a colour far more often than the fruit; its
plural is kept), "glass" (windows, glasses), "light", "plant", "glove", "group", "team",
"couple" (a couple of dogs). A two-word phrase is matched before its words alone ("hot
dog" is a hot dog, not a dog; "teddy bear" not a bear) and is scored at its last word.
"""

# A phrase is scored at its last word; its length in words is 1 or 2.
_PHRASE_WORDS = 2


@dataclasses.dataclass(frozen=True)
class Photo:
    """One annotated photo.

    Attributes:
      image_id: the `images[].id` of the annotations file.
      path: the photo's file.
      width, height: of the photo, in pixels, as the annotations give them.
      boxes: {category name: float64 (n, 4) [x0, y0, x1, y1] in pixels of the photo}.
    """

    image_id: int
    path: str
    width: int
    height: int
    boxes: dict


@dataclasses.dataclass(frozen=True)
class Mention:
    """A caption word or phrase that names a COCO category.

    Attributes:
      index: position of the scored word (a phrase's last word) in the caption.
      text: the word or phrase as written.
      category: the COCO category name it maps to.
    """

    index: int
    text: str
    category: str


def category_mentions(words: Sequence[str], synonyms: dict = SYNONYMS) -> list[Mention]:
    """The words of a caption that name a category, two-word phrases first.

    Args:
      words: the caption as a list of words (lowercase, as the package tokenizes).
      synonyms: word or phrase -> category name.

    Returns:
      the mentions in caption order.
    """
    words = [str(w) for w in words]
    mentions, i = [], 0
    while i < len(words):
        for n in range(_PHRASE_WORDS, 0, -1):
            text = " ".join(words[i : i + n])
            if i + n <= len(words) and text in synonyms:
                mentions.append(Mention(i + n - 1, text, synonyms[text]))
                i += n
                break
        else:
            i += 1
    return mentions


def _load_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"annotations file {path!r} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"annotations file {path!r} cannot be read as JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"annotations file {path!r} holds a {type(data).__name__}, not an object")
    return data


def _entries(data: dict, key: str, fields: Sequence[str], path: str) -> list[dict]:
    """`data[key]`, checked to be a list of objects that each have `fields`."""
    entries = data.get(key)
    if not isinstance(entries, list):
        raise ValueError(f"annotations file {path!r} has no list {key!r}")
    for i, entry in enumerate(entries):
        missing = [f for f in fields if not isinstance(entry, dict) or f not in entry]
        if missing:
            raise ValueError(f"annotations file {path!r}: {key}[{i}] lacks {', '.join(missing)}")
    return entries


def _box(bbox, where: str) -> list[float]:
    """[x, y, w, h] -> [x0, y0, x1, y1], or a ValueError naming `where`."""
    ok = isinstance(bbox, list) and len(bbox) == 4
    ok = ok and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox)
    if not ok or not np.all(np.isfinite(bbox)) or bbox[2] < 0 or bbox[3] < 0:
        raise ValueError(f"{where}: bbox {bbox!r} is not [x, y, width, height] with sizes >= 0")
    x, y, w, h = map(float, bbox)
    return [x, y, x + w, y + h]


def read_instances(annotations: str, image_dir: str) -> list[Photo]:
    """Reads a COCO-format instances file and checks that its photos exist.

    Every annotation counts, crowd regions (`iscrowd` 1) included: a crowd box holds
    people too.

    Args:
      annotations: an `instances_*.json` file (keys `images`, `annotations`,
        `categories`; bbox [x, y, width, height] in pixels of the photo).
      image_dir: the folder holding the photos' `file_name`s.

    Returns:
      the photos in the file's order, with their boxes by category name.

    Raises:
      ValueError: naming the file (and entry) when it is missing, not JSON, lacks a key,
        has a malformed box or refers to an unknown photo or category; naming the photos
        that are missing from `image_dir` or that an EXIF orientation turns (the encoder
        would see them turned against their boxes).
    """
    data = _load_json(annotations)
    images = _entries(data, "images", ("id", "file_name", "width", "height"), annotations)
    anns = _entries(data, "annotations", ("image_id", "category_id", "bbox"), annotations)
    categories = _entries(data, "categories", ("id", "name"), annotations)
    for i, im in enumerate(images):
        values = (im["id"], im["width"], im["height"])
        if (
            not all(isinstance(v, int) and not isinstance(v, bool) for v in values)
            or min(values[1:]) < 1
        ):
            raise ValueError(
                f"annotations file {annotations!r}: images[{i}] has id {im['id']!r}, width "
                f"{im['width']!r} and height {im['height']!r}; all must be integers, the "
                "sizes positive"
            )
    names = {c["id"]: str(c["name"]) for c in categories if isinstance(c["id"], int)}
    boxes = {im["id"]: collections.defaultdict(list) for im in images}
    for i, ann in enumerate(anns):
        where = f"annotations file {annotations!r}: annotations[{i}]"
        image_id, category_id = ann["image_id"], ann["category_id"]
        if not isinstance(image_id, int) or image_id not in boxes:
            raise ValueError(f"{where} refers to image_id {image_id!r}, not in images")
        if not isinstance(category_id, int) or category_id not in names:
            raise ValueError(f"{where} refers to category_id {category_id!r}, not in categories")
        boxes[image_id][names[category_id]].append(_box(ann["bbox"], where))
    photos, missing = [], []
    for im in images:
        path = os.path.join(image_dir, str(im["file_name"]))
        if not os.path.isfile(path):
            missing.append(path)
        found = {name: np.asarray(b, np.float64) for name, b in boxes[im["id"]].items()}
        photos.append(Photo(im["id"], path, im["width"], im["height"], found))
    if missing:
        listed = "\n  ".join(missing[:10])
        raise ValueError(
            f"{len(missing)} photo(s) of {annotations!r} are missing from {image_dir!r}:"
            f"\n  {listed}"
        )
    turned = [p.path for p in photos if _orientation(p.path) != 1]
    if turned:
        raise ValueError(
            f"{len(turned)} photo(s) of {annotations!r} carry an EXIF orientation that the "
            "encoder turns them by, while the boxes are in the stored frame; turn the files "
            f"upright and their boxes with them: {', '.join(turned[:10])}"
        )
    return photos


def _orientation(path: str) -> int:
    """The EXIF orientation that `image_io.decode_upright` applies to a file (1: none)."""
    with open(path, "rb") as f:
        return int(image_io.exif_orientation(f.read()))


def load_coco_dir(coco_dir: str) -> list[Photo]:
    """`read_instances` of a COCO folder laid out as COCO ships it.

    `annotations/instances_<name>.json` (exactly one) with its photos in `<name>/`
    (e.g. `instances_train2017.json` and `train2017/`).

    Raises:
      ValueError: naming the folder when it, the annotations file or the photo folder
        is missing, or when it holds several annotations files.
    """
    name, instances = _split_name(coco_dir)
    image_dir = os.path.join(coco_dir, name)
    if not os.path.isdir(image_dir):
        raise ValueError(f"COCO folder {coco_dir!r} has {instances} but no photo folder {name}/")
    return read_instances(instances, image_dir)


def _split_name(coco_dir: str) -> tuple[str, str]:
    """(<name>, the path of its one annotations/instances_<name>.json)."""
    if not os.path.isdir(coco_dir):
        raise ValueError(f"COCO folder {coco_dir!r} does not exist")
    found = sorted(glob.glob(os.path.join(coco_dir, "annotations", "instances_*.json")))
    if len(found) != 1:
        raise ValueError(
            f"COCO folder {coco_dir!r} must hold one annotations/instances_*.json, found "
            f"{len(found)}: {[os.path.basename(f) for f in found]}"
        )
    return os.path.basename(found[0])[len("instances_") : -len(".json")], found[0]


def read_reference_captions(coco_dir: str, photos: Sequence[Photo]) -> dict[int, list[str]]:
    """The human captions of `photos` from `annotations/captions_<name>.json` beside the
    folder's `instances_<name>.json` (COCO's caption format).

    Returns:
      {image_id: its captions, in file order} for the photos that have any.

    Raises:
      ValueError: naming the file when it is missing, is no COCO captions file, or
        gives none of the photos a caption.
    """
    name = _split_name(coco_dir)[0]
    path = os.path.join(coco_dir, "annotations", f"captions_{name}.json")
    if not os.path.isfile(path):
        raise ValueError(
            f"COCO folder {coco_dir!r} has no annotations/captions_{name}.json: grounding "
            "on the reference captions needs the photos' captions"
        )
    entries = _entries(_load_json(path), "annotations", ("image_id", "caption"), path)
    wanted = {photo.image_id for photo in photos}
    captions = collections.defaultdict(list)
    for i, entry in enumerate(entries):
        if not isinstance(entry["caption"], str):
            raise ValueError(f"annotations file {path!r}: annotations[{i}] caption is no string")
        if entry["image_id"] in wanted:
            captions[entry["image_id"]].append(entry["caption"])
    if not captions:
        raise ValueError(
            f"annotations file {path!r} gives none of the {len(wanted)} photos a caption"
        )
    return dict(captions)
