"""What the commands check of an image file before TensorFlow loads: the admission limit
(`image_io.admit` reads the pixel count from the header) and why a path cannot be an
image file at all."""

import os

# Admission: the most pixels (width x height) an image may declare in its header.
MAX_IMAGE_PIXELS = 50_000_000
# The most bytes a photo file may have where its size is listed before it is read (the
# Beam pipelines): more than a photo of MAX_IMAGE_PIXELS takes as a JPEG (~25 MB) or a
# PNG (~100 MB).
MAX_IMAGE_BYTES = 128 << 20


def path_problem(path):
    """Why `path` cannot be an image file (missing, a directory), or None."""
    if not os.path.exists(path):
        return "does not exist"
    if os.path.isdir(path):
        return "is a directory, not a file"
    return None


def check_path(path):
    """Raises ValueError naming `path` when it cannot be an image file (`path_problem`)."""
    problem = path_problem(path)
    if problem:
        raise ValueError(f"image {path!r} {problem}")
