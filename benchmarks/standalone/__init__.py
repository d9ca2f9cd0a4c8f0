"""The parts of the standalone measurements beside the suite (machinery.py, scale.py): what they time, print and draw."""
