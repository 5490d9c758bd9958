"""Every console command that setup.py declares answers before TensorFlow loads: its
module imported and run with --help, --helpfull, an unknown flag, a bad value or a
missing input, in a fresh process, leaves no TensorFlow, Keras or tensorflow_text module
imported, and prints what a user reads (`sat_tf/cli/__init__.py`). Commands added to
setup.py later are held to it too."""

import json
import os
import subprocess
import sys

import pytest
from cli_test import declared_entry_points

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ("tensorflow", "keras", "tensorflow_text", "tf_keras")
UNKNOWN = "error: Unknown command line flag 'no_such_flag' (--helpfull lists the flags)"
BEAM_COMMANDS = ("sat-caption-beam", "sat-extract-features-beam")

# Runs one command's main on each argv of argv[2] (JSON) in this process, each with its
# stdout and stderr caught, and prints them with the heavy modules imported by the end.
PROBE = """\
import contextlib, importlib, io, json, sys
program = sys.argv[3]
sys.argv = [program]
module = importlib.import_module({module!r})
results = []
for args in json.loads({cases!r}):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = module.main([program, *args])
    results.append([code, out.getvalue(), err.getvalue()])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})
print("PROBE " + json.dumps([results, heavy]))
"""


def console_scripts():
    """{command: module} of setup.py's console_scripts (`cli_test.declared_entry_points`)."""
    return {name: target.split(":")[0] for name, target in declared_entry_points().items()}


def probe(module, program, cases):
    """[(exit status, stdout, stderr)] of `module.main` on each of `cases`, and the
    TensorFlow modules imported by the end, in a fresh process."""
    script = PROBE.format(module=module, cases=json.dumps(cases), heavy=HEAVY)
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": ""}
    done = subprocess.run(
        [sys.executable, "-c", script, "-", "-", program],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results, heavy = json.loads(done.stdout.split("PROBE ", 1)[1])
    return [tuple(r) for r in results], heavy


def test_setup_declares_the_commands():
    declared = console_scripts()
    assert "sat-train" in declared and "sat-caption" in declared
    assert all(module.startswith("sat_tf.cli.") for module in declared.values())


@pytest.mark.parametrize("program, module", sorted(console_scripts().items()))
def test_help_and_an_unknown_flag_load_no_tensorflow(program, module):
    cases = [["--help"], ["--helpfull"], ["--no_such_flag"], ["--verbose=maybe"]]
    (help_, full, unknown, bad), heavy = probe(module, program, cases)
    assert heavy == []
    with open(os.path.join(ROOT, *module.split(".")) + ".py", encoding="utf-8") as f:
        first_line = f.read().split('"""', 2)[1].splitlines()[0]
    for code, stdout, stderr in (help_, full):
        assert (code, stderr) == (0, "")
        assert stdout.startswith(first_line), stdout[:300]
        assert "--[no]verbose" in stdout
    assert "absl.flags:" in full[1]
    # The Beam commands hand flags they do not define to Beam, which knows no such one.
    beam = f"error: unknown flag --no_such_flag: not a flag of {program} nor a Beam "
    beam += "pipeline option (--helpfull lists this command's)"
    assert unknown == (1, "", (beam if program in BEAM_COMMANDS else UNKNOWN) + "\n")
    assert bad[0] == 1 and bad[2].startswith("error: flag --verbose=maybe: "), bad
    assert len(bad[2].splitlines()) == 1


def test_bad_settings_and_missing_inputs_load_no_tensorflow(tmp_path):
    missing = str(tmp_path / "missing.jpg")
    # command -> [(argv, exit status, the start of stderr)]
    runs = {
        "sat-train": [
            (
                ["--dataset=no_such_dataset"],
                1,
                "error: flag --dataset=no_such_dataset: value should be one of "
                "<shapes|flickr8k|flickr30k|coco|coco_captions_tfds|folder>\n",
            ),
            (["--batch_size=0"], 1, "error: --batch_size=0 must be at least 1\n"),
            (
                ["--dataset=coco", f"--data_dir={missing}"],
                1,
                f"error: --dataset=coco: --data_dir={missing} is not a folder\n",
            ),
        ],
        "sat-caption": [
            ([missing], 2, f"error: image {missing!r} does not exist\n"),
            (
                [missing, missing + "2"],
                2,
                f"error: image {missing!r} does not exist\nerror: image {missing + '2'!r} "
                "does not exist\n2/2\nerror: 2 of 2 inputs not captioned (named above)\n",
            ),
            (
                ["--preset=no_such_preset", missing],
                1,
                "error: unknown preset 'no_such_preset'; shipped presets: ",
            ),
        ],
        "sat-evaluate": [
            (
                [f"--workdir={missing}"],
                1,
                f"error: --workdir={missing} is not a sat_tf workdir: config.json is missing\n",
            ),
        ],
        # The export's length is Config's max_decode_length, under that name alone.
        "sat-export": [
            (
                ["--output=x", "--max_decode_length=0"],
                1,
                "error: --max_decode_length=0 must be at least 1 (leave it out for the model's "
                "own)\n",
            ),
            (["--output=x", "--max_length=5"], 1, UNKNOWN.replace("no_such_flag", "max_length")),
        ],
    }
    declared = console_scripts()
    for program, cases in runs.items():
        results, heavy = probe(declared[program], program, [args for args, *_ in cases])
        assert heavy == [], program
        for (code, stdout, stderr), (args, want_code, printed) in zip(results, cases, strict=True):
            assert (code, stdout) == (want_code, ""), (program, args, stderr)
            assert stderr.startswith(printed), (program, args, stderr)
            assert len(stderr.splitlines()) == len(printed.splitlines()), stderr
