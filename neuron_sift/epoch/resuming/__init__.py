"""The loader's checkpoint layout and versions, and resuming a run at another world size."""
