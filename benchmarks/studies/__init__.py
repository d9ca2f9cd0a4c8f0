"""The parts of the studies beside the suite (machinery.py, scale.py): what they time, print and draw."""
