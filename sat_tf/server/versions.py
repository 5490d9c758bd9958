"""Which versions of a model are there, and which of them should be served: TF Serving's
file-system storage path source and its version policies
(sources/storage_path/file_system_storage_path_source.cc).

A version is a folder under the model's base path named by ASCII digits (`3`, `0042`,
never `.3.tmp`, `3a` or `٣`) that holds `saved_model.pb` (`sat-export` renames a finished
export into place, so a folder without it is still being copied). Two folders of one
number (`3`, `03`): the last by name is the version, as in TF Serving. The policy
(`ServableVersionPolicy` of the model's config) picks the aspired versions: `latest`
{num_versions} (the default, 1), `all`, or `specific` {versions}. Folders are listed
through TensorFlow's file system layer, so gs:// and other remote base paths work.
"""

import logging
import os
import re

import tensorflow as tf

VERSION_FOLDER = re.compile(r"[0-9]+")
MAX_VERSION = 2**63 - 1  # the int64 of TF Serving's version numbers

_log = logging.getLogger(__name__)


def list_versions(base_path: str) -> dict[int, str]:
    """{version: folder} of the complete versions under `base_path`.

    Raises:
      tf.errors.OpError: when `base_path` cannot be listed (missing, no permission).
    """
    found = {}
    for name in sorted(n.rstrip("/") for n in tf.io.gfile.listdir(base_path)):
        if not VERSION_FOLDER.fullmatch(name) or int(name) > MAX_VERSION:
            continue
        folder = os.path.join(base_path, name)
        if not tf.io.gfile.exists(os.path.join(folder, "saved_model.pb")):
            continue
        version = int(name)
        if version in found:
            _log.warning(
                "version %d of %s is in %s and %s; %s is served",
                version,
                base_path,
                found[version],
                folder,
                folder,
            )
        found[version] = folder
    return found


def aspired_versions(policy, found: dict[int, str], model: str = "") -> dict[int, str]:
    """The versions of `found` that `policy` (a `ServableVersionPolicy`) serves."""
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return dict(found)
    if choice == "specific":
        wanted = set(policy.specific.versions)
        for version in sorted(wanted - set(found)):
            _log.warning("version %d of model %s is not in its base path", version, model)
        return {v: p for v, p in found.items() if v in wanted}
    count = max(policy.latest.num_versions, 1) if choice == "latest" else 1
    return {v: found[v] for v in sorted(found)[-count:]}
