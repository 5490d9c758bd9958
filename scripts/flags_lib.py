"""The scripts' flags, `sat_tf/cli/flags_lib.py`, importable as `flags_lib` from scripts/
(where a script's own folder is first on sys.path)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sat_tf.cli.flags_lib import *  # noqa: E402, F403
