"""Tests for sat_tf.pipelines.launch: a Beam command's own flags apart from the pipeline
options, the local default filled in only where nothing was given, an unknown option
named with the closest, runners told apart by where their workers run, a local path
refused for a remote runner before anything starts, the local engine's worker processes
started with the options, the options a DoFn carries set in its worker, and the counters
of a runner that reports only attempted values."""

import json
import os
from unittest import mock

import apache_beam as beam
import tensorflow as tf
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.execution import MetricKey
from apache_beam.metrics.metric import MetricName, MetricResult
from apache_beam.options.pipeline_options import PipelineOptions, S3Options
from apache_beam.testing.util import assert_that, equal_to

from sat_tf.cli import caption_beam, extract_features_beam, flags_lib
from sat_tf.pipelines import launch

S3 = ["--s3_endpoint_url=http://127.0.0.1:9", "--s3_access_key_id=k", "--s3_region_name=r"]


class ArgumentsTest(tf.test.TestCase):
    def test_own_flags_and_pipeline_options_apart(self):
        argv = ["sat-caption-beam", "--export=e", "--input", "a*.jpg", "--runner", "DirectRunner"]
        argv += ["--direct_num_workers=2", "-v", "--batch_size", "4", "--save_main_session"]
        argv += ["--input=b.jpg", "--help"]
        own, pipeline = launch.split_args(argv, caption_beam.FLAGS, flags_lib.HELP_FLAGS)
        self.assertEqual(
            own,
            ["sat-caption-beam", "--export=e", "--input", "a*.jpg", "-v", "--batch_size", "4"]
            + ["--input=b.jpg", "--help"],
        )
        self.assertEqual(
            pipeline,
            ["--runner", "DirectRunner", "--direct_num_workers=2", "--save_main_session"],
        )
        argv = ["sat-extract-features-beam", "--shard_size", "4", "--runner", "DirectRunner"]
        argv += ["--noskip_bad_images", "--s3_region_name", "r", "--encoder=vgg19"]
        own, pipeline = launch.split_args(argv, extract_features_beam.FLAGS)
        self.assertEqual(
            own,
            ["sat-extract-features-beam", "--shard_size", "4", "--noskip_bad_images"]
            + ["--encoder=vgg19"],
        )
        self.assertEqual(pipeline, ["--runner", "DirectRunner", "--s3_region_name", "r"])

    def test_the_local_default_fills_in_what_was_not_given(self):
        options = launch.parse([], "p").get_all_options()
        self.assertEqual(options["runner"], None)
        self.assertEqual(launch.runner_name(launch.parse([], "p")), "FnApiRunner")
        self.assertEqual(options["direct_running_mode"], "multi_threading")
        self.assertEqual(options["direct_num_workers"], 2)
        mine = launch.parse(["--direct_running_mode", "multi_processing"], "p").get_all_options()
        self.assertEqual(mine["direct_running_mode"], "multi_processing")
        self.assertEqual(mine["direct_num_workers"], 2)
        mine = launch.parse(["--direct_num_workers=1"], "p").get_all_options()
        self.assertEqual(mine["direct_num_workers"], 1)
        given = launch.parse(["--runner=DirectRunner"], "p").get_all_options()
        self.assertEqual(given["runner"], "DirectRunner")
        self.assertEqual(given["direct_running_mode"], "in_memory")  # Beam's own default
        self.assertEqual(given["direct_num_workers"], 1)

    def test_an_unknown_option_is_named_with_the_closest(self):
        with self.assertRaisesRegex(
            ValueError,
            "^unknown flag --direct_num_worker=2: not a flag of sat-x nor a Beam pipeline "
            "option; did you mean --direct_num_workers\\?",
        ):
            launch.parse(["--s3_region_name=r", "--direct_num_worker=2"], "sat-x")
        with self.assertRaisesRegex(ValueError, "^unknown flag --zzzz: .* option \\(--helpfull"):
            launch.parse(["--zzzz", "3"], "sat-x")


