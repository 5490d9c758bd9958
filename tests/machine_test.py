"""Tests for sat_tf.utils.machine: what a measurement records about the CPU."""

from sat_tf.utils import machine

# Two CPUs as Linux lists them; the second must not override the first.
CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
flags\t\t: fpu avx2 avx512f avx512_bf16

processor\t: 1
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Other
"""


def test_cpu_id_reads_vendor_family_and_model_of_the_first_cpu(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    assert machine.cpu_id(path) == {"vendor": "AuthenticAMD", "family": "26", "model": "2"}


def test_cpu_id_without_the_file_says_unknown(tmp_path):
    assert machine.cpu_id(tmp_path / "missing") == dict.fromkeys(
        ("vendor", "family", "model"), "unknown"
    )
