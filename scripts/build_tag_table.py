"""`python scripts/build_tag_table.py` builds a preset's tag table (cli/build_tag_table.py)."""

from sat_tf.cli.build_tag_table import main

raise SystemExit(main())
