"""Read PyTorch state-dict files into numpy arrays without importing torch.

Pretrained encoder weights ship as `torch.save(model.state_dict(), path)` files. Two
layouts exist:

- legacy (torch < 1.6): five pickles and raw bytes in one stream — the magic number, the
  protocol version, a dict of system information, the state dict itself (tensor storages
  appear as persistent ids), the list of storage keys, then for every key in that order an
  int64 element count followed by the storage's bytes, little endian;
- zip (torch >= 1.6): `<archive>/data.pkl` holds the state dict pickle and
  `<archive>/data/<key>` the raw bytes of each storage.

Unpickling runs code named by the file, so a plain `pickle.load` of an untrusted
checkpoint can run anything. `_SafeUnpickler.find_class` resolves only the few globals a
state dict needs, and each to a local stand-in rather than torch's own function;
everything else is refused before it can be called.
"""

import collections
import io
import os
import pickle
import struct
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001

_STORAGE_DTYPES = {
    "FloatStorage": "f4",
    "DoubleStorage": "f8",
    "HalfStorage": "f2",
    "BFloat16Storage": "bf16",
    "LongStorage": "i8",
    "IntStorage": "i4",
    "ShortStorage": "i2",
    "CharStorage": "i1",
    "ByteStorage": "u1",
    "BoolStorage": "b1",
}


class TorchLoadError(ValueError):
    """A file is not a readable torch state dict."""


class ForbiddenGlobalError(TorchLoadError):
    """The pickle names a global outside the state-dict allowlist."""


@dataclass(frozen=True)
class _StorageType:
    name: str

    @property
    def code(self):
        return _STORAGE_DTYPES[self.name]


class _Storage:
    """A flat typed buffer; `array` is filled once the file's bytes have been read.

    A legacy view (`view_of` = (root storage, element offset)) shares its root's bytes.
    """

    def __init__(self, storage_type, numel, view_of=(None, 0)):
        self.storage_type = storage_type
        self.numel = numel
        self.view_of = view_of
        self.array = None


@dataclass(frozen=True)
class _TensorRef:
    storage: _Storage
    offset: int
    size: tuple
    stride: tuple


def _rebuild_tensor(storage, storage_offset, size, stride, *unused):
    """Stand-in for `torch._utils._rebuild_tensor{,_v2}`: records where the tensor lives."""
    return _TensorRef(storage, storage_offset, tuple(size), tuple(stride))


def _rebuild_parameter(data, requires_grad, backward_hooks, *unused):
    """Stand-in for `torch._utils._rebuild_parameter`: a parameter is its tensor."""
    return data


_ALLOWED_GLOBALS = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    **{("torch", name): _StorageType(name) for name in _STORAGE_DTYPES},
}

ALLOWED_GLOBALS = tuple(sorted(f"{module}.{name}" for module, name in _ALLOWED_GLOBALS))


class _SafeUnpickler(pickle.Unpickler):
    """Unpickler that resolves only `ALLOWED_GLOBALS` and torch storage persistent ids.

    Args:
      file: binary stream positioned at a pickle.
      path: file name quoted in errors.
      load_storage: `(storage_type, key, numel, root=None, offset=0) -> _Storage`; the
        storage for a persistent id (a legacy view passes its root and element offset),
        created once per key.
    """

    def __init__(self, file, path, load_storage):
        super().__init__(file, encoding="utf-8")
        self._path = path
        self._load_storage = load_storage

    def find_class(self, module, name):
        allowed = _ALLOWED_GLOBALS.get((module, name))
        if allowed is None:
            raise ForbiddenGlobalError(
                f"{self._path}: refusing to unpickle global '{module}.{name}'; a state dict "
                f"needs only {', '.join(ALLOWED_GLOBALS)}"
            )
        return allowed

    def persistent_load(self, pid):
        if not isinstance(pid, tuple) or not pid:
            raise TorchLoadError(f"{self._path}: unexpected persistent id {pid!r}")
        pid = tuple(p.decode("ascii") if isinstance(p, bytes) else p for p in pid)
        if pid[0] != "storage":
            raise ForbiddenGlobalError(
                f"{self._path}: refusing persistent id of kind {pid[0]!r}; only tensor "
                "storages are read"
            )
        storage_type, key, _location, numel = pid[1:5]
        view = pid[5] if len(pid) > 5 else None
        if not isinstance(storage_type, _StorageType) or not isinstance(numel, int):
            raise TorchLoadError(f"{self._path}: malformed storage id {pid!r}")
        storage = self._load_storage(storage_type, str(key), numel)
        if view is None:
            return storage
        view_key, view_offset, view_numel = view
        return self._load_storage(storage_type, str(view_key), view_numel, storage, view_offset)


