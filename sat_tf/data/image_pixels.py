"""Image bytes to model input without TensorFlow: the pixels `image_io` gives, for a
process that captions with LiteRT (docs/design.md §4.4, §7.3).

Each format is decoded to the bytes TensorFlow's decoder gives: JPEG by libjpeg-turbo
(`simplejpeg`) with the settings of TensorFlow's `decode_image` (the fast integer DCT
and fancy upsampling: the same pixels bit for bit), a CMYK JPEG turned to RGB by
TensorFlow's rule; PNG, GIF (first frame) and WebP by Pillow, converted as TensorFlow
converts them; BMP read as TensorFlow's reader reads it (uncompressed 8, 24 or 32 bits
a pixel, a file of exactly the size its rows need; 8-bit values are grey levels, not
palette indices), refused otherwise. A JPEG is turned upright by its EXIF orientation
(`image_header.read_orientation`). `resize_and_crop` is TensorFlow's antialiased
bilinear resize (its triangle-kernel weights, computed and summed in the order and
precision of its kernel) and the same centre crop. Admission (`image_header.admit`) and
every message are those of `image_io`: a file refused here gives the same one line.
"""

import io

import numpy as np

from sat_tf.data.image_files import MAX_IMAGE_PIXELS, check_path
from sat_tf.data.image_header import (
    CORRUPT,
    UPRIGHT,
    ImageError,
    admit,
    corrupt_message,
    read_orientation,
)

# TensorFlow's decoders refuse images whose decoded bytes reach 2^29 (JPEG, PNG).
_TF_MAX_BYTES = 1 << 29


class _Refused(Exception):
    """A file the decoder TensorFlow uses would refuse."""


def _jpeg(data):
    import simplejpeg

    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError as e:
        if not str(e).startswith(_WARNINGS) or not _ends(data):
            raise _Refused from e
        return _with_pillow(data)  # TurboJPEG stops at a warning in the header
    space = {"CMYK": "CMYK", "YCCK": "CMYK", "Gray": "GRAY"}.get(colorspace, "RGB")
    if height * width * (4 if space == "CMYK" else 1 if space == "GRAY" else 3) >= _TF_MAX_BYTES:
        raise _Refused
    options = dict(colorspace=space, fastdct=True, fastupsample=False)
    try:
        pixels = simplejpeg.decode_jpeg(data, strict=True, **options)
    except ValueError as e:
        # TensorFlow reads on past libjpeg's warnings (damaged data), never past an error
        # or the end of the bytes.
        if not str(e).startswith(_WARNINGS) or not _ends(data):
            raise _Refused from e
        try:
            pixels = simplejpeg.decode_jpeg(data, strict=False, **options)
        except ValueError:
            return _with_pillow(data)
    return _cmyk_to_rgb(pixels, _adobe(data)) if space == "CMYK" else pixels


# libjpeg's warnings (its JWRN_* messages), after which TensorFlow's decoder goes on;
# "Premature end of JPEG file" is one too, but there TensorFlow stops.
_WARNINGS = (
    "Corrupt JPEG data",
    "Warning: unknown JFIF",
    "Unknown Adobe color transform",
    "Inconsistent progression sequence",
    "Invalid SOS parameters",
    "Application transferred",
)


