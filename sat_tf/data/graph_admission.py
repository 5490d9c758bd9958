"""The admission rule of `image_io` in TensorFlow ops, for a graph (the SavedModel's
image path, `tf.data` filters): `read_header_tf` walks an image's header as
`image_io.read_header` does in Python and gives the same answers, so that a small file
that declares a huge image is refused before a pixel is allocated, with the same
one-line message, in a process that runs only the graph.
"""

import functools

import tensorflow as tf

from sat_tf.data.image_io import (
    CORRUPT,
    EMPTY,
    FORMATS_TEXT,
    HEADER_FORMATS,
    MAX_IMAGE_PIXELS,
    MAX_STEPS,
    NOT_AN_IMAGE,
    OK,
    SIGNATURES,
    TOO_MANY_PIXELS,
    WEBP,
    decode_image,
)


def _where(condition, x, y):
    return tf.where(condition, tf.cast(x, tf.int64), tf.cast(y, tf.int64))


def _zero():
    return tf.constant(0, tf.int64)


def _one():
    return _zero() + 1


class _Bytes:
    """Encoded bytes as the header walk reads them: unsigned integers and substrings at
    int64 positions, bytes past the end reading as 0 (as `image_io._uint`).

    Attributes:
      n: int64 scalar, the length in bytes.
      padded: the bytes followed by 32 zeros.
    """

    def __init__(self, data):
        data = tf.reshape(data, [])
        self.n = tf.cast(tf.strings.length(data, unit="BYTE"), tf.int64)
        self.padded = data + b"\0" * 32
        self._raw = tf.io.decode_raw(self.padded, tf.uint8)
        self._last = tf.cast(tf.size(self._raw), tf.int64) - 1

    def uint(self, pos, width, little):
        """The unsigned integer of `width` bytes at `pos`, int64."""
        place = tf.range(width, dtype=tf.int64)
        at = tf.clip_by_value(pos + place, 0, self._last)
        weights = 256 ** (place if little else width - 1 - place)
        return tf.reduce_sum(tf.cast(tf.gather(self._raw, at), tf.int64) * weights)

    def byte(self, pos):
        return self.uint(pos, 1, True)

    def text(self, pos, width):
        """The `width` bytes at `pos`, a string scalar."""
        return tf.strings.substr(self.padded, pos, width)


# Each format's reader: (width, height, frames, pixels of all frames) as int64 scalars,
# width and height 0 where the header is cut or damaged.


def _jpeg(data):
    """As `image_io._jpeg_size`: the segment walk from SOI to the first start of frame."""

    def body(pos, steps, state):
        marker = data.byte(pos + 1)
        bad = (pos + 4 > data.n) | (data.byte(pos) != 0xFF)
        bad |= tf.reduce_any(tf.equal(marker, [0x00, 0xD8, 0xD9, 0xDA]))
        fill = tf.equal(marker, 0xFF)
        sof = (marker >= 0xC0) & (marker <= 0xCF)
        sof &= ~tf.reduce_any(tf.equal(marker, [0xC4, 0xC8, 0xCC]))
        bare = tf.equal(marker, 0x01) | ((marker >= 0xD0) & (marker <= 0xD7))
        length = data.uint(pos + 2, 2, False)
        bad |= ~fill & ~sof & ~bare & (length < 2)
        step = _where(fill, 1, _where(bare, 2, 2 + length))
        state = _where(bad, 2, _where(fill, 0, _where(sof, 1, 0)))
        return _where(state == 1, pos, pos + step), steps + 1, tf.cast(state, tf.int64)

    zero = tf.constant(0, tf.int64)
    pos, _, state = tf.while_loop(
        lambda pos, steps, state: tf.equal(state, 0) & (steps < MAX_STEPS),
        body,
        (tf.constant(2, tf.int64), zero, zero),
    )
    found = tf.equal(state, 1)
    width = _where(found, data.uint(pos + 7, 2, False), 0)
    return width, _where(found, data.uint(pos + 5, 2, False), 0), zero + 1, zero


