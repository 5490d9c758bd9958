"""A preset's tag table: which caption word each ImageNet class of its encoder names.

`tags.tsv`, one line per output of the encoder's ImageNet head, in output order, five
tab-separated fields: the class index, its WordNet id, the caption word (empty when the
class names nothing the captions say), the class's ImageNet name, and how the word was
found (`scripts/build_tag_table.py` writes it; its docstring says how).
"""

import csv
from typing import NamedTuple

TAGS_FILE = "tags.tsv"
_HEADER = ("class", "wnid", "word", "imagenet_name", "how")


class TagRow(NamedTuple):
    index: int
    wnid: str
    word: str
    name: str
    how: str


def write_table(path: str, rows: list[TagRow]) -> None:
    """Writes the rows as a tag table (a header line, then one line per class)."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(_HEADER)
        writer.writerows(rows)


def read_table(path: str) -> list[TagRow]:
    """The rows of a tag table, checked to number its classes 0, 1, ... in order.

    Raises:
      ValueError: naming the file and line that is not a row of a tag table.
    """
    with open(path, encoding="utf-8", newline="") as f:
        lines = list(csv.reader(f, delimiter="\t"))
    if not lines or tuple(lines[0]) != _HEADER:
        raise ValueError(f"{path} is not a tag table: its first line must be {_HEADER}")
    rows = []
    for number, fields in enumerate(lines[1:], start=2):
        if len(fields) != len(_HEADER) or fields[0] != str(len(rows)):
            raise ValueError(f"{path}, line {number}: expected class {len(rows)} and 5 fields")
        rows.append(TagRow(int(fields[0]), *fields[1:]))
    return rows
