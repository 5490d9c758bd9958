"""`python scripts/extract_features_beam.py` is the command sat-extract-features-beam."""

from sat_tf.cli.extract_features_beam import main

raise SystemExit(main())