def _decode(buffer, storage_type, byteorder):
    """Raw bytes -> 1-D array of the storage's dtype (bfloat16 widened to float32)."""
    if storage_type.code == "bf16":
        half = np.frombuffer(buffer, dtype=byteorder + "u2").astype(np.uint32)
        return (half << 16).view(np.float32)
    code = storage_type.code
    dtype = np.dtype(code if code in ("b1", "i1", "u1") else byteorder + code)
    return np.frombuffer(buffer, dtype=dtype).astype(dtype.newbyteorder("="))


def _materialize(ref):
    """The tensor a `_TensorRef` describes, as a C-contiguous copy.

    The layout is checked here, after unpickling, so that nothing the pickle did later
    can move a tensor outside its storage; gathering by index keeps numpy's bounds check.
    """
    storage = ref.storage
    if not isinstance(storage, _Storage) or not isinstance(storage.array, np.ndarray):
        raise TypeError(f"tensor storage is a {type(storage).__name__}, not a read storage")
    size, stride, offset = ref.size, ref.stride, ref.offset
    values = (offset, *size, *stride)
    if len(size) != len(stride) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values
    ):
        raise TypeError(f"bad tensor layout: offset {offset!r}, size {size}, stride {stride}")
    flat = storage.array
    if 0 in size:
        return np.empty(size, flat.dtype)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if last >= min(storage.numel, flat.size):
        raise TypeError(
            f"tensor with offset {offset}, size {size}, stride {stride} reads past the end "
            f"of its storage of {flat.size} elements"
        )
    index = np.full((1,) * len(size), offset, dtype=np.int64)
    for axis, (n, s) in enumerate(zip(size, stride, strict=True)):
        shape = [1] * len(size)
        shape[axis] = n
        index = index + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    return np.asarray(flat[index])


def _to_arrays(obj, path):
    if not isinstance(obj, Mapping):
        raise TorchLoadError(f"{path}: holds a {type(obj).__name__}, not a state dict")
    state = {}
    for key, value in obj.items():
        if not isinstance(key, str) or not isinstance(value, _TensorRef):
            raise TorchLoadError(
                f"{path}: not a flat state dict of tensors (entry {key!r} holds "
                f"{type(value).__name__})"
            )
        state[key] = _materialize(value)
    return state


_READ_ERRORS = (
    pickle.UnpicklingError,
    EOFError,
    TypeError,
    ValueError,
    KeyError,
    IndexError,
    AttributeError,
    struct.error,
    UnicodeDecodeError,
    zipfile.BadZipFile,
)


class _StorageTable:
    """Storages by key, shared across persistent ids; views share their root's bytes."""

    def __init__(self, path):
        self.path = path
        self.storages = {}

    def get(self, storage_type, key, numel, root=None, offset=0):
        if key not in self.storages:
            if numel < 0:
                raise TorchLoadError(f"{self.path}: storage {key} has {numel} elements")
            self.storages[key] = _Storage(storage_type, numel, (root, offset))
        storage = self.storages[key]
        if storage.storage_type != storage_type or storage.numel != numel:
            raise TorchLoadError(f"{self.path}: storage {key} is declared twice differently")
        return storage

    def resolve_views(self):
        for key, storage in self.storages.items():
            root, offset = storage.view_of
            if root is None:
                continue
            if (
                root.array is None
                or not isinstance(offset, int)
                or offset < 0
                or offset + storage.numel > root.array.size
            ):
                raise TorchLoadError(f"{self.path}: storage view {key} lies outside its root")
            storage.array = root.array[offset : offset + storage.numel]


