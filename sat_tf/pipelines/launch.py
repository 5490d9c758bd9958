"""How a Beam pipeline of the package is launched: its options read from the command line,
filled in with the local default, passed on to every worker and checked against the
runner's reach; then run to the end and its counters read.

A Beam command (`sat-caption-beam`, `sat-extract-features-beam`) takes its own flags and
passes every other one to Beam (`split_args`). `parse` reads those with Beam's public
`PipelineOptions` and refuses a flag Beam does not know, naming the closest. Without
--runner the pipeline runs on this machine in `LOCAL_DEFAULT`, the fastest local setting
measured (BUILD_NOTES.md, "Beam"), filled in only where the user gave no value.

Options reach the workers two ways. The local batch engine (`FnApiRunner`, the default)
is built here with the options in its provisioning (`runner`), as Beam's DirectRunner
builds it, so that its worker processes (`--direct_running_mode=multi_processing`) start
with them; Beam builds every other runner from the options. And each DoFn of the
package's pipelines carries the options given (`worker_options`) and hands them to
`FileSystems` when it is set up (`use_worker_options`): a worker that a pool started
without them (Beam's `worker_pool_main`, an EXTERNAL environment) reads s3:// or gs://
with the user's settings too.

A runner whose workers are not this process (Dataflow, Flink, Spark, a portable runner
whose environment is not LOOPBACK) cannot read a path of this machine: `check_paths`
refuses one before any job server, jar or cloud API is touched.

The counts a command reports are Beam counters (`counters`): committed values where the
runner commits them, else the attempted ones.
"""

import difflib

from absl import flags

DEFAULT_RUNNER = "FnApiRunner"
# The local setting when no --runner is given: the DirectRunner's batch engine (without
# its attempt to fetch the Prism runner), two threads sharing one model (faster here than
# one thread or two processes, each of which loads the model: BUILD_NOTES.md, "Beam").
LOCAL_DEFAULT = {"direct_running_mode": "multi_threading", "direct_num_workers": 2}
# Where a path that remote workers read may be.
SHARED_FILESYSTEMS = "gs://, s3://, hdfs://"


def split_args(argv, flag_values, keep=()):
    """(the command's arguments, the Beam pipeline arguments) of a command line (program
    name first, flagfiles expanded): a flag `flag_values` or absl defines, or one of
    `keep` (such as the help flags), goes to the first list, with its value when that is
    the next argument; every other flag and its value to the second."""
    own, pipeline = [argv[0]], []
    args = list(argv[1:])
    while args:
        arg = args.pop(0)
        if arg == "--":
            own += [arg, *args]
            break
        name = arg.lstrip("-").split("=", 1)[0]
        known = flag_values if name in flag_values else flags.FLAGS
        flag = known[name] if name in known else None
        negated = (
            name.startswith("no") and name[2:] in flag_values and flag_values[name[2:]].boolean
        )
        if not arg.startswith("-") or flag is not None or negated or arg in keep:
            takes_next = flag is not None and not flag.boolean and "=" not in arg
            own += [arg, args.pop(0)] if takes_next and args else [arg]
            continue
        takes_next = "=" not in arg and args and not args[0].startswith("-")
        pipeline += [arg, args.pop(0)] if takes_next else [arg]
    return own, pipeline


def _given(args):
    return {a.split("=", 1)[0].lstrip("-") for a in args if a.startswith("--")}