class RunnersTest(tf.test.TestCase):
    def test_runner_names_as_beam_resolves_them(self):
        cases = {
            None: "FnApiRunner",
            "dataflow": "DataflowRunner",
            "Flink": "FlinkRunner",
            "apache_beam.runners.portability.spark_runner.SparkRunner": "SparkRunner",
            "my.own.Runner": "Runner",
        }
        for given, name in cases.items():
            args = [f"--runner={given}"] if given else []
            self.assertEqual(launch.runner_name(PipelineOptions(args)), name, given)

    def test_where_the_workers_run(self):
        local = [[], ["--runner=DirectRunner"], ["--runner=PrismRunner"]]
        local += [["--runner=PortableRunner", "--environment_type=LOOPBACK"]]
        local += [["--runner=FlinkRunner", "--environment_type=loopback"]]
        remote = [["--runner=DataflowRunner"], ["--runner=FlinkRunner"], ["--runner=SparkRunner"]]
        remote += [["--runner=PortableRunner"]]
        remote += [["--runner=PortableRunner", "--environment_type=EXTERNAL"]]
        for args in local:
            self.assertTrue(launch.workers_are_local(PipelineOptions(args)), args)
        for args in remote:
            self.assertFalse(launch.workers_are_local(PipelineOptions(args)), args)

    def test_a_local_path_is_refused_for_remote_workers_only(self):
        paths = [("export", "s3://b/export"), ("input", "photos/*.jpg"), ("output", "")]
        launch.check_paths(PipelineOptions([]), paths)
        with self.assertRaisesRegex(
            ValueError,
            "^--input=photos/\\*.jpg is a path on this machine, which the workers of "
            "DataflowRunner cannot read: give one on a filesystem they share \\(gs://, ",
        ):
            launch.check_paths(PipelineOptions(["--runner=DataflowRunner"]), paths)
        with self.assertRaisesRegex(ValueError, "^--output=file:///tmp/o is a path on this"):
            launch.check_paths(
                PipelineOptions(["--runner=SparkRunner"]), [("output", "file:///tmp/o")]
            )
        launch.check_paths(
            PipelineOptions(["--runner=FlinkRunner"]), [("input", "gs://b/*"), ("x", "hdfs://h/")]
        )

    def test_the_local_engine_is_built_with_the_options(self):
        options = PipelineOptions(["--direct_running_mode=multi_processing", *S3])
        runner = launch.runner(options)
        self.assertEqual(type(runner).__name__, "FnApiRunner")
        encoded = runner._provision_info.provision_info.pipeline_options
        self.assertEqual(encoded["beam:option:s3_endpoint_url:v1"], "http://127.0.0.1:9")
        self.assertEqual(encoded["beam:option:direct_running_mode:v1"], "multi_processing")
        self.assertIsNone(launch.runner(PipelineOptions(["--runner=DirectRunner"])))

    def test_worker_processes_start_with_the_options(self):
        options = PipelineOptions(
            ["--direct_running_mode=multi_processing", "--direct_num_workers=1", *S3]
        )

        def endpoint(_):
            given = json.loads(os.environ["PIPELINE_OPTIONS"])
            return given["beam:option:s3_endpoint_url:v1"], os.getpid()

        launcher = os.getpid()
        with beam.Pipeline(runner=launch.runner(options), options=options) as pipeline:
            found = pipeline | beam.Create([0]) | beam.Map(endpoint)
            elsewhere = found | beam.Map(lambda x, me=launcher: (x[0], x[1] != me))
            assert_that(elsewhere, equal_to([("http://127.0.0.1:9", True)]))


class WorkerOptionsTest(tf.test.TestCase):
    def test_carried_options_reach_the_workers_filesystems(self):
        carried = launch.worker_options(PipelineOptions(["--runner=DirectRunner", *S3]))
        self.assertEqual(
            carried,
            {
                "runner": "DirectRunner",
                "s3_endpoint_url": "http://127.0.0.1:9",
                "s3_access_key_id": "k",
                "s3_region_name": "r",
            },
        )
        self.addCleanup(FileSystems.set_options, None)
        FileSystems.set_options(None)
        launch.use_worker_options(carried)
        s3 = FileSystems.get_filesystem("s3://bucket/key")._options.view_as(S3Options)
        self.assertEqual((s3.s3_endpoint_url, s3.s3_region_name), ("http://127.0.0.1:9", "r"))
        launch.use_worker_options(None)  # nothing carried: left as it is
        s3 = FileSystems.get_filesystem("s3://bucket/key")._options.view_as(S3Options)
        self.assertEqual(s3.s3_endpoint_url, "http://127.0.0.1:9")


def _result(counters, state="DONE"):
    """A finished run's result as a runner gives it, with these `MetricResult`s."""
    result = mock.Mock()
    result.metrics.return_value.query.return_value = {"counters": counters}
    result.wait_until_finish.return_value = state
    return result


def _counter(name, committed, attempted):
    key = MetricKey("step", MetricName("ns", name))
    return MetricResult(key, committed, attempted)


class CountersTest(tf.test.TestCase):
    def test_attempted_values_where_nothing_is_committed(self):
        result = _result([_counter("refused", None, 3), _counter("captioned", 5, 6)])
        self.assertEqual(
            launch.counters(result, "ns", ("captioned", "refused", "missing")),
            {"captioned": 5, "refused": 3, "missing": 0},
        )
        split = [_counter("refused", None, 2), _counter("refused", 1, 1)]  # two steps
        self.assertEqual(launch.counters(_result(split), "ns", ("refused",)), {"refused": 3})

    def test_a_run_that_did_not_end_done_is_an_error(self):
        pipeline = mock.Mock()
        pipeline.run.return_value = _result([], "DONE")
        self.assertIs(launch.run(pipeline), pipeline.run.return_value)
        pipeline.run.return_value = _result([], "CANCELLED")
        with self.assertRaisesRegex(RuntimeError, "the pipeline ended CANCELLED"):
            launch.run(pipeline)


if __name__ == "__main__":
    tf.test.main()
