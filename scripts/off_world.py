"""`python scripts/off_world.py` is the command sat-off-world."""

from sat_tf.cli.off_world import main

raise SystemExit(main())