def _png(data):
    header = tf.equal(data.text(12, 4), b"IHDR")
    width = _where(header, data.uint(16, 4, False), 0)
    return width, _where(header, data.uint(20, 4, False), 0), _one(), _zero()


def _table(flags):
    """Bytes of a GIF colour table that `flags` announces."""
    return _where(flags >= 0x80, 3 * 2 ** (flags % 8 + 1), 0)


def _gif(data):
    """As `image_io._gif_frames`: the block walk that counts frames and their pixels."""

    def walk(pos, steps, in_blocks, done, frames, pixels):
        value = data.byte(pos)
        end = pos >= data.n
        extension = ~end & ~in_blocks & tf.equal(value, 0x21)
        frame = ~end & ~in_blocks & tf.equal(value, 0x2C) & (pos + 10 <= data.n)
        sub_block = ~end & in_blocks
        done = ~(sub_block | extension | frame)
        area = data.uint(pos + 5, 2, True) * data.uint(pos + 7, 2, True)
        next_pos = _where(
            sub_block,
            pos + 1 + value,
            _where(extension, pos + 2, pos + 11 + _table(data.byte(pos + 9))),
        )
        return (
            _where(done, pos, next_pos),
            steps + 1,
            tf.where(sub_block, tf.not_equal(value, 0), extension | frame),
            done,
            frames + tf.cast(frame, tf.int64),
            pixels + _where(frame, area, 0),
        )

    start = 13 + _table(data.byte(10))
    zero = _zero()
    _, _, _, done, frames, pixels = tf.while_loop(
        lambda pos, steps, in_blocks, done, *_: ~done & (steps < MAX_STEPS),
        walk,
        (start, zero, tf.constant(False), tf.constant(False), zero, zero),
    )
    ok = (data.n >= 13) & done & (frames > 0)
    width = _where(ok, data.uint(6, 2, True), 0)
    return width, _where(ok, data.uint(8, 2, True), 0), tf.maximum(frames, 1), pixels


def _bmp(data):
    width, height = data.uint(18, 4, True), data.uint(22, 4, True)
    width = _where(width >= 2**31, width - 2**32, width)
    height = tf.abs(_where(height >= 2**31, height - 2**32, height))
    ok = (data.n >= 26) & (width > 0)
    return _where(ok, width, 0), _where(ok, height, 0), _one(), _zero()


def _webp(data):
    """A still WebP's size from its first chunk: lossy (VP8), lossless (VP8L) or
    extended (VP8X)."""
    chunk = data.text(12, 4)
    bits = data.uint(21, 4, True)
    vp8 = tf.equal(chunk, b"VP8 ") & tf.equal(data.text(23, 3), b"\x9d\x01\x2a")
    lossless = tf.equal(chunk, b"VP8L") & tf.equal(data.byte(20), 0x2F)
    extended = tf.equal(chunk, b"VP8X")
    width = _where(
        vp8,
        data.uint(26, 2, True) % 2**14,
        _where(lossless, bits % 2**14 + 1, _where(extended, data.uint(24, 3, True) + 1, 0)),
    )
    height = _where(
        vp8,
        data.uint(28, 2, True) % 2**14,
        _where(
            lossless, bits // 2**14 % 2**14 + 1, _where(extended, data.uint(27, 3, True) + 1, 0)
        ),
    )
    ok = data.n >= 30
    return _where(ok, width, 0), _where(ok, height, 0), _one(), _zero()


def _format_index(data):
    """As `image_io._read_format`: int64 index in `HEADER_FORMATS` of the format the bytes
    start like, or -1."""
    head = data.text(0, 12)
    matches = [
        tf.equal(tf.strings.substr(head, 0, 4), b"RIFF")
        & tf.equal(tf.strings.substr(head, 8, 4), b"WEBP")
    ]
    for signatures in SIGNATURES:
        found = [tf.equal(tf.strings.substr(head, 0, len(s)), s) for s in signatures]
        matches.append(tf.reduce_any(found))
    matches = tf.stack(matches[1:] + matches[:1])  # in HEADER_FORMATS order
    return _where(
        tf.reduce_any(matches), tf.argmax(tf.cast(matches, tf.int32), output_type=tf.int64), -1
    )


