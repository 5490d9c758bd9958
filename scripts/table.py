"""`python scripts/table.py` is the command sat-table."""

from sat_tf.cli.table import main

raise SystemExit(main())
