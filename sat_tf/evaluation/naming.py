"""Does a caption name what is in the photo: main-object recall and CHAIR.

Two questions asked of generated captions on COCO-format photos with instance boxes
(`coco_photos`), with the caption words mapped to COCO categories by the synonym table
the pointing metric uses (`coco_photos.SYNONYMS`, `category_mentions`):

- main-object recall: over the photos with at least one box, the share whose caption
  names the category of the photo's largest box (area in the photo's pixels, the whole
  photo; ties go to the category first in the annotations file);
- CHAIR (Rohrbach et al., 2018, "Object Hallucination in Image Captioning"), as its
  reference code counts: every mention of a category counts once (a caption saying
  "dog" twice has two mentions); CHAIR_i = mentions of a category the photo lacks / all
  mentions, CHAIR_s = captions with at least one such mention / all captions.

A category is present in a photo when it has a box there. Rohrbach et al. also count as
present the objects that the photo's human captions name (`reference_categories`); pass
those as `also_present` for their variant, which can only lower CHAIR.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence

import numpy as np

from sat_tf.data import vocab as vocab_lib
from sat_tf.evaluation.coco_photos import SYNONYMS, Photo, category_mentions


def main_category(photo: Photo) -> str | None:
    """The category of the photo's largest box (None for a photo without boxes)."""
    best, name = -1.0, None
    for category, boxes in photo.boxes.items():
        area = float(np.max((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])))
        if area > best:
            best, name = area, category
    return name


def reference_categories(
    references: Mapping[int, Sequence[str]], synonyms: dict = SYNONYMS
) -> dict[int, set[str]]:
    """{image_id: the categories its human captions name}, tokenized as the package
    tokenizes (`vocab.tokenize_py`)."""
    return {
        image_id: {
            mention.category
            for words in vocab_lib.tokenize_py(list(texts))
            for mention in category_mentions(words, synonyms)
        }
        for image_id, texts in references.items()
    }


def naming(
    photos: Sequence[Photo],
    captions: Sequence[Sequence[str]],
    synonyms: dict = SYNONYMS,
    also_present: Mapping[int, set[str]] | None = None,
) -> dict:
    """Main-object recall and CHAIR_i / CHAIR_s of one caption per photo.

    Args:
      photos: the captioned photos.
      captions: per photo the generated words.
      synonyms: word or phrase -> category name.
      also_present: {image_id: categories} counted as present beside the boxed ones.

    Returns:
      {"photos", "with_objects" (photos with a box), "main_named", "main_object_recall",
      "mentions", "absent_mentions", "chair_i", "captions_with_absent", "chair_s"
      (rates None where their denominator is 0), "main_by_category": {category:
      {"photos", "named"}} (most photos first), "absent_by_category": {category:
      mentions} (most first), "per_photo": [{"image_id", "main", "named", "absent"}]}.

    Raises:
      ValueError: if photos and captions differ in length.
    """
    if len(photos) != len(captions):
        raise ValueError(
            f"photos and captions must have one entry per photo, got {len(photos)} and "
            f"{len(captions)}"
        )
    also_present = also_present or {}
    main_counts = collections.defaultdict(lambda: {"photos": 0, "named": 0})
    absent_counts = collections.Counter()
    per_photo, mentions, absent_mentions, captions_with_absent = [], 0, 0, 0
    for photo, words in zip(photos, captions, strict=True):
        named = [m.category for m in category_mentions(list(words), synonyms)]
        present = set(photo.boxes) | set(also_present.get(photo.image_id, ()))
        absent = [c for c in named if c not in present]
        mentions += len(named)
        absent_mentions += len(absent)
        captions_with_absent += bool(absent)
        absent_counts.update(absent)
        main = main_category(photo)
        if main is not None:
            main_counts[main]["photos"] += 1
            main_counts[main]["named"] += main in named
        per_photo.append(
            {"image_id": photo.image_id, "main": main, "named": named, "absent": absent}
        )
    with_objects = sum(c["photos"] for c in main_counts.values())
    main_named = sum(c["named"] for c in main_counts.values())

    def rate(num, den):
        return num / den if den else None

    return {
        "photos": len(photos),
        "with_objects": with_objects,
        "main_named": main_named,
        "main_object_recall": rate(main_named, with_objects),
        "mentions": mentions,
        "absent_mentions": absent_mentions,
        "chair_i": rate(absent_mentions, mentions),
        "captions_with_absent": captions_with_absent,
        "chair_s": rate(captions_with_absent, len(photos)),
        "main_by_category": dict(
            sorted(main_counts.items(), key=lambda item: (-item[1]["photos"], item[0]))
        ),
        "absent_by_category": dict(sorted(absent_counts.items(), key=lambda i: (-i[1], i[0]))),
        "per_photo": per_photo,
    }


def format_naming(result: dict, top: int = 8, title: str = "Naming") -> str:
    """A few lines of a `naming` result: the rates with their counts, the main objects
    most often missed and the absent categories most often named."""

    def show(value):
        return "-" if value is None else f"{value:.3f}"

    missed = {
        name: c["photos"] - c["named"]
        for name, c in result["main_by_category"].items()
        if c["photos"] > c["named"]
    }
    missed = sorted(missed.items(), key=lambda item: (-item[1], item[0]))[:top]
    absent = list(result["absent_by_category"].items())[:top]
    return "\n".join(
        [
            f"{title}: main-object recall {show(result['main_object_recall'])} "
            f"({result['main_named']} of {result['with_objects']} photos), CHAIR_i "
            f"{show(result['chair_i'])} ({result['absent_mentions']} of "
            f"{result['mentions']} mentions name a category the photo lacks), CHAIR_s "
            f"{show(result['chair_s'])} ({result['captions_with_absent']} of "
            f"{result['photos']} captions)",
            "  main object missed: " + (", ".join(f"{n} {k}" for n, k in missed) or "none"),
            "  absent but named: " + (", ".join(f"{n} {k}" for n, k in absent) or "none"),
        ]
    )
