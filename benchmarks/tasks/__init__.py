"""The tasks the benchmarks train: each one's data (generated or bundled locally) and model, one module per task, and the suite's table of them."""
