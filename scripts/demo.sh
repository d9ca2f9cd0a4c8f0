#!/usr/bin/env bash
# The main job (README, Benchmarks): sets up .venv if needed, then runs the benchmark
# suite's default: MNIST-1D (generated locally), a small 1-D CNN, 3 seeds, eager CPU with
# 1 torch thread, the arms full@0.4 / full@0.6 / full@0.8 / full (the full-data frontier),
# uniform, sift-probabilistic, sift-fixed, infobatch (and any default arm a
# benchmarks/*_arms.py file registers). Prints the headline table first and writes
# benchmarks/results/runs.jsonl, summary.jsonl and accuracy_vs_time.png.
# Extra arguments go to the suite (see: .venv/bin/python benchmarks/suite.py --help).
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
exec .venv/bin/python benchmarks/suite.py "$@"
