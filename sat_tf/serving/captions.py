"""What the Python API returns for an image, and the images it takes, without
TensorFlow: `Caption` (the caption of one image, whichever runtime made it:
`sat_tf.serving.api` on TensorFlow, `sat_tf.serving.litert` on LiteRT), and `pixels`,
which brings a file path, encoded bytes, a PIL image or a numpy array to the model's
geometry with the package's image code (`image_io` with TensorFlow, `image_pixels`
without: the same pixels).
"""

import dataclasses
import os
import sys
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class Caption:
    """The caption of one image.

    Attributes:
      text: the words joined by spaces.
      words: the caption's words (never `<pad>`, `<start>`, `<unk>`; `<end>` not included).
      tokens: int32 (len(words),) their ids in the model's vocabulary.
      score: log p(words, `<end>` | image), the sum of the emitted tokens'
        log-probabilities that greedy and beam search maximise (`<end>` included when
        it was emitted; a caption cut at the length limit has none). It is the model's
        own probability, as `Captioner.score` computes it: the decoding rules (the
        words never emitted, blocked repeats and endings, a tag the caption must say)
        only choose which captions are searched, and a drawn caption's temperature
        and nucleus only how it was drawn; none of them changes its score.
      attention: float32 (M, H, W), where the model looked: `attention[i]` is the map
        (summing to 1 over the H x W grid of annotation vectors, paper §4) that emitted
        `words[i]`; a caption that ended with `<end>` has one map more, for `<end>`
        (M = len(words) + 1), one cut at the length limit has M = len(words).
      image: uint8 (S, S, 3) the pixels the model saw (after resize and centre crop).
      off_world_score: how unlike the model's training photos the photo is
        (`off_world`: a Mahalanobis distance of its pooled features); None for a
        model without off-world statistics.
      off_world: whether the score exceeds the statistics' threshold: the caption is
        likely wrong, the photo being unlike any the model learnt from (it is still
        captioned); None without statistics.
      tag: the word the caption was made to say: the photo's tag from the encoder's
        ImageNet head (`sat_tf.serving.tags`), confident enough (`Config.tag_threshold`);
        None where no tag was used (none confident, tags off, or a model without a tag
        table).
      tag_prob: the probability of the photo's most probable tag, used or not; None for
        a model without a tag table.
    """

    text: str
    words: list[str]
    tokens: np.ndarray
    score: float
    attention: np.ndarray
    image: np.ndarray
    off_world_score: float | None = None
    off_world: bool | None = None
    tag: str | None = None
    tag_prob: float | None = None


def is_batch(images) -> bool:
    """Whether `images` is several images (a list, a tuple or an (N, H, W, 3) array)."""
    if isinstance(images, np.ndarray):
        return images.ndim == 4
    return isinstance(images, (list, tuple))


def describe(image, index) -> str:
    """How an error names image `index` of a batch: its path, else its place and type."""
    if isinstance(image, (str, os.PathLike)):
        return repr(os.fspath(image))
    return f"{index} of the batch ({type(image).__name__})"


def _array_pixels(array: np.ndarray, what: str) -> np.ndarray:
    """An (H, W, 3) float32 array in [0, 255] from a numpy image (converted, not refused:
    grayscale gets three channels, RGBA loses its alpha as `image_io.decode_upright` does).

    Raises:
      ValueError: for a shape that is not an image, or float pixels outside [0, 255] or
        all within (0, 1] (the [0, 1] convention; the model takes [0, 255]).
    """
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim == 2:
        array = np.stack([array] * 3, axis=-1)
    if array.ndim != 3 or array.shape[-1] not in (3, 4) or 0 in array.shape:
        raise ValueError(
            f"image {what}: a numpy image must be (H, W), (H, W, 1), (H, W, 3) or "
            f"(H, W, 4); got shape {array.shape}"
        )
    array = array[..., :3]
    if np.issubdtype(array.dtype, np.floating):
        low, high = float(np.min(array)), float(np.max(array))
        if not (np.isfinite(low) and np.isfinite(high)) or low < 0 or high > 255:
            raise ValueError(
                f"image {what}: float pixels must lie in [0, 255]; these span [{low}, {high}]"
            )
        if 0 < high <= 1:
            raise ValueError(
                f"image {what}: float pixels must lie in [0, 255]; these all lie in [0, 1] "
                "(multiply by 255)"
            )
    elif array.dtype == np.uint16:
        array = array / 257.0
    elif array.dtype != np.uint8:
        raise ValueError(f"image {what}: pixels must be uint8, uint16 or float, not {array.dtype}")
    return array.astype(np.float32)


def pixels(image: Any, index: int, size: int, crop: float, limit: int, decoder) -> np.ndarray:
    """One image at the model's geometry: (S, S, 3) float32 pixels in [0, 255].

    Args:
      image: a file path (str or `os.PathLike`), encoded bytes, a PIL image, or a
        numpy array (H, W, 3) of uint8 or of floats in [0, 255] (grayscale and RGBA
        are converted).
      index: its place in a batch, for error messages.
      size, crop: the model's image size and crop fraction (`image_io.resize_and_crop`).
      limit: the most pixels a file or bytes may declare (`image_header.admit`).
      decoder: the image code that decodes and resizes: `sat_tf.data.image_io`
        (TensorFlow) or `sat_tf.data.image_pixels` (NumPy), the same pixels.

    Raises:
      ValueError: naming the image (its path, or its place in the batch) and what is
        wrong with it; `ImageError` for a file or bytes that are empty, not an image,
        truncated or corrupt, or over `limit`.
    """
    what = describe(image, index)
    if isinstance(image, (str, os.PathLike)):
        out = decoder.load_image_file(os.fspath(image), size, crop, limit)
    elif isinstance(image, (bytes, bytearray)):
        out = decoder.decode_admitted(
            bytes(image), f"image {index} of the batch", size, crop, limit
        )
    elif isinstance(image, np.ndarray):
        out = decoder.resize_and_crop(_array_pixels(image, what), size, crop)
    else:
        # A PIL image exists only once Pillow is loaded: no need to load it here.
        pil = sys.modules.get("PIL.Image")
        if pil is None or not isinstance(image, pil.Image):
            raise ValueError(f"image {what}: give a file path, bytes, a PIL image or a numpy array")
        from PIL import ImageOps

        # Upright as `image_io.decode_upright` turns a file; RGB as it converts one.
        upright = ImageOps.exif_transpose(image)
        array = np.asarray(upright.convert("RGBA" if "A" in upright.getbands() else "RGB"))
        out = decoder.resize_and_crop(_array_pixels(array, what), size, crop)
    return np.asarray(out, np.float32)