def _status(data, index, width, height):
    """`EMPTY`, `NOT_AN_IMAGE` (also an animated WebP, as `image_io.read_header`),
    `CORRUPT` where the size read is 0, else `OK`."""
    animated = (
        tf.equal(index, WEBP)
        & (data.n >= 30)
        & tf.equal(data.text(12, 4), b"VP8X")
        & (data.byte(20) // 2 % 2 == 1)
    )
    return _where(
        tf.equal(data.n, 0),
        EMPTY,
        _where(
            (index < 0) | animated,
            NOT_AN_IMAGE,
            _where((width > 0) & (height > 0), OK, CORRUPT),
        ),
    )


@tf.autograph.experimental.do_not_convert
def read_header_tf(data):
    """`image_io.admit`'s header walk in TensorFlow ops, for a graph (the SavedModel): the same
    signatures, the same JPEG segment and GIF block walk, the same answers.

    Args:
      data: scalar string tensor of encoded bytes.

    Returns:
      {"status": `OK`, `EMPTY`, `NOT_AN_IMAGE` or `CORRUPT`, "format": index in
      `HEADER_FORMATS` (-1: none), "width", "height", "frames", "pixels" (the count the
      limit applies to)}: int64 scalars.
    """
    data = _Bytes(data)
    index = _format_index(data)
    readers = [functools.partial(read, data) for read in (_jpeg, _png, _gif, _bmp, _webp)]
    width, height, frames, frame_pixels = tf.switch_case(
        tf.cast(index, tf.int32), readers, default=lambda: (_zero(),) * 4
    )
    # width * height, capped at 2**62 as `image_io` caps it, without int64 overflow (a
    # PNG side may reach 2**32 - 1).
    limit = tf.constant(2**62, tf.int64)
    capped = tf.where(height > limit // tf.maximum(width, 1), limit, width * height)
    return {
        "status": tf.cast(_status(data, index, width, height), tf.int64),
        "format": index,
        "width": width,
        "height": height,
        "frames": frames,
        "pixels": tf.maximum(capped, frame_pixels),
    }


def admits(data, max_image_pixels: int = MAX_IMAGE_PIXELS):
    """Scalar bool tensor: whether `image_io.admit` takes the bytes, for a `tf.data`
    filter before decoding."""
    header = read_header_tf(data)
    return tf.equal(header["status"], OK) & (header["pixels"] <= max_image_pixels)


def _grouped(values):
    """int64 (N,) >= 0 -> string (N,) with thousands separators, as Python's `{:,}`."""
    text = tf.fill(tf.shape(values), "")
    for power in range(6, -1, -1):
        part = values // 1000**power
        piece = tf.where(
            part >= 1000,
            tf.strings.join([",", tf.strings.as_string(part % 1000, width=3, fill="0")]),
            tf.strings.as_string(part),
        )
        text = tf.where((part > 0) | (power == 0), tf.strings.join([text, piece]), text)
    return text


# Images `decode_images_admitted` decodes at once: the two cores of the machines met, and
# no more full-size images held at a time.
_DECODE_PARALLEL = 2


def _skipping_failures(index, image_bytes, chosen, decode, spec):
    """(values (N, *spec.shape), read bool (N,)) of `decode(bytes)` on the `chosen`
    images, in a `tf.data` pipeline that skips an image whose decoding raises: a graph
    cannot catch an op's error, `tf.data` can skip the element that raised it. Zeros and
    False where not chosen or skipped.

    The pipeline holds one function, `decode`: each is instantiated every time the graph
    runs, so the chosen images are picked before it and its output is taken whole as one
    batch, ended by a marker element (index -1) so that the batch exists when every image
    is skipped.
    """
    count = tf.size(image_bytes, out_type=tf.int64)
    marker = (tf.constant(-1, tf.int64), tf.zeros(spec.shape, spec.dtype))
    where, values = (
        tf.data.Dataset.from_tensor_slices(
            (tf.boolean_mask(index, chosen), tf.boolean_mask(image_bytes, chosen))
        )
        .map(lambda i, data: (i, decode(data)))
        .ignore_errors()
        .concatenate(tf.data.Dataset.from_tensors(marker))
        .batch(count + 1)
        .get_single_element()
    )
    where = where[:-1, None]  # (K, 1), the marker left out
    shape = tf.concat([[count], tf.constant(spec.shape.as_list(), tf.int64)], 0)
    return (
        tf.scatter_nd(where, values[:-1], shape),
        tf.scatter_nd(where, tf.ones_like(where[:, 0], tf.bool), [count]),
    )


def _decodable(index, image_bytes, admitted):
    """bool (N,): which admitted images TensorFlow's decoder reads without an error.

    Only the decoding op that can fail runs in the pipeline (`_skipping_failures`): a
    `tf.data` function is instantiated every time the graph runs, at a cost that grows
    with its ops (the whole of `decode_image` costs about 0.1 s a batch this way against
    3 ms in the graph itself), so the pixels are made by `decode_image` in the graph once
    the flags are known. The decoding it repeats is the same op on the same bytes: an
    image flagged here decodes there.
    """

    def size(data):
        return tf.size(tf.io.decode_image(data, expand_animations=False, dtype=tf.uint8))

    sizes, read = _skipping_failures(
        index, image_bytes, admitted, size, tf.TensorSpec([], tf.int32)
    )
    return read & (sizes > 0)


def _decoded_apart(index, image_bytes, chosen, image_size, crop_fraction):
    """(pixels (N, S, S, 3), read (N,)) of the `chosen` images, decoded by `decode_image`
    whole in the pipeline (`_skipping_failures`): for an image whose resize alone may
    fail (`_resized_pixels`), at the cost of instantiating the whole decoding as a
    `tf.data` function."""
    spec = tf.TensorSpec([image_size, image_size, 3], tf.float32)
    decode = functools.partial(decode_image, image_size=image_size, crop_fraction=crop_fraction)
    return _skipping_failures(index, image_bytes, chosen, decode, spec)


def _merged(decoded, apart):
    """The pixels and read flags of `decoded`, with those read by `_decoded_apart`."""
    (pixels, read), (pixels_apart, read_apart) = decoded, apart
    return tf.where(read_apart[:, None, None, None], pixels_apart, pixels), read | read_apart


def _resized_pixels(header, image_size, crop_fraction):
    """float64 (N,): the pixels of each image once resized by `decode_image` before its
    crop (`image_io.crop_window`), from its header's width and height."""
    if crop_fraction >= 1.0:
        return tf.fill(tf.shape(header["width"]), float(image_size**2))
    sides = tf.cast(tf.stack([header["height"], header["width"]], 1), tf.float64)
    scale = (image_size / crop_fraction) / tf.maximum(tf.reduce_min(sides, 1), 1.0)
    return tf.reduce_prod(tf.maximum(tf.round(sides * scale[:, None]), image_size), 1)


def decode_images_admitted(
    image_bytes,
    image_size: int,
    crop_fraction: float = 224 / 256,
    max_image_pixels: int = MAX_IMAGE_PIXELS,
    name: str = "image_bytes",
):
    """A batch of encoded images -> pixels, with the status and message of each, in a
    graph: the SavedModel's image path.

    Each image's header is read (`read_header_tf`); those refused are never decoded (a
    bomb allocates nothing), the others are tried by TensorFlow's decoder in a `tf.data`
    pipeline that skips the ones whose decoding fails (`_decodable`), so one bad image
    does not fail the batch, and those it reads are decoded by `decode_image`.

    Args:
      image_bytes: string (N,).
      image_size, crop_fraction: see `image_io.decode_image`.
      max_image_pixels: see `image_io.admit`.
      name: how messages name the input (`name[i]`).

    Returns:
      (pixels float32 (N, S, S, 3), zeros where refused; status int32 (N,): `OK`,
      `EMPTY`, `NOT_AN_IMAGE`, `CORRUPT` or `TOO_MANY_PIXELS`; error string (N,): ''
      or the one-line message `image_io.admit` and `image_io.decode_admitted` give,
      naming `name[i]`).
    """
    count = tf.size(image_bytes)
    signature = {k: tf.TensorSpec([], tf.int64) for k in ("status", "format", "width")}
    signature.update({k: tf.TensorSpec([], tf.int64) for k in ("height", "frames", "pixels")})
    header = tf.map_fn(read_header_tf, image_bytes, fn_output_signature=signature)
    too_many = tf.equal(header["status"], OK) & (header["pixels"] > max_image_pixels)
    status = tf.where(too_many, TOO_MANY_PIXELS, tf.cast(header["status"], tf.int32))
    index = tf.range(count, dtype=tf.int64)
    shape = [image_size, image_size, 3]
    # An image that resizes to more pixels than the limit is decoded apart, where a
    # resize that fails refuses it alone.
    apart = tf.equal(status, OK) & (
        _resized_pixels(header, image_size, crop_fraction) > max_image_pixels
    )
    read = _decodable(index, image_bytes, tf.equal(status, OK) & ~apart)
    pixels = tf.map_fn(
        lambda args: tf.cond(
            args[1],
            lambda: decode_image(args[0], image_size, crop_fraction),
            lambda: tf.zeros(shape),
        ),
        (image_bytes, read),
        fn_output_signature=tf.TensorSpec(shape, tf.float32),
        parallel_iterations=_DECODE_PARALLEL,
    )
    pixels, read = tf.cond(
        tf.reduce_any(apart),
        lambda: _merged(
            (pixels, read), _decoded_apart(index, image_bytes, apart, image_size, crop_fraction)
        ),
        lambda: (pixels, read),
    )
    status = tf.where(tf.equal(status, OK) & ~read, CORRUPT, status)

    label = tf.strings.join([f"{name}[", tf.strings.as_string(index), "]"])
    size = tf.strings.join([" (", tf.strings.as_string(tf.strings.length(image_bytes)), " bytes)"])
    format_name = tf.gather(HEADER_FORMATS, tf.maximum(header["format"], 0))
    frames = tf.where(
        header["frames"] > 1,
        tf.strings.join([", ", tf.strings.as_string(header["frames"]), " frames"]),
        "",
    )
    messages = [
        "",
        tf.strings.join([label, " is empty (0 bytes)"]),
        tf.where(
            tf.equal(header["format"], WEBP),
            tf.strings.join(
                [
                    label,
                    size,
                    " is an animated WebP; sat_tf reads still WebP images (TensorFlow's "
                    "decoder cannot read animated ones)",
                ]
            ),
            tf.strings.join([label, size, f" is not a {FORMATS_TEXT} image"]),
        ),
        tf.strings.join([label, size, " is a truncated or corrupt ", format_name, " file"]),
        tf.strings.join(
            [
                label,
                ": ",
                _grouped(header["pixels"]),
                " pixels (",
                tf.strings.as_string(header["width"]),
                " x ",
                tf.strings.as_string(header["height"]),
                frames,
                f") is over the limit of {max_image_pixels:,}; max_image_pixels "
                "(--max_image_pixels) sets it",
            ]
        ),
    ]
    messages = [tf.broadcast_to(m, [count]) for m in messages]
    error = tf.gather(tf.stack(messages, axis=1), status, batch_dims=1)
    return tf.ensure_shape(pixels, [None, *shape]), status, error
