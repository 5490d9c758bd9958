"""Tests for sat_tf.pipelines.beam_handler: `SavedModelHandler` on a tiny SavedModel of
tensor and string signatures, alone, under `KeyedModelHandler` and in a pipeline on the
DirectRunner's batch engine; a folder elsewhere copied, its copy removed once loaded, an
object key with `..` refused."""

import os
import shutil
import tempfile
from unittest import mock

import apache_beam as beam
import numpy as np
import tensorflow as tf
from apache_beam.io.filesystem import FileMetadata, MatchResult
from apache_beam.io.filesystems import FileSystems
from apache_beam.ml.inference.base import KeyedModelHandler, RunInference
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from sat_tf.pipelines import beam_handler
from sat_tf.pipelines.beam_handler import SavedModelHandler

OPTIONS = ["--runner=FnApiRunner", "--direct_running_mode=in_memory"]


class Affine(tf.Module):
    """y = x W + b for rows x of 3 numbers (W, b known), and the length of strings."""

    def __init__(self):
        super().__init__()
        self.w = tf.Variable([[1.0, 0.0], [2.0, 1.0], [0.0, -1.0]])
        self.b = tf.Variable([0.5, 0.25])

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
    def affine(self, x):
        return {"y": x @ self.w + self.b, "total": tf.reduce_sum(x, axis=1)}

    @tf.function(
        input_signature=[
            tf.TensorSpec([None], tf.string, name="text"),
            tf.TensorSpec([None], tf.int32, name="times"),
        ]
    )
    def repeat(self, text, times):
        return {"length": tf.strings.length(text) * times}


def _affine(x):
    """The model's answer, written out: y = (x0 + 2 x1 + 0.5, x1 - x2 + 0.25)."""
    return [x[0] + 2 * x[1] + 0.5, x[1] - x[2] + 0.25]


class SavedModelHandlerTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = tempfile.mkdtemp()
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        cls.path = os.path.join(cls.root, "affine")
        module = Affine()
        tf.saved_model.save(
            module,
            cls.path,
            signatures={"serving_default": module.affine, "repeat": module.repeat},
        )
        cls.rows = [np.array([1.0, 2.0, 3.0]), np.array([-1.0, 0.5, 4.0]), np.zeros(3)]

    def test_one_result_per_element_with_its_own_outputs(self):
        handler = SavedModelHandler(self.path)
        results = handler.run_inference(self.rows, handler.load_model())
        self.assertLen(results, 3)
        for row, result in zip(self.rows, results, strict=True):
            self.assertIs(result.example, row)
            self.assertAllClose(result.inference["y"], _affine(row))
            self.assertAllClose(result.inference["total"], row.sum())
            self.assertEqual(result.model_id, self.path)

    def test_string_and_number_inputs_by_name(self):
        handler = SavedModelHandler(self.path, "repeat")
        batch = [{"text": "abc", "times": 2}, {"text": b"hello", "times": 3}]
        results = handler.run_inference(batch, handler.load_model())
        self.assertEqual([int(r.inference["length"]) for r in results], [6, 15])
        with self.assertRaisesRegex(ValueError, "takes text, times: give each element as a dict"):
            handler.run_inference(["abc"], handler.load_model())

    def test_unknown_signature_names_those_there(self):
        with self.assertRaisesRegex(
            ValueError, "no signature 'other'; it has repeat, serving_default"
        ):
            SavedModelHandler(self.path, "other").load_model()

    def test_batching_and_sharing_reach_beam(self):
        handler = SavedModelHandler(self.path, min_batch_size=2, max_batch_size=5)
        self.assertEqual(
            handler.batch_elements_kwargs(), {"min_batch_size": 2, "max_batch_size": 5}
        )
        self.assertFalse(handler.share_model_across_processes())
        self.assertTrue(
            SavedModelHandler(self.path, large_model=True).share_model_across_processes()
        )
        shared = SavedModelHandler(self.path, model_copies=3)
        self.assertTrue(shared.share_model_across_processes())
        self.assertEqual(shared.model_copies(), 3)
        self.assertEqual(handler.get_num_bytes(self.rows), 3 * 3 * 8)

    def test_a_folder_elsewhere_is_copied_first_and_the_copy_removed(self):
        # As for gs:// or s3://: not a local folder, so read file by file through FileSystems.
        with mock.patch.object(beam_handler, "_is_local_folder", return_value=False):
            with beam_handler.local_copy(self.path) as copy:
                self.assertNotEqual(copy, self.path)
                for folder, _, names in os.walk(self.path):
                    for name in names:
                        original = os.path.join(folder, name)
                        with open(original, "rb") as a:
                            copied = os.path.join(copy, os.path.relpath(original, self.path))
                            with open(copied, "rb") as b:
                                self.assertEqual(a.read(), b.read(), name)
            self.assertFalse(os.path.exists(copy))
            with self.assertRaisesRegex(ValueError, "no SavedModel at .*nowhere"):
                with beam_handler.local_copy(os.path.join(self.root, "nowhere")):
                    pass

    def test_a_loaded_model_needs_no_file_and_leaves_none(self):
        temp = os.path.join(self.root, "tmp")
        os.makedirs(temp)
        with (
            mock.patch.object(beam_handler, "_is_local_folder", return_value=False),
            mock.patch.object(tempfile, "tempdir", temp),
        ):
            handler = SavedModelHandler(self.path)
            model = handler.load_model()
        self.assertEqual(os.listdir(temp), [])
        (result,) = handler.run_inference(self.rows[:1], model)
        self.assertAllClose(result.inference["y"], _affine(self.rows[0]))

    def test_a_key_with_dot_dot_is_refused_and_nothing_written(self):
        root = self.path.rstrip("/")
        listed = FileSystems.match([os.path.join(root, "**")])[0].metadata_list
        evil = FileMetadata(f"{root}/variables/../../evil.txt", 4)
        outside = os.path.join(os.path.dirname(self.root), "evil.txt")
        with (
            mock.patch.object(beam_handler, "_is_local_folder", return_value=False),
            mock.patch.object(
                FileSystems, "match", return_value=[MatchResult(root, [*listed, evil])]
            ),
        ):
            with self.assertRaisesRegex(ValueError, r"evil\.txt: its name leads outside"):
                with beam_handler.local_copy(self.path):
                    pass
        self.assertFalse(os.path.exists(outside))
        self.assertFalse(os.path.exists(os.path.join(self.root, "evil.txt")))

    def test_keyed_in_a_pipeline(self):
        keyed = [(f"row{i}", row) for i, row in enumerate(self.rows)]
        handler = KeyedModelHandler(SavedModelHandler(self.path, max_batch_size=2))
        want = [(key, round(float(sum(_affine(row))), 4)) for key, row in keyed]
        with beam.Pipeline(options=PipelineOptions(OPTIONS)) as pipeline:
            got = (
                pipeline
                | beam.Create(keyed)
                | RunInference(handler)
                | beam.MapTuple(lambda key, r: (key, round(float(r.inference["y"].sum()), 4)))
            )
            assert_that(got, equal_to(want))