def _with_pillow(data):
    """A JPEG that libjpeg warns about and TurboJPEG refuses, read on as TensorFlow's
    decoder reads on, by Pillow (its accurate DCT: values within a level or two of
    TensorFlow's), its colours converted as TensorFlow converts them."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.mode == "CMYK":  # Pillow turns Adobe's inverted values back
                raw = np.asarray(image)
                return _cmyk_to_rgb(255 - raw if _adobe(data) else raw, _adobe(data))
            return np.asarray(image if image.mode == "L" else image.convert("RGB"))
    except Exception as e:  # noqa: BLE001 - whatever Pillow raises, the file is corrupt
        raise _Refused from e


def _segments(data):
    """(marker, position) of a JPEG's marker segments from SOI up to its first scan
    (SOS), walked by their lengths."""
    pos = 2
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        yield marker, pos
        if marker == 0xDA:
            return
        pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")


def _adobe(data):
    """Whether a JPEG holds Adobe's APP14 segment (libjpeg's `saw_Adobe_marker`), which
    says its CMYK values are stored inverted."""
    return any(
        marker == 0xEE and data[at + 4 : at + 9] == b"Adobe" and data[at + 2 : at + 4] >= b"\0\x0e"
        for marker, at in _segments(data)
    )


def _ends(data):
    """Whether a JPEG's bytes hold an EOI marker after its first scan begins: where they
    do not, libjpeg reads past their end, which TensorFlow refuses (entropy-coded data
    never holds FF D9). The scan is found by walking the segments, so that a thumbnail's
    markers in an APP segment do not count; where the walk fails (a damaged length),
    by its marker."""
    scans = [at for marker, at in _segments(data) if marker == 0xDA]
    start = scans[0] if scans else data.find(b"\xff\xda")
    return start >= 0 and data.find(b"\xff\xd9", start) >= 0


def _cmyk_to_rgb(cmyk, adobe):
    """TensorFlow's CMYK -> RGB, in integers: k c / 255 for Adobe's inverted values,
    (255 - k)(255 - c) / 255 for the others."""
    values = cmyk.astype(np.int32)
    colour, black = values[..., :3], values[..., 3:]
    if not adobe:
        colour, black = 255 - colour, 255 - black
    return (black * colour // 255).astype(np.uint8)


def _bmp(data):
    """The BMP reader of TensorFlow's `decode_image`, in NumPy."""
    if len(data) < 32:
        raise _Refused
    offset, width, height = (
        int.from_bytes(data[i : i + 4], "little", signed=True) for i in (10, 18, 22)
    )
    channels = int.from_bytes(data[28:30], "little", signed=True) // 8
    if channels not in (1, 3, 4) or width <= 0 or height == 0 or offset < 0:
        raise _Refused
    rows = abs(height)
    row_size = (channels * width + 3) // 4 * 4
    if width * rows >= (2**31 - 1) // 8 or len(data) != offset + row_size * rows:
        raise _Refused
    pixels = np.frombuffer(data, np.uint8, row_size * rows, offset).reshape(rows, row_size)
    pixels = pixels[:, : width * channels].reshape(rows, width, channels)
    if height > 0:
        pixels = pixels[::-1]  # stored bottom up
    return pixels if channels == 1 else pixels[..., 2::-1]  # BGR(A) -> RGB


def _png_complete(data):
    """Whether a PNG's chunks run whole up to IEND: libpng (TensorFlow's decoder) reads
    them all, Pillow stops after the image data."""
    pos = 8
    while pos + 12 <= len(data):
        kind = data[pos + 4 : pos + 8]
        pos += 12 + int.from_bytes(data[pos : pos + 4], "big")
        if kind == b"IEND":
            return pos <= len(data)
    return False


def _gif_frames(data):
    """The frames TensorFlow's decoder keeps of a GIF: ([(left, top, width, height)] of
    each frame giflib read whole, up to the first error; the first frame's colour table
    (C, 3) and transparent index or -1). Raises `_Refused` where it keeps none (a header
    or colour table cut short, a first frame cut short, of zero size or with an LZW code
    size over 8); a later error (a file cut after a whole frame, an unknown record) ends
    the frames without refusing the file."""
    n = len(data)
    table = n >= 13 and data[10] & 0x80 and 3 << ((data[10] & 7) + 1)
    if n < 13 or n < 13 + table:
        raise _Refused
    pos, frames, first, transparent, pending = 13 + table, [], None, -1, -1
    while pos < n and data[pos] != 0x3B:
        start, kind = pos, data[pos]
        if kind == 0x21 and pos + 1 < n:  # an extension: its label, then sub-blocks
            if data[pos + 1] == 0xF9 and pos + 7 <= n and data[pos + 2] == 4:  # graphic control
                pending = data[pos + 6] if data[pos + 3] & 1 else -1
            pos += 2
        elif kind == 0x2C and pos + 10 <= n:  # a frame: descriptor, colour table, code size
            local = data[pos + 9] & 0x80 and 3 << ((data[pos + 9] & 7) + 1)
            pos += 11 + local
            if pos > n or data[pos - 1] > 8 or not _u16(data, start + 5) * _u16(data, start + 7):
                break
        else:  # the trailer's absence, or a record giflib does not know
            break
        while pos < n and data[pos]:  # sub-blocks: their size, then that many bytes
            pos += 1 + data[pos]
        if pos >= n:  # cut before the block that ends them
            break
        pos += 1
        if kind == 0x2C:
            frames.append(tuple(_u16(data, start + i) for i in (1, 3, 5, 7)))
            if first is None:
                local = data[start + 9] & 0x80 and 3 << ((data[start + 9] & 7) + 1)
                first = data[start + 10 : start + 10 + local] if local else data[13 : 13 + table]
                transparent = pending
            pending = -1
    if not frames or not first:
        raise _Refused
    return frames, np.frombuffer(first, np.uint8).reshape(-1, 3), transparent


