"""The command sat-export (sat_tf/cli/export.py); --help describes it."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sat_tf.cli.export import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
