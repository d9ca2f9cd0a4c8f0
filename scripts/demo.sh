#!/usr/bin/env bash
# The main job (README, Benchmarks): sets up .venv if needed, then runs the benchmark
# suite's default: MNIST-1D (generated locally), a small 1-D CNN, arms full / uniform /
# sift-probabilistic / sift-fixed, 3 seeds, eager CPU with 1 torch thread. Prints the
# table and writes benchmarks/results/runs.jsonl and benchmarks/results/accuracy_vs_time.png.
# Extra arguments go to the suite (see: .venv/bin/python benchmarks/suite.py --help).
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
exec .venv/bin/python benchmarks/suite.py "$@"