def _u16(data, pos):
    return int.from_bytes(data[pos : pos + 2], "little")


def _gif(data):
    """A GIF's first frame as TensorFlow decodes it: on a canvas as large as its largest
    frame, black where the frame does not reach and at its transparent index."""
    from PIL import Image, ImageFile

    frames, colours, transparent = _gif_frames(data)
    left, top, width, height = frames[0]
    canvas = np.zeros((max(f[3] for f in frames), max(f[2] for f in frames), 3), np.uint8)
    truncated, ImageFile.LOAD_TRUNCATED_IMAGES = ImageFile.LOAD_TRUNCATED_IMAGES, True
    try:  # giflib keeps what it read of a frame cut short; Pillow leaves the rest 0
        with Image.open(io.BytesIO(data)) as image:
            indices = np.asarray(image)[top : top + height, left : left + width]
    except Exception as e:  # noqa: BLE001 - whatever Pillow raises, the file is corrupt
        raise _Refused from e
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = truncated
    shown = indices != transparent
    if np.any(indices[shown] >= len(colours)):
        raise _Refused
    pixels = np.where(shown[..., None], colours[np.minimum(indices, len(colours) - 1)], 0)
    rows, cols = min(height, canvas.shape[0] - top), min(width, canvas.shape[1] - left)
    canvas[top : top + rows, left : left + cols] = pixels[:rows, :cols]
    return canvas


def _pillow(data):
    """PNG, GIF and WebP as TensorFlow's decoders give them: PNG's channels as stored (a
    palette expanded, fewer than 8 bits scaled up, 16 bits cut to their high byte), a
    GIF's first frame in RGB, WebP in RGB."""
    from PIL import Image

    if not (_png_complete(data) if data.startswith(b"\x89PNG") else True):
        raise _Refused
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            if image.format == "PNG":
                return _png_array(image)
            return np.asarray(image.convert("RGBA" if "A" in image.getbands() else "RGB"))
    except _Refused:
        raise
    except Exception as e:  # noqa: BLE001 - whatever Pillow raises, the file is corrupt
        raise _Refused from e


def _png_array(image):
    if image.width * image.height >= _TF_MAX_BYTES or max(image.size) >= 1 << 27:
        raise _Refused
    if image.mode in ("I;16", "I;16B", "I", "I;16L"):
        return (np.asarray(image).astype(np.uint32) >> 8).astype(np.uint8)
    if image.mode == "1":
        return np.asarray(image, np.uint8) * np.uint8(255)
    if image.mode == "P":
        return np.asarray(image.convert("RGBA" if "transparency" in image.info else "RGB"))
    return np.asarray(image)


def decode_upright(data: bytes) -> np.ndarray:
    """Encoded image bytes -> (H, W, 3) uint8 RGB pixels, upright: what
    `image_io.decode_upright` gives, without TensorFlow.

    Raises:
      ValueError: when the decoder TensorFlow uses would refuse the bytes (the caller
        names the image: `decode_admitted`).
    """
    try:
        if data.startswith(b"\xff\xd8\xff"):
            pixels = _jpeg(data)
        elif data.startswith(b"BM"):
            pixels = _bmp(data)
        elif data.startswith(b"GIF"):
            pixels = _gif(data)
        else:
            pixels = _pillow(data)
    except _Refused as e:
        raise ValueError("the decoder refuses these bytes") from e
    if pixels.ndim == 2:
        pixels = pixels[..., None]
    if pixels.shape[-1] < 3:
        pixels = np.repeat(pixels[..., :1], 3, axis=-1)
    pixels = pixels[..., :3]
    if data.startswith(b"\xff\xd8"):
        transpose, flip_lr, flip_ud = UPRIGHT[read_orientation(data)]
        if transpose:
            pixels = pixels.transpose(1, 0, 2)
        if flip_lr:
            pixels = pixels[:, ::-1]
        if flip_ud:
            pixels = pixels[::-1]
    return np.ascontiguousarray(pixels)


