"""The machine a measurement was made on: CPU, its vector units, cores and software
versions. Benchmarks and the scores stored with a preset record it."""

import datetime
import os
import platform

# The vector units TensorFlow's kernels use; the last three turn oneDNN on by default.
VECTOR_EXTENSIONS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")


def cpu_id(path="/proc/cpuinfo") -> dict:
    """{"vendor", "family", "model"} of the first CPU in /proc/cpuinfo (values as it
    writes them; "unknown" where it has none). Machines that print the same model name
    ("AMD EPYC") differ here."""
    fields = {"vendor_id": "vendor", "cpu family": "family", "model": "model"}
    found = dict.fromkeys(fields.values(), "unknown")
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in fields:
                    found[fields[key.strip()]] = value.strip()
                elif not line.strip():
                    break  # the end of the first CPU
    except OSError:
        pass
    return found


def cpu() -> tuple[str, set[str]]:
    """(model name, flags) of the first CPU in /proc/cpuinfo; ("unknown", set()) elsewhere."""
    model, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return model or platform.processor() or "unknown", flags


def describe() -> dict:
    """The CPU, its vector extensions, the cores, and the versions of Python, TensorFlow,
    Keras and NumPy, with the date (UTC)."""
    import keras
    import numpy as np
    import tensorflow as tf

    model, flags = cpu()
    return {
        "cpu": model,
        "cpu_id": cpu_id(),
        "vector_extensions": [f for f in VECTOR_EXTENSIONS if f in flags],
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "system": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
