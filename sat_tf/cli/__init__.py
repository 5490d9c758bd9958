"""The console commands: `sat-<name>` (setup.py) and `python scripts/<name>.py` both run
`sat_tf.cli.<name>.main` (`export/export.py` runs `sat_tf.cli.export`)."""