def _read_legacy(data, path):
    stream = io.BytesIO(data)
    table = _StorageTable(path)

    def load():
        return _SafeUnpickler(stream, path, table.get).load()

    try:
        magic = load()
    except TorchLoadError:
        raise
    except _READ_ERRORS as e:
        raise TorchLoadError(f"{path}: not a torch checkpoint ({type(e).__name__}: {e})") from e
    if magic != LEGACY_MAGIC:
        raise TorchLoadError(f"{path}: not a torch checkpoint (magic number {magic!r})")
    try:
        protocol = load()
        if protocol != LEGACY_PROTOCOL:
            raise TorchLoadError(f"{path}: unsupported torch protocol version {protocol!r}")
        load()
        obj = load()
        keys = load()
        if not isinstance(keys, list):
            raise TorchLoadError(f"{path}: storage key list is a {type(keys).__name__}")
        for key in keys:
            storage = table.storages.get(str(key))
            if storage is None:
                raise TorchLoadError(f"{path}: storage {key} is listed but never used")
            (numel,) = struct.unpack("<q", stream.read(8))
            if numel != storage.numel:
                raise TorchLoadError(
                    f"{path}: storage {key} holds {numel} elements, expected {storage.numel}"
                )
            nbytes = numel * _itemsize(storage.storage_type)
            buffer = stream.read(nbytes)
            if len(buffer) != nbytes:
                raise EOFError(f"storage {key} needs {nbytes} bytes, {len(buffer)} left")
            storage.array = _decode(buffer, storage.storage_type, "<")
        table.resolve_views()
        return _to_arrays(obj, path)
    except TorchLoadError:
        raise
    except _READ_ERRORS as e:
        raise TorchLoadError(
            f"{path}: truncated or corrupt torch checkpoint ({type(e).__name__}: {e})"
        ) from e


def _itemsize(storage_type):
    return 2 if storage_type.code == "bf16" else np.dtype(storage_type.code).itemsize


def _read_zip(path):
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.rsplit("/", 1)[-1] == "data.pkl"]
            if len(names) != 1:
                raise TorchLoadError(f"{path}: zip file without a single data.pkl record")
            prefix = names[0][: -len("data.pkl")]
            byteorder = "<"
            if prefix + "byteorder" in archive.namelist():
                order = archive.read(prefix + "byteorder").decode("ascii").strip()
                byteorder = {"little": "<", "big": ">"}[order]
            table = _StorageTable(path)

            def load_storage(storage_type, key, numel, root=None, offset=0):
                storage = table.get(storage_type, key, numel, root, offset)
                if storage.array is None and root is None:
                    nbytes = numel * _itemsize(storage_type)
                    buffer = archive.read(f"{prefix}data/{key}")
                    if len(buffer) < nbytes:
                        raise EOFError(f"storage {key} needs {nbytes} bytes, has {len(buffer)}")
                    storage.array = _decode(buffer[:nbytes], storage_type, byteorder)
                return storage

            obj = _SafeUnpickler(io.BytesIO(archive.read(names[0])), path, load_storage).load()
            table.resolve_views()
            return _to_arrays(obj, path)
    except TorchLoadError:
        raise
    except (*_READ_ERRORS, OSError) as e:
        raise TorchLoadError(
            f"{path}: truncated or corrupt torch zip checkpoint ({type(e).__name__}: {e})"
        ) from e


def _read_file(path):
    path = os.fspath(path)
    with open(path, "rb") as f:
        return f.read()


def load_legacy_state_dict(path):
    """Reads a state dict saved by torch < 1.6 (`_use_new_zipfile_serialization=False`).

    Args:
      path: file written by `torch.save(state_dict, path)` in the legacy format.

    Returns:
      `{name: array}` in the file's order; every array is a C-contiguous copy in native
      byte order with the tensor's shape (storage offsets and strides applied). float32,
      float64, float16, int8/16/32/64, uint8 and bool keep their dtype; bfloat16 becomes
      float32.

    Raises:
      ForbiddenGlobalError: the pickle names anything outside `ALLOWED_GLOBALS`.
      TorchLoadError: the file is not a legacy torch file, is truncated or corrupt, or
        holds something other than a flat mapping of names to tensors.
    """
    return _read_legacy(_read_file(path), os.fspath(path))


def load_state_dict(path):
    """Reads a torch state dict in either the zip (torch >= 1.6) or the legacy format.

    Args:
      path: file written by `torch.save(state_dict, path)`.

    Returns:
      `{name: array}` as `load_legacy_state_dict` returns it.

    Raises:
      ForbiddenGlobalError, TorchLoadError: as `load_legacy_state_dict`.
    """
    data = _read_file(path)
    if data[:4] == b"PK\x03\x04":
        return _read_zip(os.fspath(path))
    return _read_legacy(data, os.fspath(path))
