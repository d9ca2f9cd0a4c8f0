#!/usr/bin/env bash
# The main job (README, Benchmarks): sets up .venv if needed, then runs the benchmark
# suite's default: MNIST-1D (generated locally), a small 1-D CNN, 3 seeds, eager CPU with
# 1 torch thread, the default arms (the plug-ins of benchmarks/arms/): full@0.4 / full@0.6 /
# full@0.8 / full (the full-data frontier), uniform, sift-probabilistic, sift-fixed,
# infobatch, epoch (the library's EpochSiftingDataloader), dynamic-random (a new random
# subset every epoch at epoch's cost) and seta (SeTa's sliding window over loss groups).
# Times on the CPU clock, the suite's default on the CPU (the README's table; a loaded
# machine stretches the wall-clock, not the CPU time): pass --clock wall for the
# wall-clock. Prints the headline table first (with each arm's mean accuracy difference
# to full over seeds and its 95% interval) and writes benchmarks/results/runs.jsonl,
# summary.jsonl and accuracy_vs_time.png.
# For the headline numbers pass 5 seeds: bash scripts/demo.sh --seeds 0,1,2,3,4
# (about 2.5 minutes per seed on an idle 2-core machine; docs/benchmarks.md, "Seeds").
# The long schedule: bash scripts/demo.sh --task mnist1d-long
# Extra arguments go to the suite (see: .venv/bin/python benchmarks/suite.py --help).
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
exec .venv/bin/python benchmarks/suite.py "$@"
