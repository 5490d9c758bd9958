"""The command sat-off-world (sat_tf/cli/off_world.py); --help describes it."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sat_tf.cli.off_world import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
