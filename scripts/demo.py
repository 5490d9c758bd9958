"""`python scripts/demo.py` is the command sat-demo."""

from sat_tf.cli.demo import main

raise SystemExit(main())
