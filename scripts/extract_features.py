"""`python scripts/extract_features.py` is the command sat-extract-features."""

from sat_tf.cli.extract_features import main

raise SystemExit(main())
