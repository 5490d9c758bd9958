"""`python scripts/train.py` is the command sat-train."""

from sat_tf.cli.train import main

raise SystemExit(main())