def _spans(out_size, in_size):
    """(start (out,), weights (out, span)) of TensorFlow's antialiased triangle-kernel
    resize along one axis (its `ComputeSpansCore` with scale out / in and no
    translation), in float32."""
    f32 = np.float32
    scale = f32(out_size) / f32(in_size)
    inverse = f32(1.0 / np.float64(scale))
    kernel_scale = max(inverse, f32(1.0))  # wider than a pixel when shrinking
    span = min(2 * int(np.ceil(kernel_scale)) + 1, in_size)
    sample = (np.arange(out_size, dtype=f32) + f32(0.5)) * inverse
    start = np.clip(np.ceil(sample - kernel_scale - f32(0.5)), 0, in_size - 1).astype(np.int64)
    end = np.clip(np.floor(sample + kernel_scale - f32(0.5)), 0, in_size - 1).astype(np.int64) + 1
    weights = np.zeros((out_size, span), f32)
    for j in range(span):
        distance = np.abs(((start + j).astype(f32) + f32(0.5) - sample) * (f32(1.0) / kernel_scale))
        weights[:, j] = np.where((start + j < end) & (distance < 1), f32(1.0) - distance, f32(0.0))
    total = np.zeros(out_size, f32)
    for j in range(span):  # summed in order, as the kernel sums them
        total += weights[:, j]
    usable = np.abs(total) >= 1000 * np.finfo(f32).tiny
    weights *= np.where(usable, f32(1.0) / np.where(usable, total, f32(1.0)), f32(0.0))[:, None]
    return start, weights


def resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """`tf.image.resize(image, [height, width], antialias=True)` (bilinear) of one
    (H, W, C) image, in float32: rows first, then columns, each output pixel a sum of
    its span's weighted inputs in order."""
    image = np.asarray(image, np.float32)
    rows = np.zeros((height, *image.shape[1:]), np.float32)
    start, weights = _spans(height, image.shape[0])
    for j in range(weights.shape[1]):
        rows += weights[:, j, None, None] * image[np.minimum(start + j, image.shape[0] - 1)]
    out = np.zeros((height, width, image.shape[2]), np.float32)
    start, weights = _spans(width, image.shape[1])
    for j in range(weights.shape[1]):
        out += weights[None, :, j, None] * rows[:, np.minimum(start + j, image.shape[1] - 1)]
    return out


def crop_window(shape, image_size, crop_fraction=224 / 256):
    """`image_io.crop_window` in NumPy: (new_size (height, width), top, left)."""
    if crop_fraction >= 1.0:
        return (image_size, image_size), 0, 0
    shape = np.asarray(shape, np.float32)
    scale = np.float32(image_size / crop_fraction) / np.min(shape)
    new_size = np.maximum(np.round(shape * scale).astype(np.int32), image_size)
    return (
        (int(new_size[0]), int(new_size[1])),
        (new_size[0] - image_size) // 2,
        (new_size[1] - image_size) // 2,
    )


def resize_and_crop(image, image_size, crop_fraction=224 / 256) -> np.ndarray:
    """`image_io.resize_and_crop` of one (H, W, 3) image in NumPy: float32
    (image_size, image_size, 3) pixels in [0, 255]."""
    image = np.asarray(image)
    (height, width), top, left = crop_window(image.shape[:2], image_size, crop_fraction)
    resized = resize(image, height, width)
    return resized[top : top + image_size, left : left + image_size]


def decode_image(data: bytes, image_size: int, crop_fraction=224 / 256) -> np.ndarray:
    """`image_io.decode_image` without TensorFlow: `decode_upright`, then
    `resize_and_crop`."""
    return resize_and_crop(decode_upright(data), image_size, crop_fraction)


def decode_admitted(
    data: bytes,
    name: str,
    image_size: int,
    crop_fraction: float = 224 / 256,
    max_image_pixels: int = MAX_IMAGE_PIXELS,
) -> np.ndarray:
    """`image_io.decode_admitted` without TensorFlow: `admit`, then `decode_image`.

    Raises:
      ImageError: as `image_io.decode_admitted`, with its messages and statuses.
    """
    header = admit(data, name, max_image_pixels)
    try:
        return decode_image(data, image_size, crop_fraction)
    except ValueError:
        raise ImageError(corrupt_message(name, len(data), header.format), CORRUPT) from None


def load_image_file(
    path, image_size, crop_fraction=224 / 256, max_image_pixels=MAX_IMAGE_PIXELS
) -> np.ndarray:
    """`image_io.load_image_file` without TensorFlow.

    Raises:
      ValueError: as `image_io.load_image_file`, with its messages.
    """
    check_path(path)
    with open(path, "rb") as f:
        data = f.read()
    return decode_admitted(data, str(path), image_size, crop_fraction, max_image_pixels)
