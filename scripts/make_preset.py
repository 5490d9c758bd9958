"""The command sat-make-preset (sat_tf/cli/make_preset.py); --help describes it."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sat_tf.cli.make_preset import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
