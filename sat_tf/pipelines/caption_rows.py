"""The JSON-lines row of one captioned photo, as `sat-caption --output` and
`sat-caption-beam` write it, from the Python API's caption or from the export's outputs.

A captioned photo's row holds path, caption, tokens (the caption's ids, `<end>` left
out) and score (log p of the caption, `<end>` included when emitted); with a model that
has a tag table also tag (None when no tag was used) and tag_prob; with off-world
statistics also off_world_score and off_world; with several captions a photo (n > 1)
also captions, [{caption, score}, ...] best first, the first the row's caption. A photo
that got no caption has a row {path, error, status}: the status of `image_io` (1 empty, 2
not an image, 3 truncated or corrupt, 4 too many pixels), `MISSING` for a file that cannot
be read or `TOO_LARGE` for one over the byte limit, and a one-line reason that names the
file. Importing this module loads no TensorFlow.
"""

import re

# The status of a file that cannot be read (missing, a folder, no permission), and of
# one larger than the pipeline reads (never read); 1-4 are the export's
# (`sat_tf.data.image_io`).
MISSING = 5
TOO_LARGE = 6
_BATCH_INDEX = re.compile(r"^image_bytes\[\d+\]")


def caption_row(
    path,
    text,
    tokens,
    score,
    tag=None,
    tag_prob=None,
    off_world_score=None,
    off_world=None,
    captions=None,
) -> dict:
    """The row of a captioned photo; tag and tag_prob are written when tag_prob is not
    None, off_world_score and off_world when off_world_score is not None, captions (a
    list of (text, score), best first) when given."""
    row = {"path": path, "caption": text, "tokens": [int(t) for t in tokens], "score": float(score)}
    if tag_prob is not None:
        row["tag"], row["tag_prob"] = tag, float(tag_prob)
    if off_world_score is not None:
        row["off_world_score"], row["off_world"] = float(off_world_score), bool(off_world)
    if captions is not None:
        row["captions"] = [{"caption": t, "score": float(s)} for t, s in captions]
    return row


def error_row(path, status, error) -> dict:
    """The row of a photo that got no caption."""
    return {"path": path, "error": error, "status": int(status)}


def export_row(path, outputs, num_captions=1) -> dict:
    """The row of one photo from its outputs of the export's `serving_default` (one row
    of each output, numpy values).

    The export gives tag_prob 0 for a model without a tag table (and a softmax
    probability, never 0, for one with it), so tag fields are written where it is > 0;
    an error names the file in place of its place in the batch (the path as it is, never
    read as a replacement template). With `num_captions`
    n > 1 the row holds the first n of the export's `captions` and `log_probs` (those
    it has: "" and -inf mark none).

    Raises:
      ValueError: for n over the export's K (its beam size) captions a photo.
    """
    status = int(outputs["status"])
    if status:
        return error_row(path, status, _BATCH_INDEX.sub(lambda _: path, _text(outputs["error"])))
    captions = None
    if num_captions > 1:
        if num_captions > len(outputs["captions"]):
            raise ValueError(
                f"{num_captions} captions a photo: the export gives {len(outputs['captions'])} "
                "(its beam size); export it with --beam_size of at least that"
            )
        pairs = zip(outputs["captions"][:num_captions], outputs["log_probs"], strict=False)
        captions = [(_text(t), s) for t, s in pairs if s > float("-inf")]
    tag_prob = float(outputs["tag_prob"]) if float(outputs["tag_prob"]) > 0 else None
    return caption_row(
        path,
        _text(outputs["caption"]),
        outputs["tokens"][: int(outputs["length"])],
        outputs["log_prob"],
        (_text(outputs["tag"]) or None) if tag_prob is not None else None,
        tag_prob,
        outputs.get("off_world_score"),
        outputs.get("off_world"),
        captions,
    )


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
