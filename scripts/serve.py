"""`python scripts/serve.py` is the command sat-serve."""

from sat_tf.cli.serve import main

raise SystemExit(main())
