"""`python scripts/grounding.py` is the command sat-grounding."""

from sat_tf.cli.grounding import main

raise SystemExit(main())
