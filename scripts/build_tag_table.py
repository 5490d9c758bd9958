"""The command sat-build-tag-table (sat_tf/cli/build_tag_table.py); --help describes it."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sat_tf.cli.build_tag_table import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
