"""Tests for sat_tf.backbones.torch_weights on torch files written by hand (no torch needed)."""

import builtins
import collections
import io
import os
import pickle
import struct
import sys
import tempfile
import types
import zipfile
from unittest import mock

import numpy as np
import pytest
from absl.testing import parameterized

from sat_tf.backbones import torch_weights

_MAGIC = 0x1950A86A20F9469CFC6C
_CODES = {"FloatStorage": "<f4", "HalfStorage": "<f2", "LongStorage": "<i8", "BoolStorage": "?"}


def _fake_torch():
    """Modules named `torch` / `torch._utils` whose objects pickle under torch's names."""
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")
    for name in (*_CODES, "BFloat16Storage"):
        setattr(torch, name, type(name, (), {"__module__": "torch"}))

    def _rebuild_tensor_v2(*args):
        raise AssertionError("never called while writing")

    _rebuild_tensor_v2.__module__ = "torch._utils"
    _rebuild_tensor_v2.__qualname__ = "_rebuild_tensor_v2"
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2
    torch._utils = utils
    return {"torch": torch, "torch._utils": utils}


_TORCH = _fake_torch()


class Storage:
    """What torch writes for a storage: a persistent id, then its raw bytes."""

    def __init__(self, key, name, raw, numel, view=None):
        self.key, self.name, self.raw, self.numel, self.view = key, name, raw, numel, view

    @classmethod
    def of(cls, key, values, name="FloatStorage"):
        values = np.asarray(values).ravel()
        return cls(key, name, values.astype(_CODES[name]).tobytes(), values.size)


class Tensor:
    """Pickles as torch does: `_rebuild_tensor_v2(storage, offset, size, stride, ...)`."""

    def __init__(self, storage, offset, size, stride):
        self.args = (storage, offset, tuple(size), tuple(stride), False, collections.OrderedDict())

    def __reduce_ex__(self, protocol):
        return _TORCH["torch._utils"]._rebuild_tensor_v2, self.args


class Writer(pickle.Pickler):
    def __init__(self, file):
        super().__init__(file, protocol=2)
        self.storages = {}

    def persistent_id(self, obj):
        if not isinstance(obj, Storage):
            return None
        self.storages[obj.key] = obj
        storage_type = getattr(_TORCH["torch"], obj.name)
        return ("storage", storage_type, obj.key, "cpu", obj.numel, obj.view)


def _state_dict(tensors):
    state = collections.OrderedDict(tensors)
    state._metadata = collections.OrderedDict({"": {"version": 1}})
    return state


def write_legacy(path, obj):
    """Mimics torch's `_legacy_save`: five pickles, then each storage's size and bytes."""
    with open(path, "wb") as f, mock.patch.dict(sys.modules, _TORCH):
        pickle.dump(_MAGIC, f, protocol=2)
        pickle.dump(1001, f, protocol=2)
        sizes = {"short": 2, "int": 4, "long": 4}
        pickle.dump({"protocol_version": 1001, "little_endian": True, "type_sizes": sizes}, f, 2)
        writer = Writer(f)
        writer.dump(obj)
        keys = sorted(k for k, s in writer.storages.items() if s.raw is not None)
        pickle.dump(keys, f, protocol=2)
        for key in keys:
            f.write(struct.pack("<q", writer.storages[key].numel) + writer.storages[key].raw)


def write_zip(path, obj):
    """Mimics torch's zip format: `archive/data.pkl` and `archive/data/<key>` records."""
    buffer = io.BytesIO()
    with mock.patch.dict(sys.modules, _TORCH):
        writer = Writer(buffer)
        writer.dump(obj)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", buffer.getvalue())
        archive.writestr("archive/byteorder", "little")
        for key, storage in writer.storages.items():
            archive.writestr(f"archive/data/{key}", storage.raw)
        archive.writestr("archive/version", "3\n")


_WRITERS = {"legacy": write_legacy, "zip": write_zip}


