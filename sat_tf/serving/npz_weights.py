"""A model's weights as float16 arrays in an .npz file, read without pickle.

Each weight is keyed by its variable path without the model's name
(`decoder/init_h/kernel`), the encoder's under `encoder/`, so the file does not depend
on how Keras numbers layers in a process. The arrays are cast back to each variable's
dtype (float32) on loading.
"""

import zipfile
import zlib

import numpy as np

from sat_tf.utils import files
from sat_tf.utils.messages import preview


def variables(model, with_encoder: bool) -> dict:
    """{key: variable} of the weights stored; the encoder's only `with_encoder`."""
    encoder = {id(v) for v in model.encoder.weights} if model.encoder is not None else set()
    out = {}
    for variable in model.weights:
        if id(variable) in encoder:
            if not with_encoder:
                continue
            key = f"encoder/{variable.path}"
        else:
            key = variable.path.split("/", 1)[-1]
        if key in out:
            raise ValueError(f"two weights of the model have the path {key}")
        out[key] = variable
    return out


def _float16(key, value):
    if not np.issubdtype(value.dtype, np.floating):
        return value
    largest = float(np.max(np.abs(value))) if value.size else 0.0
    if largest > float(np.finfo(np.float16).max):
        raise ValueError(f"weight {key} holds {largest:g}, beyond the range of float16")
    return value.astype(np.float16)


def save(model, path: str, with_encoder: bool) -> int:
    """Writes the model's weights in float16 to `path` atomically.

    Returns:
      the number of values written.

    Raises:
      ValueError: for a weight beyond float16's range, naming it.
    """
    arrays = {k: _float16(k, v.numpy()) for k, v in variables(model, with_encoder).items()}
    with files.atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)
    return int(sum(a.size for a in arrays.values()))


def load(model, path: str, with_encoder: bool, model_source: str) -> None:
    """Assigns the weights of `path` to the model's variables.

    Args:
      model: a built model of the same architecture.
      path: an .npz file written by `save`.
      with_encoder: whether the file holds the encoder's weights.
      model_source: how errors name what the model was built from (`config.json`).

    Raises:
      ValueError: for a file that cannot be read (or holds pickled objects), or whose
        keys or shapes are not the model's, naming up to five differences.
    """
    name = path.rsplit("/", 1)[-1]
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise ValueError(f"cannot read {name}: {e}") from e
    wanted = variables(model, with_encoder)
    problems = []
    if missing := sorted(set(wanted) - set(arrays)):
        problems.append(f"it lacks {preview(missing)}")
    if extra := sorted(set(arrays) - set(wanted)):
        problems.append(f"the model has no {preview(extra)}")
    for key in sorted(set(wanted) & set(arrays)):
        want, got = tuple(wanted[key].shape), tuple(arrays[key].shape)
        if want != got:
            problems.append(f"{key} is {got} in {name}, {want} in the model")
    if problems:
        raise ValueError(
            f"{name} does not fit the model of {model_source}: " + "; ".join(problems[:5])
        )
    for key, variable in wanted.items():
        variable.assign(arrays[key].astype(variable.dtype))
