"""`python scripts/evaluate.py` is the command sat-evaluate."""

from sat_tf.cli.evaluate import main

raise SystemExit(main())
