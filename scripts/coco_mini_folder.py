"""Lays out the 160 COCO photos of `../shared/data/coco-mini-train` and
`../shared/data/coco-mini-val-extra` as a user's own folder: the worked example of
README's "Train on your own photos".

  python scripts/coco_mini_folder.py --out=data/coco_mini

writes, with the photos linked (not copied):

  <out>/folder/train/metadata.jsonl        {"file_name": ..., "captions": [...]} a line
  <out>/folder/validation/metadata.jsonl
  <out>/folder/test/metadata.jsonl         the held-out photos
  <out>/heldout/train2017/*.jpg            the held-out photos with their boxes, a COCO
  <out>/heldout/annotations/*.json         folder for `sat-grounding --coco_dir` (naming)

The held-out photos are every second photo of coco-mini-train by image id (they have
boxes, so naming can be measured on them), 40 of 80; of the other 120, every tenth by
image id goes to validation (12), the rest to training (108).
"""

import argparse
import json
import os

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _photos(root, image_folder, split):
    """[(image id, path, [captions])] of a COCO folder, by image id."""
    data = _read(os.path.join(root, "annotations", f"captions_{split}.json"))
    captions = {}
    for a in data["annotations"]:
        captions.setdefault(a["image_id"], []).append(a["caption"].strip())
    return sorted(
        (i["id"], os.path.join(root, image_folder, i["file_name"]), captions[i["id"]])
        for i in data["images"]
    )


def _link(path, folder):
    os.makedirs(folder, exist_ok=True)
    target = os.path.join(folder, os.path.basename(path))
    if not os.path.lexists(target):
        os.symlink(os.path.abspath(path), target)
    return os.path.basename(path)


def _write_split(out, split, photos):
    folder = os.path.join(out, "folder", split)
    lines = [
        json.dumps({"file_name": _link(path, folder), "captions": captions})
        for _, path, captions in photos
    ]
    with open(os.path.join(folder, "metadata.jsonl"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def _write_heldout(out, train_root, photos):
    """The held-out photos as a COCO folder: their images, boxes and captions."""
    ids = {image_id for image_id, _, _ in photos}
    folder = os.path.join(out, "heldout")
    for _, path, _ in photos:
        _link(path, os.path.join(folder, "train2017"))
    os.makedirs(os.path.join(folder, "annotations"), exist_ok=True)
    for kind in ("captions", "instances"):
        data = _read(os.path.join(train_root, "annotations", f"{kind}_train2017.json"))
        data["images"] = [i for i in data["images"] if i["id"] in ids]
        data["annotations"] = [a for a in data["annotations"] if a["image_id"] in ids]
        path = os.path.join(folder, "annotations", f"{kind}_train2017.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="Folder to write (made if absent).")
    parser.add_argument("--shared", default=SHARED, help="The folder holding coco-mini-*.")
    args = parser.parse_args()
    train_root = os.path.join(args.shared, "coco-mini-train")
    boxed = _photos(train_root, "train2017", "train2017")
    extra = _photos(os.path.join(args.shared, "coco-mini-val-extra"), "val2017", "val2017")
    heldout, rest = boxed[1::2], sorted(boxed[::2] + extra)
    _write_split(args.out, "train", [p for i, p in enumerate(rest) if i % 10 != 9])
    _write_split(args.out, "validation", rest[9::10])
    _write_split(args.out, "test", heldout)
    _write_heldout(args.out, train_root, heldout)
    print(
        f"{args.out}/folder: {len(rest) - len(rest[9::10])} training, {len(rest[9::10])} "
        f"validation and {len(heldout)} test photos; {args.out}/heldout: the test photos "
        "with their boxes"
    )


if __name__ == "__main__":
    main()
