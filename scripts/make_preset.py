"""`python scripts/make_preset.py` is the command sat-make-preset."""

from sat_tf.cli.make_preset import main

raise SystemExit(main())