class TorchWeightsTest(parameterized.TestCase):
    def setUp(self):
        super().setUp()
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.dir = tmp.name

    def _path(self, name="w.pth"):
        return os.path.join(self.dir, name)

    @parameterized.parameters("legacy", "zip")
    def test_values_and_dtypes(self, fmt):
        weight = np.array([[1.5, -2.25, 3.0], [0.0, 1e-3, -7.0]], np.float32)
        half = np.array([0.5, -1.0, 65504.0], np.float16)
        mask = np.array([True, False, True, True])
        state = _state_dict(
            [
                ("conv.weight", Tensor(Storage.of("0", weight), 0, (2, 3), (3, 1))),
                ("half", Tensor(Storage.of("1", half, "HalfStorage"), 0, (3,), (1,))),
                ("bn.num_batches_tracked", Tensor(Storage.of("2", [7], "LongStorage"), 0, (), ())),
                ("mask", Tensor(Storage.of("3", mask, "BoolStorage"), 0, (2, 2), (2, 1))),
            ]
        )
        _WRITERS[fmt](self._path(), state)
        loaded = torch_weights.load_state_dict(self._path())
        self.assertEqual(list(loaded), ["conv.weight", "half", "bn.num_batches_tracked", "mask"])
        self.assertEqual(loaded["conv.weight"].dtype, np.float32)
        np.testing.assert_array_equal(loaded["conv.weight"], weight)
        self.assertEqual(loaded["half"].dtype, np.float16)
        np.testing.assert_array_equal(loaded["half"], half)
        self.assertEqual(loaded["bn.num_batches_tracked"].dtype, np.int64)
        self.assertEqual(loaded["bn.num_batches_tracked"].shape, ())
        self.assertEqual(int(loaded["bn.num_batches_tracked"]), 7)
        np.testing.assert_array_equal(loaded["mask"], [[True, False], [True, True]])

    @parameterized.parameters("legacy", "zip")
    def test_offsets_and_strides(self, fmt):
        flat = np.arange(24, dtype=np.float32) * 0.5
        storage = Storage.of("7", flat)
        # A transposed view (stride 1 along the first axis), as TF-converted weights are
        # stored, and a window of another tensor sharing the storage.
        state = _state_dict(
            [
                ("transposed", Tensor(storage, 2, (3, 4), (1, 3))),
                ("window", Tensor(storage, 5, (2, 2), (6, 1))),
            ]
        )
        _WRITERS[fmt](self._path(), state)
        loaded = torch_weights.load_state_dict(self._path())
        expected = [[flat[2 + i + 3 * j] for j in range(4)] for i in range(3)]
        np.testing.assert_array_equal(loaded["transposed"], expected)
        np.testing.assert_array_equal(loaded["window"], [[2.5, 3.0], [5.5, 6.0]])
        self.assertTrue(loaded["transposed"].flags["C_CONTIGUOUS"])

    def test_legacy_reader_is_the_same_as_autodetect(self):
        state = _state_dict([("w", Tensor(Storage.of("0", [1.0, 2.0]), 1, (1,), (1,)))])
        write_legacy(self._path(), state)
        np.testing.assert_array_equal(torch_weights.load_legacy_state_dict(self._path())["w"], [2])

    def test_bfloat16_becomes_float32(self):
        values = np.array([1.5, -2.0, 0.15625], np.float32)
        raw = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
        state = _state_dict([("b", Tensor(Storage("0", "BFloat16Storage", raw, 3), 0, (3,), (1,)))])
        write_legacy(self._path(), state)
        loaded = torch_weights.load_state_dict(self._path())["b"]
        self.assertEqual(loaded.dtype, np.float32)
        np.testing.assert_array_equal(loaded, values)

    def test_legacy_storage_view(self):
        root = Storage.of("root", np.arange(10, dtype=np.float32))
        view = Storage("root", "FloatStorage", root.raw, 10, view=("view0", 4, 3))
        state = _state_dict([("v", Tensor(view, 1, (2,), (1,)))])
        write_legacy(self._path(), state)
        np.testing.assert_array_equal(torch_weights.load_state_dict(self._path())["v"], [5, 6])

    @parameterized.parameters("legacy", "zip")
    def test_tensor_past_its_storage_is_refused(self, fmt):
        state = _state_dict([("w", Tensor(Storage.of("0", np.zeros(6)), 1, (2, 3), (3, 1)))])
        _WRITERS[fmt](self._path(), state)
        with pytest.raises(torch_weights.TorchLoadError, match="past the end") as e:
            torch_weights.load_state_dict(self._path())
        self.assertIn(self._path(), str(e.value))

    @parameterized.product(
        fmt=["legacy", "zip"],
        attack=["system", "eval"],
    )
    def test_code_in_the_pickle_is_refused_and_not_run(self, fmt, attack):
        marker = self._path("ran")

        class Payload:
            def __reduce__(self):
                if attack == "system":
                    return os.system, (f"touch {marker}",)
                return builtins.eval, (f"open({marker!r}, 'w').close()",)

        _WRITERS[fmt](self._path(), _state_dict([("w", Payload())]))
        with pytest.raises(torch_weights.ForbiddenGlobalError) as e:
            torch_weights.load_state_dict(self._path())
        # Protocol 2 writes Python 3's `builtins` under its Python 2 name.
        name = f"{os.system.__module__}.system" if attack == "system" else "__builtin__.eval"
        self.assertIn(f"'{name}'", str(e.value))
        self.assertIn(self._path(), str(e.value))
        self.assertFalse(os.path.exists(marker))

    def test_code_in_the_first_pickle_is_refused(self):
        marker = self._path("ran")
        with open(self._path(), "wb") as f:
            f.write(b"cos\nsystem\n(S'touch " + marker.encode() + b"'\ntR.")
        with pytest.raises(torch_weights.ForbiddenGlobalError, match="os.system"):
            torch_weights.load_state_dict(self._path())
        self.assertFalse(os.path.exists(marker))

    def test_non_storage_persistent_id_is_refused(self):
        with open(self._path(), "wb") as f:
            for header in (_MAGIC, 1001, {}):
                pickle.dump(header, f, protocol=2)
            f.write(b"(X\x06\x00\x00\x00moduleq\x00tQ.")
        with pytest.raises(torch_weights.ForbiddenGlobalError, match="'module'"):
            torch_weights.load_state_dict(self._path())

    @parameterized.parameters(
        ("text", b"a text file\nnot a checkpoint\n", "not a torch checkpoint"),
        ("empty", b"", "not a torch checkpoint"),
        ("other pickle", pickle.dumps({"a": 1}, protocol=2), "magic number"),
    )
    def test_not_a_torch_file(self, name, content, message):
        with open(self._path(), "wb") as f:
            f.write(content)
        with pytest.raises(torch_weights.TorchLoadError, match=message) as e:
            torch_weights.load_state_dict(self._path())
        self.assertIn(self._path(), str(e.value))

    @parameterized.parameters("legacy", "zip")
    def test_truncated_file(self, fmt):
        values = np.arange(100, dtype=np.float32)
        _WRITERS[fmt](
            self._path(), _state_dict([("w", Tensor(Storage.of("0", values), 0, (100,), (1,)))])
        )
        with open(self._path(), "rb") as f:
            data = f.read()
        for cut in (len(data) - 7, len(data) // 2, 60):
            with open(self._path(), "wb") as f:
                f.write(data[:cut])
            with pytest.raises(torch_weights.TorchLoadError) as e:
                torch_weights.load_state_dict(self._path())
            self.assertIn(self._path(), str(e.value))

    def test_not_a_state_dict(self):
        write_legacy(self._path(), {"epoch": 3})
        with pytest.raises(torch_weights.TorchLoadError, match="'epoch' holds int"):
            torch_weights.load_state_dict(self._path())
