"""Speed: a second schedule of the decoder's step, taken at one seam (`schedule.py`) and
checked against the reference loop by the tests."""