def parse(args, program):
    """`PipelineOptions` of the pipeline arguments; without --runner, `LOCAL_DEFAULT`'s
    values for the options not given.

    Args:
      args: the pipeline arguments (`split_args`).
      program: the command, named in the error.

    Raises:
      ValueError: naming an argument that is no Beam pipeline option (with the closest).
    """
    from apache_beam.options.pipeline_options import PipelineOptions

    given = _given(args)
    if "runner" not in given:
        args = [f"--{k}={v}" for k, v in LOCAL_DEFAULT.items() if k not in given] + list(args)
    options = PipelineOptions(args)
    known = options.get_all_options()
    unknown = set(options.get_all_options(retain_unknown_options=True)) - set(known)
    for arg in args:
        name = arg.split("=", 1)[0]
        if arg.startswith("-") and name.lstrip("-") in unknown:
            close = difflib.get_close_matches(name, [f"--{k}" for k in known], 1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ValueError(
                f"unknown flag {arg}: not a flag of {program} nor a Beam pipeline "
                f"option{hint} (--helpfull lists this command's)"
            )
    return options


def runner_name(options) -> str:
    """The runner's class name (`DataflowRunner`, ...) as Beam resolves --runner: a
    known name in any case, with or without `Runner`, or a module path's last part."""
    from apache_beam.options.pipeline_options import StandardOptions

    name = (options.view_as(StandardOptions).runner or DEFAULT_RUNNER).rsplit(".", 1)[-1]
    for known in StandardOptions.KNOWN_RUNNER_NAMES:
        if name.lower() in (known.lower(), known.lower().removesuffix("runner")):
            return known
    return name


def workers_are_local(options) -> bool:
    """Whether the runner's workers run on this machine with its files: a local runner
    (Beam's `StandardOptions.LOCAL_RUNNERS`), or any runner whose environment is
    LOOPBACK (the workers are this process)."""
    from apache_beam.options.pipeline_options import PortableOptions, StandardOptions

    environment = (options.view_as(PortableOptions).environment_type or "").upper()
    return runner_name(options) in StandardOptions.LOCAL_RUNNERS or environment == "LOOPBACK"


def is_local(path: str) -> bool:
    """Whether `path` names a file of this machine (no scheme, or file://)."""
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.get_scheme(path) in (None, "file")


def check_paths(options, paths) -> None:
    """Refuses a local path for a runner whose workers are elsewhere.

    Args:
      options: the `PipelineOptions`.
      paths: (flag name, path) pairs; an empty path is left out.

    Raises:
      ValueError: naming the first local path, the runner and what to give instead.
    """
    if workers_are_local(options):
        return
    for flag, path in paths:
        if path and is_local(path):
            raise ValueError(
                f"--{flag}={path} is a path on this machine, which the workers of "
                f"{runner_name(options)} cannot read: give one on a filesystem they share "
                f"({SHARED_FILESYSTEMS})"
            )


def runner(options):
    """The runner to build the pipeline with: for `FnApiRunner` (the local default), one
    that starts its workers with `options`, as Beam's DirectRunner makes it; else None
    (Beam makes the runner --runner names)."""
    if runner_name(options) != DEFAULT_RUNNER:
        return None
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    info = beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)
    return fn_runner.FnApiRunner(provision_info=fn_runner.ExtendedProvisionInfo(info))


def worker_options(options) -> dict:
    """The options given (defaults left out), as a dict a DoFn carries to its workers."""
    return options.get_all_options(drop_default=True)


def use_worker_options(carried) -> None:
    """Sets `carried` (`worker_options`) as the options of this process's `FileSystems`
    (a DoFn's `setup`): the s3:// and gs:// settings reach a worker started without them.
    None leaves them as they are."""
    if carried is None:
        return
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    FileSystems.set_options(PipelineOptions.from_dictionary(carried))


def run(pipeline) -> object:
    """Runs `pipeline` to the end; returns its result.

    Raises:
      RuntimeError: when it did not finish DONE (Beam raises the workers' error itself).
    """
    from apache_beam.runners.runner import PipelineState

    result = pipeline.run()
    state = result.wait_until_finish()
    if state not in (None, PipelineState.DONE):
        raise RuntimeError(f"the pipeline ended {state}")
    return result


def counters(result, namespace, names) -> dict:
    """{name: value} of the counters `names` of `namespace` in a finished run: the
    committed value, or the attempted one on a runner that reports only that (0 for a
    counter never incremented)."""
    from apache_beam.metrics.metric import MetricsFilter

    found = dict.fromkeys(names, 0)
    query = result.metrics().query(MetricsFilter().with_namespace(namespace))
    for counter in query["counters"]:
        value = counter.committed if counter.committed is not None else counter.attempted
        found[counter.key.metric.name] += value or 0
    return found
