"""`python export/export.py` is the command sat-export."""

from sat_tf.cli.export import main

raise SystemExit(main())
