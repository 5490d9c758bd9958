"""`python scripts/caption.py` is the command sat-caption."""

from sat_tf.cli.caption import main

raise SystemExit(main())
