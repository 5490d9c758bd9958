"""`python scripts/caption_beam.py` is the command sat-caption-beam."""

from sat_tf.cli.caption_beam import main

raise SystemExit(main())
